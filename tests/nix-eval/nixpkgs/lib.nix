# STAND-IN for the parts of nixpkgs' `lib` that evaluating the flake's outputs touches (see
# flake.nix beside this file). The module-system functions here only record what a module
# declares, for the shallow module check in ../modules.nix; they merge nothing.
let
  inherit (builtins) any isList listToAttrs map pathExists substring stringLength toString;

  hasPrefix = prefix: s: substring 0 (stringLength prefix) s == prefix;

  type = name: { inherit name; description = name; };

  lib = {
    genAttrs = names: f: listToAttrs (map (name: { inherit name; value = f name; }) names);
    inherit (builtins) mapAttrs;
    optional = cond: x: if cond then [ x ] else [ ];
    optionals = cond: xs: if cond then xs else [ ];
    optionalAttrs = cond: attrs: if cond then attrs else { };
    optionalString = cond: s: if cond then s else "";

    getExe' = drv: name: "${drv}/bin/${name}";
    getExe = drv: "${drv}/bin/${drv.meta.mainProgram}";

    licenses.asl20 = { spdxId = "Apache-2.0"; };
    platforms = {
      linux = [ "x86_64-linux" "aarch64-linux" ];
      darwin = [ "x86_64-darwin" "aarch64-darwin" ];
    };

    # A file set is a list of absolute path strings here; like the real one, naming a path
    # that does not exist is an error.
    fileset = {
      unions = paths: map
        (p:
          if pathExists p then toString p
          else throw "stand-in lib.fileset.unions: ${toString p} does not exist")
        paths;
      toSource = { root, fileset }:
        let
          members = if isList fileset then fileset else [ (toString fileset) ];
          keep = path: any (m: path == m || hasPrefix (m + "/") path || hasPrefix (path + "/") m) members;
        in
        builtins.path {
          name = "source";
          path = root;
          filter = path: _type: keep path;
        };
    };

    # nixpkgs' flake adds nixosSystem to its lib. The stand-in evaluates no NixOS modules: it
    # returns the one attribute the flake reads, a stand-in disk image.
    nixosSystem = { modules, ... }:
      let
        system = (builtins.head (builtins.filter (m: m ? nixpkgs) modules)).nixpkgs.hostPlatform;
        image = derivation {
          name = "nixos-image-stand-in";
          inherit system;
          builder = "/bin/sh";
          args = [ "-c" "echo 'stand-in NixOS image from tests/nix-eval: it cannot be built' >&2; exit 1" ];
        };
      in
      {
        config.system.build.images.qemu-efi = image // { passthru.filePath = "nixos-image-stand-in.qcow2"; };
      };

    mkOption = attrs: attrs // { _type = "option"; };
    mkEnableOption = name: {
      _type = "option";
      type = lib.types.bool;
      default = false;
      description = "Whether to enable ${name}.";
    };
    mkIf = condition: content: { _type = "if"; inherit condition content; };
    literalExpression = text: { _type = "literalExpression"; inherit text; };

    types = {
      bool = type "bool";
      int = type "int";
      float = type "float";
      str = type "str";
      path = type "path";
      package = type "package";
      nullOr = t: type "nullOr ${t.name}";
      listOf = t: type "listOf ${t.name}";
      attrsOf = t: type "attrsOf ${t.name}";
      oneOf = ts: type "oneOf ${toString (map (t: t.name) ts)}";
    };
  };
in
lib
