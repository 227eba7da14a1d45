# NixOS module, exported as `nixosModules.default`:
#
#   programs.sandbox = { enable = true; settings.network.block = true; };
#
# installs the CLI system-wide (its bash/zsh/fish completions and manual page come with the
# package and are linked into the system profile) and writes /etc/sandbox/config.yaml, the
# system configuration file the CLI trusts (docs/nix.md), when any setting is set.
{ self }:
{ config, lib, pkgs, ... }:
let
  cfg = config.programs.sandbox;
  common = import ./common.nix {
    inherit self lib pkgs;
    configPath = "/etc/sandbox/config.yaml";
  };
in
{
  options.programs.sandbox = common.options;

  config = lib.mkIf cfg.enable {
    environment.systemPackages = lib.optional (cfg.package != null) cfg.package;
    environment.etc."sandbox/config.yaml" = lib.mkIf (common.effective cfg.settings != { }) {
      source = common.configFile cfg.settings;
    };
  };
}
