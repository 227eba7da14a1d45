# Evaluates nixos-modules/ with the real module system (`lib` is an unmodified nixpkgs lib)
# for `cargo xtask nix-check`, beyond what the flake's module checks do:
#   - every case of crates/sandbox-cli/schema/config-cases.json gets the verdict the CLI
#     gives it (a cargo test checks the CLI's side), through both modules;
#   - the options render as documentation, every settings option with a description.
# Returns { <check> = true | "<why it failed>"; }.
{ lib }:
let
  system = "x86_64-linux";
  standInLib = import ./nixpkgs/lib.nix { realLib = lib; inherit pkgsFor; };
  pkgsFor = s: import ./nixpkgs/pkgs.nix { lib = standInLib; system = s; };
  pkgs = pkgsFor system;

  package = pkgs.runCommand "sandbox-stand-in" { meta.mainProgram = "sandbox"; } "exit 1";
  self = { overlays.default = _: _: { sandbox = package; }; };

  cases = lib.importJSON ../../crates/sandbox-cli/schema/config-cases.json;

  # The options of NixOS and home-manager that the modules set.
  hosts = {
    nixos = {
      module = import ../../nixos-modules/nixos.nix { inherit self; };
      options = {
        environment.systemPackages = lib.mkOption { type = lib.types.listOf lib.types.package; default = [ ]; };
        environment.etc = lib.mkOption { type = lib.types.attrsOf (lib.types.submodule { options.source = lib.mkOption { type = lib.types.path; }; }); default = { }; };
      };
      fileOf = c: c.environment.etc."sandbox/config.yaml".source or null;
    };
    home = {
      module = import ../../nixos-modules/home-manager.nix { inherit self; };
      options = {
        home.packages = lib.mkOption { type = lib.types.listOf lib.types.package; default = [ ]; };
        xdg.configFile = lib.mkOption { type = lib.types.attrsOf (lib.types.submodule { options.source = lib.mkOption { type = lib.types.path; }; }); default = { }; };
      };
      fileOf = c: c.xdg.configFile."sandbox/config.yaml".source or null;
    };
  };

  evaluate = host: programs: lib.evalModules {
    modules = [ host.module { inherit (host) options; } { programs.sandbox = programs; } { _module.args.pkgs = pkgs; } ];
  };

  expect = cond: why: if cond then true else why;

  caseChecks = kind: host:
    let
      verdict = case:
        let
          file = host.fileOf (evaluate host { enable = true; inherit (case) settings; }).config;
          result = builtins.tryEval (builtins.deepSeq (if file == null then null else builtins.readFile file) true);
        in
        result.success;
      wrong = lib.filter (case: verdict case != case.valid) cases;
    in
    {
      "${kind}: decides the ${toString (lib.length cases)} shared settings cases as the CLI does" =
        expect (wrong == [ ]) "disagrees with the CLI on: ${lib.concatMapStringsSep "; " (c: "${c.name} (CLI: ${if c.valid then "valid" else "invalid"})") wrong}";
      "${kind}: writes what was set, without nulls" =
        let
          file = host.fileOf (evaluate host { enable = true; settings = { network.block = true; backend = null; }; }).config;
        in
        expect (file != null && builtins.fromJSON (builtins.readFile file) == { network.block = true; }) "wrote ${if file == null then "nothing" else builtins.readFile file}";
      "${kind}: options render as documentation" =
        let
          docs = lib.optionAttrSetToDocList (evaluate host { }).options.programs.sandbox;
          undocumented = lib.filter (o: lib.hasInfix ".settings." o.name && (o.description or "") == "") docs;
          rendered = map (o: [ o.name o.description (o.default or null) (o.example or null) o.type ]) docs;
        in
        expect (builtins.deepSeq rendered (lib.length docs > 20 && undocumented == [ ]))
          "documented ${toString (lib.length docs)} options; without a description: ${toString (map (o: o.name) undocumented)}";
    };
in
caseChecks "nixos" hosts.nixos // caseChecks "home" hosts.home
