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
  craneLib = (crane.mkLib pkgs).overrideToolchain toolchainFor;

  nono = pkgs.callPackage ./nono.nix { };

  # Shared by the dependency build and every derivation that reuses it: changing anything
  # here rebuilds all dependencies.
  commonArgs = {
    pname = "sandbox";
    inherit version src;
    strictDeps = true;
    buildInputs = lib.optionals pkgs.stdenv.hostPlatform.isDarwin [ pkgs.libiconv ];
    # The shipped build: fat LTO (Cargo.toml); `release` is the quick local profile.
    CARGO_PROFILE = "dist";
  };

  # Workspace dependencies, built once and shared by the package and the checks.
  cargoArtifacts = craneLib.buildDepsOnly commonArgs;

  # The CLI with no tool paths: what it compiles does not depend on any tool, so a tool
  # bump never recompiles it.
  sandbox-unwrapped = craneLib.buildPackage (commonArgs // {
    inherit cargoArtifacts;
    pname = "sandbox-unwrapped";
    cargoExtraArgs = "--locked --package sandbox-cli";
    # The workspace's tests run once, in checks.nextest.
    doCheck = false;
    nativeBuildInputs = [ pkgs.installShellFiles ];
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

  meta = {
    description = "Run AI coding agents' commands inside an isolation boundary";
    license = lib.licenses.asl20;
    mainProgram = "sandbox";
    platforms = lib.platforms.linux ++ lib.platforms.darwin;
  };

  # The tools some backend uses, by the variable the CLI reads them from
  # (crates/sandbox-cli/src/tools.rs): nono, and Lima's limactl. The NixOS guest image is set
  # only by the flake's `sandbox-with-lima-image` variant (else every build of the CLI would
  # build a disk image; the Lima backend then boots Ubuntu 24.04). BoxLite brings mke2fs when
  # it lands.
  toolPaths = {
    SANDBOX_PACKAGE_NONO = lib.getExe' nono "nono";
  } // lib.optionalAttrs (pkgs ? lima) {
    SANDBOX_PACKAGE_LIMACTL = lib.getExe' pkgs.lima "limactl";
  };

  # `--set-default`: a value already in the environment wins, so a package that wraps this
  # one can still choose its own tools. The user's override is SANDBOX_NONO, which the CLI
  # reads before these (docs/nix.md, "Tool paths").
  sandbox = pkgs.symlinkJoin {
    name = "sandbox-${version}";
    paths = [ sandbox-unwrapped ];
    nativeBuildInputs = [ pkgs.makeBinaryWrapper ];
    postBuild = ''
      rm "$out/bin/sandbox"
      makeBinaryWrapper ${lib.getExe sandbox-unwrapped} "$out/bin/sandbox" \
        ${lib.concatStringsSep " \\\n    " (lib.mapAttrsToList (name: path: "--set-default ${name} ${path}") toolPaths)}
    '';
    passthru = { inherit sandbox-unwrapped toolPaths nono; };
    inherit meta;
  };

  crateChecks = {
    clippy = craneLib.cargoClippy (commonArgs // {
      inherit cargoArtifacts;
      cargoClippyExtraArgs = "--all-targets -- --deny warnings";
    });

    fmt = craneLib.cargoFmt { inherit (commonArgs) pname version src; };

    nextest = craneLib.cargoNextest (commonArgs // toolPaths // {
      inherit cargoArtifacts;
      # Tests build real repositories (DESIGN §7) and run the packaged nono.
      nativeBuildInputs = [ pkgs.git ];
      cargoNextestExtraArgs = "--no-tests=pass";
    });
  };
in
{
  inherit sandbox sandbox-unwrapped nono craneLib crateChecks toolchainFor;
}
