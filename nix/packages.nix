# Everything the flake builds for one package set `pkgs`: the CLI, compiled once
# (`sandbox-unwrapped`), the package users install (`sandbox`: the CLI wrapped with the tools
# its backends use), the nono those backends drive, and the crate checks, which reuse the CLI's
# dependency build. flake.nix calls it with its pinned nixpkgs, overlays.default with the
# user's, so a NixOS or home-manager configuration never evaluates a second nixpkgs.
{ pkgs, crane, rust-overlay, src, version }:
let
  inherit (pkgs) lib;

  # A fixed toolchain rather than nixpkgs' rustc: new clippy lints arrive with new Rust
  # releases, and `clippy -D warnings` must not start failing when nixpkgs moves. 1.95.0 is
  # what CI's rustup installs too. A function, so crane can splice it for cross builds.
  toolchainFor = p: (rust-overlay.lib.mkRustBin { } p).stable."1.95.0".default;
  toolchain = toolchainFor pkgs;
  craneLib = (crane.mkLib pkgs).overrideToolchain toolchainFor;

  # nono 0.81.0 needs Rust 1.95 (its Cargo.toml's rust-version); nixpkgs' rustc may be older,
  # so it is built with the same pinned toolchain as the CLI.
  nono = pkgs.callPackage ./nono.nix { inherit toolchain; };

  # Shared by every crane derivation.
  commonArgs = {
    pname = "sandbox";
    inherit version src;
    strictDeps = true;
    buildInputs = lib.optionals pkgs.stdenv.hostPlatform.isDarwin [ pkgs.libiconv ];
  };

  # The shipped build: the `dist` profile (fat LTO, Cargo.toml). Changing anything here
  # rebuilds the package's dependencies.
  packageArgs = commonArgs // { CARGO_PROFILE = "dist"; };

  # The checks build what `.ci/run` builds: cargo's `dev` profile, with debug assertions and
  # overflow checks (crane's default would be `release`). Their own dependency build, shared
  # by clippy and nextest; `dist`'s fat LTO would test other code, slower.
  checkArgs = commonArgs // { CARGO_PROFILE = "dev"; };

  # Workspace dependencies, built once per profile: one for the package (and the BoxLite
  # variant's own, below), one shared by the checks.
  cargoArtifacts = craneLib.buildDepsOnly packageArgs;
  checkArtifacts = craneLib.buildDepsOnly checkArgs;

  # The CLI with no tool paths: what it compiles does not depend on any tool, so a tool
  # bump never recompiles it. `args` are the dependency build's (`cargoArtifacts`) plus what
  # differs for a variant.
  cli = args: craneLib.buildPackage (args // {
    # The workspace's tests run once, in checks.nextest.
    doCheck = false;
    nativeBuildInputs = (args.nativeBuildInputs or [ ]) ++ [ pkgs.installShellFiles ];
    postInstall = lib.optionalString (pkgs.stdenv.buildPlatform.canExecute pkgs.stdenv.hostPlatform) ''
      installShellCompletion --cmd sandbox \
        --bash <("$out/bin/sandbox" completions bash) \
        --zsh <("$out/bin/sandbox" completions zsh) \
        --fish <("$out/bin/sandbox" completions fish)
      "$out/bin/sandbox" man > sandbox.1
      installManPage sandbox.1
    '';
    meta = meta // { description = "${meta.description} (without tool paths)"; };
  });

  sandbox-unwrapped = cli (packageArgs // {
    inherit cargoArtifacts;
    pname = "sandbox-unwrapped";
    cargoExtraArgs = "--locked --package sandbox-cli";
  });

  meta = {
    description = "Run AI coding agents' commands inside an isolation boundary";
    license = lib.licenses.asl20;
    mainProgram = "sandbox";
    platforms = lib.platforms.linux ++ lib.platforms.darwin;
  };

  # The tools the default package bakes in, by the variable the CLI reads them from
  # (crates/sandbox-cli/src/tools.rs): nono only, so `nix run .#sandbox` stays small. Lima's
  # limactl (nixpkgs has `lima` on every system, and it pulls in QEMU) is baked in by the
  # Lima variants only (`limaTools`, below; the default package finds a limactl on PATH),
  # BoxLite's runtime and image by `sandbox-boxlite` only.
  toolPaths = {
    SANDBOX_PACKAGE_NONO = lib.getExe' nono "nono";
  };

  # The Lima variants' tools: limactl, and the NixOS guest image when one is given (the
  # flake's `sandbox-with-lima-image`; without it the Lima backend boots Ubuntu 24.04).
  limaTools = limaImage: toolPaths // {
    SANDBOX_PACKAGE_LIMACTL = lib.getExe' pkgs.lima "limactl";
  } // lib.optionalAttrs (limaImage != null) {
    SANDBOX_PACKAGE_LIMA_IMAGE = "${limaImage}";
  };

  # `sandbox-lima` (limaImage = null) and `sandbox-with-lima-image`: the same CLI, re-wrapped.
  lima = { name, limaImage ? null }: wrap {
    name = "${name}-${version}";
    unwrapped = sandbox-unwrapped;
    tools = limaTools limaImage;
  };

  # `--set-default`: a value already in the environment wins, so a package that wraps this
  # one can still choose its own tools. The user's override is SANDBOX_NONO, which the CLI
  # reads before these (docs/nix.md, "Tool paths").
  wrap = { name, unwrapped, tools, passthru ? { } }: pkgs.symlinkJoin {
    inherit name;
    paths = [ unwrapped ];
    nativeBuildInputs = [ pkgs.makeBinaryWrapper ];
    postBuild = ''
      rm "$out/bin/sandbox"
      makeBinaryWrapper ${lib.getExe unwrapped} "$out/bin/sandbox" \
        ${lib.concatStringsSep " \\\n    " (lib.mapAttrsToList (var: path: "--set-default ${var} ${path}") tools)}
    '';
    passthru = { toolPaths = tools; inherit nono toolchain; sandbox-unwrapped = unwrapped; } // passthru;
    inherit meta;
  };

  sandbox = wrap {
    name = "sandbox-${version}";
    unwrapped = sandbox-unwrapped;
    tools = toolPaths;
  };

  # The BoxLite backend: the CLI built with the `boxlite` feature (the crate is pinned
  # `=0.10.8`), wrapped with the runtime files of the matching PyPI wheel and the flake's box
  # image. Only the x86_64 Linux wheel is pinned, so only that system has it.
  #
  # The crate's build script would download its runtime from GitHub; BOXLITE_DEPS_STUB=1 skips
  # that (the runtime is found at run time through SANDBOX_BOXLITE_RUNTIME), and its protocol
  # buffers need protoc. A dependency build of its own: the default package's must not carry
  # BoxLite's build settings, nor rebuild when they change.
  boxlite = lib.optionalAttrs (pkgs.stdenv.hostPlatform.system == "x86_64-linux") (
    let
      boxlite-runtime = pkgs.callPackage ./boxlite-runtime.nix { };
      box-image = import ../vm-images/box-image.nix { inherit pkgs; };
      args = packageArgs // {
        pname = "sandbox-boxlite";
        cargoExtraArgs = "--locked --package sandbox-cli --features boxlite";
        nativeBuildInputs = [ pkgs.protobuf ];
        PROTOC = lib.getExe' pkgs.protobuf "protoc";
        BOXLITE_DEPS_STUB = "1";
        # boxlite-runtime.nix gives these three Nix's loader with patchelf after checking
        # their pins; baked in so that the pin check (doctor, the engine) accepts them.
        SANDBOX_BOXLITE_RUNTIME_PATCHED = "bwrap debugfs mke2fs";
      };
      unwrapped = cli (args // {
        cargoArtifacts = craneLib.buildDepsOnly args;
        pname = "sandbox-boxlite-unwrapped";
      });
    in
    {
      inherit boxlite-runtime;
      sandbox-boxlite = wrap {
        name = "sandbox-boxlite-${version}";
        inherit unwrapped;
        tools = toolPaths // {
          SANDBOX_BOXLITE_RUNTIME = "${boxlite-runtime}";
          SANDBOX_PACKAGE_BOX_IMAGE = "${box-image}";
        };
        passthru = { inherit boxlite-runtime box-image; };
      };
    }
  );

  crateChecks = {
    clippy = craneLib.cargoClippy (checkArgs // {
      cargoArtifacts = checkArtifacts;
      cargoClippyExtraArgs = "--all-targets -- --deny warnings";
    });

    fmt = craneLib.cargoFmt { inherit (commonArgs) pname version src; };

    nextest = craneLib.cargoNextest (checkArgs // toolPaths // {
      cargoArtifacts = checkArtifacts;
      # Tests build real repositories and run the packaged nono.
      nativeBuildInputs = [ pkgs.git ];
      cargoNextestExtraArgs = "--no-tests=pass";
    });
  };
in
{
  inherit sandbox sandbox-unwrapped nono lima craneLib crateChecks toolchainFor boxlite;
}
