# STAND-IN for `pkgs.testers.runNixOSTest`: the test is a module of the NixOS test framework
# (nixos/lib/testing/*.nix at nixpkgs e2587cae, flake.lock), evaluated with the real module system against declarations of
# the framework options we use, so a misspelt one fails; each node is a stand-in NixOS system
# (nixos.nix) with the test-VM options our nodes set. The result is a derivation that cannot
# be built; it carries the test script (passthru.testScript), which nix-check byte-compiles.
{ lib, pkgs, standIn }:
test:
let
  inherit (lib) mkOption types;

  # The options of the NixOS VM a test node runs as (nixos/modules/virtualisation/qemu-vm.nix).
  vmOptions = {
    options.virtualisation = {
      memorySize = mkOption { type = types.ints.positive; default = 1024; };
      cores = mkOption { type = types.ints.positive; default = 1; };
      diskSize = mkOption { type = types.ints.positive; default = 1024; };
      qemu.options = mkOption { type = types.listOf types.str; default = [ ]; };
      # What replaces `fileSystems` in a test VM (qemu-vm.nix: mkVMOverride cfg.fileSystems).
      fileSystems = mkOption {
        type = types.attrsOf (types.submodule {
          options = {
            device = mkOption { type = types.nullOr types.str; default = null; };
            fsType = mkOption { type = types.str; default = "auto"; };
            options = mkOption { type = types.nonEmptyListOf types.str; default = [ "defaults" ]; };
          };
        });
        default = { };
      };
    };
  };

  framework = lib.evalModules {
    modules = [
      test
      {
        options = {
          name = mkOption { type = types.str; };
          nodes = mkOption { type = types.lazyAttrsOf types.deferredModule; default = { }; };
          defaults = mkOption { type = types.deferredModule; default = { }; };
          testScript = mkOption { type = types.either types.str (types.functionTo types.str); };
          globalTimeout = mkOption { type = types.int; default = 60 * 60; };
          skipLint = mkOption { type = types.bool; default = false; };
          skipTypeCheck = mkOption { type = types.bool; default = false; };
          enableOCR = mkOption { type = types.bool; default = false; };
          extraPythonPackages = mkOption { type = types.functionTo (types.listOf types.package); default = _: [ ]; };
          meta = mkOption { type = types.lazyAttrsOf types.raw; default = { }; };
          passthru = mkOption { type = types.lazyAttrsOf types.raw; default = { }; };
        };
      }
    ];
  };
  cfg = framework.config;

  nodes = lib.mapAttrs
    (_: node: lib.nixosSystem {
      modules = [ node cfg.defaults vmOptions { nixpkgs.hostPlatform = pkgs.stdenv.hostPlatform.system; system.stateVersion = lib.mkDefault "26.05"; } ];
    })
    cfg.nodes;

  script = if builtins.isFunction cfg.testScript then cfg.testScript { inherit nodes; } else cfg.testScript;

  # The test derivation's arguments, as nixos/lib/testing/run.nix makes them (the scheduling
  # features included), and `overrideTestDerivation`, which extends them as the real one does.
  testDerivation = args:
    standIn "vm-test-run-${cfg.name}" (args // {
      passthru = args.passthru // {
        overrideTestDerivation = f:
          let changes = if builtins.isFunction f then f args else f; in
          testDerivation (args // changes);
      };
    });
in
assert lib.all (n: n.checked) (lib.attrValues nodes);
testDerivation {
  testScript = script;
  globalTimeout = toString cfg.globalTimeout;
  nodeNames = lib.attrNames nodes;
  requiredSystemFeatures = [ "nixos-test" ] ++ lib.optionals pkgs.stdenv.hostPlatform.isLinux [ "kvm" ];
  passthru = { testScript = script; inherit (cfg) globalTimeout; };
}
