# STAND-IN for `lib.nixosSystem` (nixpkgs flake.nix and nixos/lib/eval-config.nix at the pinned
# revision e2587cae, flake.lock): the real module system (lib.evalModules) over the given
# modules plus declarations of the NixOS options they set (nixos-options.nix). Setting an
# option that is not declared there fails as it would in NixOS ("The option `…' does not
# exist"); so does a value of the wrong type. Only options our modules and tests set are
# declared, with the types NixOS gives them; add one when a module starts using it.
{ lib, pkgsFor, modules, extraOptions ? [ ], specialArgs ? { }, ... }:
let
  evaluated = lib.evalModules {
    modules = modules ++ extraOptions ++ [
      ./nixos-options.nix
      ({ config, ... }: { _module.args.pkgs = pkgsFor config.nixpkgs.hostPlatform; })
    ];
    specialArgs = { modulesPath = ./nixos/modules; } // specialArgs;
  };

  inherit (evaluated) config;

  failed = map (a: a.message) (lib.filter (a: !a.assertion) config.assertions);

  # Every option's value, forced (what building the system would do), except system.build,
  # which holds the outputs.
  forced = lib.standInForce (removeAttrs config [ "system" ]) && lib.standInForce config.system.stateVersion
    && (failed == [ ] || throw "stand-in nixosSystem: failed assertions:\n${lib.concatStringsSep "\n" failed}");
in
evaluated // {
  config = config // {
    system = config.system // {
      build = lib.mapAttrs (_: v: assert forced; v) config.system.build;
    };
  };
  checked = forced;
}
