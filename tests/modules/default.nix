# Module evaluation checks: evaluate `nixosModules.default` in a NixOS system and
# `homeModules.default` in a home-manager configuration, then check at evaluation time that
# the package is installed, that settings the CLI would refuse fail the evaluation, and that
# nothing is written without settings; and at build time that the YAML file holds exactly
# the settings.
{ self, nixpkgs, home-manager, pkgs, system }:
let
  inherit (pkgs) lib;

  settings = import ./example-settings.nix;
  # Each is refused by the CLI, so the module must refuse it.
  badSettings = {
    "an unknown key" = { bogus = 1; };
    "a mistyped value" = { network.block = "yes"; };
    "a relative path" = { read_folders = [ "relative/path" ]; };
    "a malformed duration" = { timeout = "soon"; };
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

  # Fails evaluation with `message` unless `cond` holds.
  expect = cond: message: lib.assertMsg cond "module check: ${message}";

  fails = value: !(builtins.tryEval (builtins.deepSeq value true)).success;

  # This flake's package (the wrapper's passthru), among whatever else the system or the
  # home installs: home-manager always adds packages of its own (hm-session-vars.sh, its
  # manual page, on Linux the XDG MIME ones), so "installs nothing" is "installs none of ours".
  ours = lib.filter (p: p ? sandbox-unwrapped);

  checkEvaluation = { kind, evaluate, packagesOf, fileOf }:
    let
      good = evaluate { enable = true; inherit settings; };
      empty = evaluate { enable = true; };
      noPackage = evaluate { enable = true; package = null; inherit settings; };
    in
    assert expect (lib.elem self.packages.${system}.sandbox.name (map (p: p.name) (packagesOf good))) "${kind}: the sandbox package is not installed by default";
    assert expect (fileOf empty == null) "${kind}: a config file is written although no setting is set";
    assert expect (ours (packagesOf noPackage) == [ ] && fileOf noPackage != null) "${kind}: package = null still installs the sandbox package, or writes no file";
    assert lib.all (what: expect (fails (fileOf (evaluate { enable = true; settings = badSettings.${what}; }))) "${kind}: ${what} was accepted") (lib.attrNames badSettings);
    fileOf good;

  # Build-time half: the YAML file holds exactly `settings`. Read with PyYAML, which Debian
  # has too, so `cargo xtask nix-check` runs this body on the file the evaluation wrote.
  compareFile = name: file: pkgs.runCommand name
    {
      nativeBuildInputs = [ (pkgs.python3.withPackages (ps: [ ps.pyyaml ])) ];
      expected = builtins.toJSON settings;
      passAsFile = [ "expected" ];
    } ''
    python3 - ${file} "$expectedPath" <<'EOF'
    import json, sys, yaml
    actual = json.dumps(yaml.safe_load(open(sys.argv[1])), indent=2, sort_keys=True)
    expected = json.dumps(json.load(open(sys.argv[2])), indent=2, sort_keys=True)
    if actual != expected:
        sys.exit(f"the module wrote\n{actual}\nnot\n{expected}")
    EOF
    touch "$out"
  '';

  # The evaluation-time checks run when the check is instantiated (`nix flake check`, or the
  # offline structure check), not when it is only listed.
  nixosFile = checkEvaluation {
    kind = "NixOS";
    evaluate = programs: (nixosWith programs).config;
    packagesOf = c: c.environment.systemPackages;
    fileOf = c: c.environment.etc."sandbox/config.yaml".source or null;
  };
  homeFile = checkEvaluation {
    kind = "home-manager";
    evaluate = programs: (homeWith programs).config;
    packagesOf = c: c.home.packages;
    fileOf = c: c.xdg.configFile."sandbox/config.yaml".source or null;
  };
in
{
  module-home-manager = compareFile "sandbox-module-home-manager" homeFile;
} // lib.optionalAttrs pkgs.stdenv.hostPlatform.isLinux {
  module-nixos = compareFile "sandbox-module-nixos" nixosFile;
}
