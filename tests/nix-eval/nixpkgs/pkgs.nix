# STAND-IN for the packages and builders the flake's outputs use (see flake.nix beside this
# file). Each package is a derivation that refuses to build; the builders keep the arguments
# that become the derivation's environment, so instantiating an output checks that every
# string it interpolates evaluates.
{ lib, system }:
let
  inherit (builtins) attrNames removeAttrs;

  isLinux = builtins.match ".*-linux" system != null;

  # Like mkDerivation, lazily: the arguments become the environment (so instantiating checks
  # that they evaluate and coerce to strings), while listing an output reads only its name.
  standIn = name: env:
    let
      drv = derivation (removeAttrs env [ "passthru" "meta" ] // {
        inherit name system;
        builder = "/bin/sh";
        args = [ "-c" "echo 'stand-in derivation ${name} from tests/nix-eval: it cannot be built' >&2; exit 1" ];
      });
    in
    drv // (env.passthru or { }) // {
      passthru = env.passthru or { };
      meta = env.meta or { };
    };

  package = name: mainProgram: standIn "${name}-stand-in" { meta = { inherit mainProgram; }; };

  # The type nixpkgs' formats.json/yaml give settings, built from whichever lib is in use.
  jsonValue = with lib.types;
    let
      valueType = nullOr (oneOf [ bool int float str path (attrsOf valueType) (listOf valueType) ]) // {
        description = "YAML value";
      };
    in
    valueType;
in
{
  inherit lib;
  stdenv = {
    hostPlatform = {
      inherit system isLinux;
      isDarwin = !isLinux;
      isx86_64 = builtins.match "x86_64-.*" system != null;
      isAarch64 = builtins.match "aarch64-.*" system != null;
    };
    buildPlatform.canExecute = platform: platform.system == system;
  };

  protobuf = package "protobuf" "protoc";
  libiconv = package "libiconv" null;
  lima = package "lima" "limactl";
  nono = package "nono" "nono";
  e2fsprogs = package "e2fsprogs" "mke2fs";
  installShellFiles = package "install-shell-files" null;
  git = package "git" "git";
  gitMinimal = package "git-minimal" "git";
  cargo-nextest = package "cargo-nextest" "cargo-nextest";
  rust-analyzer = package "rust-analyzer" "rust-analyzer";
  deadnix = package "deadnix" "deadnix";
  nixpkgs-fmt = package "nixpkgs-fmt" "nixpkgs-fmt";
  shellcheck = package "shellcheck" "shellcheck";
  skopeo = package "skopeo" "skopeo";
  bashInteractive = package "bash-interactive" "bash";
  coreutils = package "coreutils" null;
  cacert = package "cacert" null;
  yq-go = package "yq-go" "yq";
  jq = package "jq" "jq";
  python3 = package "python3" "python3" // { interpreter = "${package "python3" "python3"}/bin/python3"; };

  runCommand = name: env: buildCommand: standIn name (env // { inherit buildCommand; });

  mkShell = args: standIn (args.name or "nix-shell") (removeAttrs args [ "inputsFrom" ] // {
    inputDerivations = args.inputsFrom or [ ];
  });

  dockerTools = {
    binSh = package "bin-sh" "sh";
    usrBinEnv = package "usr-bin-env" "env";
    streamLayeredImage = args: standIn "stream-${args.name}" (removeAttrs args [ "config" ] // {
      configJSON = builtins.toJSON (args.config or { });
    });
  };

  formats.yaml = _: {
    type = jsonValue;
    # JSON is YAML, and the shallow module check reads the file back with fromJSON.
    generate = name: value: builtins.toFile name (builtins.toJSON value);
  };

  testers.runNixOSTest = { name, nodes, testScript, ... }: standIn "vm-test-run-${name}" {
    inherit testScript;
    nodeNames = attrNames nodes;
  };
}
