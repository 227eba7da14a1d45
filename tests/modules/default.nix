# Module evaluation checks: evaluate `nixosModules.default` in a NixOS system and
# `homeModules.default` in a home-manager configuration, then check at evaluation time that
# the package is installed and the assertions behave, and at build time that the YAML file
# holds exactly the settings.
{ self, nixpkgs, home-manager, pkgs, system }:
let
  inherit (pkgs) lib;

  settings = import ./example-settings.nix;
  badSettings = {
    backend = "native";
    bogus = 1;
    network.block = "yes";
    read_folders = [ "relative/path" ];
  };

  nixosWith = programs: nixpkgs.lib.nixosSystem {
    modules = [
      self.nixosModules.default
      {
        nixpkgs.hostPlatform = system;
        boot.isContainer = true;
        system.stateVersion = "26.05";
        programs.sandbox = programs;
      }
    ];
  };

  homeWith = programs: home-manager.lib.homeManagerConfiguration {
    inherit pkgs;
    modules = [
      self.homeModules.default
      {
        home = {
          username = "alice";
          homeDirectory = "/home/alice";
          stateVersion = "26.05";
        };
        programs.sandbox = programs;
      }
    ];
  };

  failedAssertions = evaluated: map (a: a.message) (lib.filter (a: !a.assertion) evaluated.config.assertions);

  # Fails evaluation with `message` unless `cond` holds.
  expect = cond: message: lib.assertMsg cond "module check: ${message}";

  checkEvaluation = { kind, good, bad, installed }:
    let
      badMessages = lib.concatStringsSep "\n" (failedAssertions bad);
    in
    assert expect (failedAssertions good == [ ]) "${kind}: valid settings raised assertions: ${toString (failedAssertions good)}";
    assert expect (lib.hasInfix "settings.bogus: unknown key" badMessages) "${kind}: an unknown key was not reported:\n${badMessages}";
    assert expect (lib.hasInfix "settings.network.block: expected true or false" badMessages) "${kind}: a mistyped value was not reported:\n${badMessages}";
    assert expect (lib.hasInfix "settings.read_folders: expected a list whose items are each an absolute path" badMessages) "${kind}: a relative path was not reported:\n${badMessages}";
    assert expect (lib.elem self.packages.${system}.sandbox installed) "${kind}: the flake's package is not installed by default";
    true;

  # Build-time half: the YAML file holds exactly `settings`.
  compareFile = name: file: pkgs.runCommand name
    {
      nativeBuildInputs = [ pkgs.yq-go pkgs.jq ];
      expected = builtins.toJSON settings;
      passAsFile = [ "expected" ];
    } ''
    yq --output-format=json . ${file} | jq --sort-keys . > actual.json
    jq --sort-keys . "$expectedPath" > expected.json
    diff -u expected.json actual.json
    touch "$out"
  '';

  nixosGood = nixosWith { enable = true; inherit settings; };
  homeGood = homeWith { enable = true; inherit settings; };

  nixosEvaluation = {
    kind = "NixOS";
    good = nixosGood;
    bad = nixosWith { enable = true; settings = badSettings; };
    installed = nixosGood.config.environment.systemPackages;
  };
  homeEvaluation = {
    kind = "home-manager";
    good = homeGood;
    bad = homeWith { enable = true; settings = badSettings; };
    installed = homeGood.config.home.packages;
  };

  # The evaluation-time checks sit inside the build script, so listing the checks (`nix flake
  # show`) does not evaluate NixOS; building or instantiating them does.
  nixosFile = assert checkEvaluation nixosEvaluation; nixosGood.config.environment.etc."sandbox/config.yaml".source;
  homeFile = assert checkEvaluation homeEvaluation; homeGood.config.xdg.configFile."sandbox/config.yaml".source;
in
{
  module-home-manager = compareFile "sandbox-module-home-manager" homeFile;
} // lib.optionalAttrs pkgs.stdenv.hostPlatform.isLinux {
  module-nixos = compareFile "sandbox-module-nixos" nixosFile;
}
