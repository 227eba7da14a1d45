# Evaluates nixos-modules/ for `cargo xtask nix-check`, with either
#   - the stand-in lib (deep = false): each module function is called directly with a given
#     `config`, and the options it declares and the config it returns are inspected; nothing is
#     merged or type-checked; or
#   - a real nixpkgs lib (deep = true): `lib.evalModules` with the real module system, with the
#     few options of NixOS and home-manager that the modules set declared here.
# Returns { <check> = true | "<why it failed>"; }.
{ lib, deep }:
let
  system = "x86_64-linux";
  pkgs = import ./nixpkgs/pkgs.nix { inherit lib system; };

  package = pkgs.runCommand "sandbox-stand-in" { meta.mainProgram = "sandbox"; } "exit 1";
  self = { packages.${system}.sandbox = package; };

  settings = import ../modules/example-settings.nix;
  badSettings = { backend = "native"; bogus = 1; network.block = "yes"; };

  nixosModule = import ../../nixos-modules/nixos.nix { inherit self; };
  homeModule = import ../../nixos-modules/home-manager.nix { inherit self; };

  # The options of NixOS and home-manager that the modules set.
  hostOptions = {
    nixos = {
      options = {
        assertions = lib.mkOption { type = lib.types.listOf lib.types.unspecified; default = [ ]; };
        environment.systemPackages = lib.mkOption { type = lib.types.listOf lib.types.package; default = [ ]; };
        environment.etc = lib.mkOption {
          type = lib.types.attrsOf (lib.types.submodule { options.source = lib.mkOption { type = lib.types.path; }; });
          default = { };
        };
      };
    };
    home = {
      options = {
        assertions = lib.mkOption { type = lib.types.listOf lib.types.unspecified; default = [ ]; };
        home.packages = lib.mkOption { type = lib.types.listOf lib.types.package; default = [ ]; };
        xdg.configFile = lib.mkOption {
          type = lib.types.attrsOf (lib.types.submodule { options.source = lib.mkOption { type = lib.types.path; }; });
          default = { };
        };
      };
    };
  };

  # { options = the programs.sandbox option declarations; config = the resulting config; }
  evaluate = kind: module: programs:
    if deep then
      let
        evaluated = lib.evalModules {
          modules = [ module hostOptions.${kind} { programs.sandbox = programs; } { _module.args.pkgs = pkgs; } ];
        };
      in
      { options = evaluated.options.programs.sandbox; inherit (evaluated) config; }
    else
      let
        result = module { config.programs.sandbox = { package = package; settings = { }; } // programs; inherit lib pkgs; };
        isIf = (result.config._type or null) == "if";
        config =
          if !isIf then result.config
          else if result.config.condition then result.config.content
          else { };
      in
      { options = result.options.programs.sandbox; inherit config; };

  failed = config: builtins.filter (a: !a.assertion) (config.assertions or [ ]);

  checksFor = kind: module: { packagesOf, fileOf }:
    let
      good = evaluate kind module { enable = true; inherit settings; };
      bad = evaluate kind module { enable = true; settings = badSettings; };
      off = evaluate kind module { enable = false; };
      file = fileOf good.config;
      badMessages = builtins.concatStringsSep "\n" (map (a: a.message) (failed bad.config));
      # `pattern` (a regular expression) matches within one line of the messages.
      mentions = pattern: builtins.any (line: builtins.isString line && builtins.match ".*${pattern}.*" line != null)
        (builtins.split "\n" badMessages);
      expect = cond: why: if cond then true else why;
    in
    {
      "${kind}: declares enable, package and settings" =
        expect (builtins.attrNames good.options == [ "enable" "package" "settings" ]) "declares ${toString (builtins.attrNames good.options)}";
      "${kind}: enable is a boolean option, off by default" =
        expect (good.options.enable.type.name == "bool" && (good.options.enable.default or false) == false) "enable: ${good.options.enable.type.name}";
      "${kind}: package defaults to the flake's package" =
        expect (good.options.package.type.name == "package" && good.options.package.default.drvPath == package.drvPath) "package option differs";
      "${kind}: settings are typed as YAML values" =
        expect (good.options.settings.type.description == "YAML value") "settings type: ${good.options.settings.type.description}";
      "${kind}: the config file holds exactly the settings" =
        expect (file != null && builtins.fromJSON (builtins.readFile file) == settings) "config file: ${toString file}";
      "${kind}: the package is installed" =
        expect (builtins.any (p: p.drvPath == package.drvPath) (packagesOf good.config)) "package not installed";
      "${kind}: valid settings pass the assertions" =
        expect (failed good.config == [ ]) "assertions failed: ${toString (map (a: a.message) (failed good.config))}";
      "${kind}: unknown keys and wrong types fail the assertions" =
        expect (mentions "settings\\.bogus: unknown key" && mentions "settings\\.network\\.block: expected true or false")
          "assertion messages: ${badMessages}";
      "${kind}: nothing is configured when disabled" =
        expect (packagesOf off.config == [ ] && fileOf off.config == null) "disabled module still configures something";
    } // (if !deep then { } else {
      # What the NixOS manual and home-manager's option search render.
      "${kind}: options render as documentation" =
        let
          docs = lib.optionAttrSetToDocList good.options;
          rendered = map (o: [ o.name o.description (o.default or null) (o.example or null) ]) docs;
        in
        expect (builtins.deepSeq rendered (builtins.length docs == 3)) "documented ${toString (builtins.length docs)} options";
    });
  nixosChecks = checksFor "nixos" nixosModule {
    packagesOf = c: c.environment.systemPackages or [ ];
    fileOf = c: c.environment.etc."sandbox/config.yaml".source or null;
  };

  homeChecks = checksFor "home" homeModule {
    packagesOf = c: c.home.packages or [ ];
    fileOf = c: c.xdg.configFile."sandbox/config.yaml".source or null;
  };
in
nixosChecks // homeChecks
