# home-manager module, exported as `homeModules.default` (alias `homeManagerModules.default`):
#
#   programs.sandbox = { enable = true; settings.backend = "native"; };
#
# installs the CLI into the user's profile (completions and manual page included, found by
# home-manager's bash, zsh and fish setups) and writes $XDG_CONFIG_HOME/sandbox/config.yaml,
# the user configuration file the CLI trusts (docs/nix.md), when any setting is set.
{ self }:
{ config, lib, pkgs, ... }:
let
  cfg = config.programs.sandbox;
  common = import ./common.nix {
    inherit self lib pkgs;
    configPath = "$XDG_CONFIG_HOME/sandbox/config.yaml";
  };
in
{
  options.programs.sandbox = common.options;

  config = lib.mkIf cfg.enable {
    home.packages = lib.optional (cfg.package != null) cfg.package;
    xdg.configFile."sandbox/config.yaml" = lib.mkIf (common.effective cfg.settings != { }) {
      source = common.configFile cfg.settings;
    };
  };
}
