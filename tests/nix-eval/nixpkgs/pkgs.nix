# STAND-IN for the packages and builders the flake, its modules and its tests use, following
# nixpkgs at the pinned revision e2587caef70cea85dd97d7daab492899902dbf5d (flake.lock). Each
# package is a derivation that refuses to build and lists the binaries the real one installs
# (`standInBinaries`, checked by the stand-in lib.getExe'). The builders keep their arguments
# as the derivation's environment, so instantiating an output checks that every string it
# interpolates evaluates.
#
# Arguments: where the real builder's argument list is closed (writeShellApplication,
# dockerTools.streamLayeredImage) an unknown argument fails, as it does upstream. Where the
# real one hands unknown arguments on to mkDerivation (runCommand, symlinkJoin, fetchurl,
# rustPlatform.buildRustPackage), they are passed on here too and recorded in
# `standInUnknownArgs`, which `cargo xtask nix-check` reports as a LINT (stricter than
# nixpkgs; tests/nix-eval/lints.nix).
#
# Packages: every package the flake tests for (`pkgs ? X`) or uses is here if the pinned
# nixpkgs has it, on the systems it has it on (`lima`: every system), so a branch on a
# package's presence takes the branch it takes upstream. An attribute missing here is one
# nixpkgs lacks too, or one to add after checking the pinned nixpkgs has it by that name.
{ lib, system }:
let
  inherit (builtins) attrNames removeAttrs;

  isLinux = builtins.match ".*-linux" system != null;

  # Like mkDerivation, lazily: the arguments become the environment, while listing an output
  # reads only its name.
  standIn = name: env:
    let
      drv = derivation (removeAttrs env [ "passthru" "meta" "standInUnknownArgs" ] // {
        inherit name system;
        builder = "/bin/sh";
        args = [ "-c" "echo 'stand-in derivation ${name} from tests/nix-eval: it cannot be built' >&2; exit 1" ];
      });
      bins = if env ? meta.mainProgram then [ env.meta.mainProgram ] else [ ];
    in
    drv // (env.passthru or { }) // {
      passthru = env.passthru or { };
      meta = env.meta or { };
      standInBinaries = env.standInBinaries or bins;
      standInUnknownArgs = env.standInUnknownArgs or [ ];
    };

  package = name: binaries: standIn "${name}-stand-in" {
    meta = lib.optionalAttrs (binaries != [ ]) { mainProgram = builtins.head binaries; };
    standInBinaries = binaries;
  };

  # Lower-case arguments outside `allowed` (names in capitals are environment variables).
  unknownOf = allowed: args:
    lib.filter (n: !(builtins.elem n allowed) && builtins.match "[A-Z][A-Z0-9_]*" n == null) (attrNames args);

  # A builder whose real argument list is closed: an unknown argument fails, as upstream.
  strict = what: allowed: args:
    let unknown = unknownOf allowed args; in
    if unknown == [ ] then args
    else throw "${what}: unknown argument(s) ${lib.concatStringsSep ", " unknown} (stand-in knows: ${lib.concatStringsSep ", " allowed})";

  # A builder whose real one passes unknown arguments on to mkDerivation: passed on, and
  # recorded for the lint.
  passOn = what: allowed: args: args // {
    standInUnknownArgs = map (n: "${what}: ${n} is not an argument it takes (nixpkgs passes it to mkDerivation as an environment variable)") (unknownOf allowed args);
  };

  # The stdenv.mkDerivation attributes our expressions pass.
  mkDerivationArgs = [
    "name"
    "pname"
    "version"
    "src"
    "strictDeps"
    "nativeBuildInputs"
    "buildInputs"
    "doCheck"
    "postInstall"
    "postBuild"
    "passthru"
    "meta"
    "env"
    "passAsFile"
    "preferLocalBuild"
    "buildCommand"
    "expected"
    "installPhase"
    "buildPhase"
  ];

  python3 = package "python3" [ "python3" "python" ] // {
    interpreter = "${package "python3" [ "python3" ]}/bin/python3";
    # An environment with the packages `f` picks from python3Packages (by name here).
    withPackages = f: package "python3-${lib.concatMapStringsSep "-" (p: p.pname) (f python3Packages)}-env" [ "python3" "python" ];
  };

  # The python3Packages our expressions use.
  python3Packages = { pyyaml = { pname = "pyyaml"; }; };

  glibc = package "glibc" [ "ldd" ];

  # nixpkgs' own Rust (pkgs.rustc, pkgs.cargo).
  rustc = package "rustc" [ "rustc" ];
  cargo = package "cargo" [ "cargo" ];

  makeRustPlatform = { cargo, rustc }: {
    buildRustPackage = args: standIn "${args.pname}-${args.version}" (removeAttrs
      (passOn "rustPlatform.buildRustPackage"
        ([ "cargoLock" "cargoHash" "buildNoDefaultFeatures" "buildFeatures" "cargoBuildFlags" "checkFlags" ] ++ mkDerivationArgs)
        args) [ "cargoLock" ] // {
      cargoLockFile = builtins.readFile args.cargoLock.lockFile;
      nativeBuildInputs = (args.nativeBuildInputs or [ ]) ++ [ cargo rustc ];
    });
  };

  pkgs = {
    inherit lib python3 glibc rustc cargo;
    stdenv = {
      hostPlatform = {
        inherit system isLinux;
        isDarwin = !isLinux;
        isx86_64 = builtins.match "x86_64-.*" system != null;
        isAarch64 = builtins.match "aarch64-.*" system != null;
      };
      buildPlatform.canExecute = platform: platform.system == system;
      # The loader patchelf points foreign binaries at (nixpkgs: the bintools wrapper's).
      cc.bintools.dynamicLinker = "${glibc}/lib/" + (if builtins.match "x86_64-.*" system != null then "ld-linux-x86-64.so.2" else "ld-linux-aarch64.so.1");
    };

    callPackage = fn: overrides:
      let f = if builtins.isFunction fn then fn else import fn; in
      f (builtins.intersectAttrs (builtins.functionArgs f) pkgs // overrides);

    # Packages, with the binaries each real one installs in bin/.
    bashInteractive = package "bash-interactive" [ "bash" "sh" ];
    cacert = package "cacert" [ ];
    cargo-nextest = package "cargo-nextest" [ "cargo-nextest" ];
    coreutils = package "coreutils" [ "env" "cat" "ls" ];
    curl = package "curl" [ "curl" ];
    deadnix = package "deadnix" [ "deadnix" ];
    file = package "file" [ "file" ];
    gawk = package "gawk" [ "awk" "gawk" ];
    git = package "git" [ "git" ];
    gitMinimal = package "git-minimal" [ "git" ];
    gnugrep = package "gnugrep" [ "grep" ];
    installShellFiles = package "install-shell-files" [ ];
    jq = package "jq" [ "jq" ];
    libcap = package "libcap" [ "capsh" "getcap" "setcap" ];
    libiconv = package "libiconv" [ ];
    # pkgs/by-name/li/lima: Linux and Darwin.
    lima = package "lima" [ "limactl" "lima" ];
    makeBinaryWrapper = package "make-binary-wrapper-hook" [ ];
    nixpkgs-fmt = package "nixpkgs-fmt" [ "nixpkgs-fmt" ];
    patchelf = package "patchelf" [ "patchelf" ];
    protobuf = package "protobuf" [ "protoc" ];
    rust-analyzer = package "rust-analyzer" [ "rust-analyzer" ];
    shadow = package "shadow" [ "useradd" "usermod" "groupadd" ];
    shellcheck = package "shellcheck" [ "shellcheck" ];
    skopeo = package "skopeo" [ "skopeo" ];
    unzip = package "unzip" [ "unzip" "zipinfo" ];
    util-linux = package "util-linux" [ "mount" "findmnt" ];
    xorriso = package "xorriso" [ "xorriso" "xorrisofs" "osirrox" ];
    yq-go = package "yq-go" [ "yq" ];

    fetchurl = args: standIn args.name (passOn "fetchurl" [ "name" "url" "hash" ] args);

    runCommand = name: env: buildCommand: standIn name (passOn "runCommand ${name}" mkDerivationArgs env // { inherit buildCommand; });

    symlinkJoin = args: standIn args.name (passOn "symlinkJoin" ([ "paths" ] ++ mkDerivationArgs) args // {
      paths = map toString args.paths;
    });

    writeShellApplication = args: standIn args.name (strict "writeShellApplication"
      [ "name" "text" "runtimeInputs" "meta" "passthru" "checkPhase" "excludeShellChecks" "bashOptions" ]
      args // { meta.mainProgram = args.name; });

    mkShell = args: standIn (args.name or "nix-shell") (removeAttrs args [ "inputsFrom" ] // {
      inputDerivations = args.inputsFrom or [ ];
    });

    rustPlatform = makeRustPlatform { inherit cargo rustc; };

    # pkgs/development/compilers/rust/make-rust-platform.nix: a rustPlatform whose
    # buildRustPackage builds with the given cargo and rustc (in nativeBuildInputs).
    inherit makeRustPlatform;

    dockerTools = {
      binSh = package "bin-sh" [ "sh" ];
      usrBinEnv = package "usr-bin-env" [ ];
      streamLayeredImage = args: standIn "stream-${args.name}" (removeAttrs
        (strict "dockerTools.streamLayeredImage" [ "name" "tag" "contents" "extraCommands" "config" "fakeRootCommands" "maxLayers" ] args)
        [ "config" ] // {
        configJSON = builtins.toJSON (args.config or { });
      });
    };

    formats.yaml = _: {
      type = lib.types.attrsOf lib.types.anything;
      # JSON is YAML; the module checks read the file back with fromJSON.
      generate = name: value: builtins.toFile name (builtins.toJSON value);
    };

    # Not in nixpkgs: the stand-in derivation itself, for the other stand-ins (crane).
    standInDerivation = standIn;

    testers.runNixOSTest = import ./nixos-test.nix { inherit lib pkgs standIn; };
  };
in
pkgs
