# Declarations of the home-manager options our module and tests set, with home-manager's
# types (modules/home-environment.nix, modules/misc/xdg.nix, modules/misc/assertions.nix at
# e705714e, flake.lock). What home-manager adds to home.packages itself: own-packages.nix.
{ lib, ... }:
let
  inherit (lib) mkOption types;
in
{
  options = {
    assertions = mkOption { type = types.listOf types.unspecified; default = [ ]; };
    warnings = mkOption { type = types.listOf types.str; default = [ ]; };
    home = {
      username = mkOption { type = types.str; };
      homeDirectory = mkOption { type = types.path; };
      stateVersion = mkOption { type = types.str; };
      packages = mkOption { type = types.listOf types.package; default = [ ]; };
    };
    xdg.configFile = mkOption {
      type = types.attrsOf (types.submodule {
        options.source = mkOption { type = types.path; };
        options.text = mkOption { type = types.nullOr types.lines; default = null; };
      });
      default = { };
    };
  };
}
