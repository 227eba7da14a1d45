# What a Lima guest needs from its image when it is NixOS: the cidata disk mounted, the user,
# keys and shared directories set up from it on every boot (lima-init.sh), and the guest agent
# running. Lima's own boot scripts expect a mutable distribution (package managers, writable
# /etc/systemd) and are not used.
{ lib, pkgs, ... }:
let
  cidataMount = import ./lima-cidata-mount.nix;
  cidata = cidataMount.mountPoint;

  limaInit = pkgs.writeShellApplication {
    name = "sandbox-lima-init";
    runtimeInputs = with pkgs; [ coreutils gawk gnugrep shadow util-linux ];
    text = builtins.readFile ./lima-init.sh;
  };

  guestAgent = pkgs.writeShellApplication {
    name = "sandbox-lima-guestagent";
    runtimeInputs = with pkgs; [ coreutils gnugrep ];
    text = builtins.readFile ./lima-guestagent.sh;
  };
in
{
  fileSystems.${cidata} = cidataMount.fileSystem;

  systemd.services.sandbox-lima-init = {
    description = "Set up the Lima user, SSH keys and shared directories from cidata";
    wantedBy = [ "multi-user.target" ];
    after = [ "network-pre.target" ];
    unitConfig = {
      RequiresMountsFor = cidata;
      ConditionPathExists = "${cidata}/lima.env";
    };
    serviceConfig = {
      Type = "oneshot";
      RemainAfterExit = true;
      ExecStart = lib.getExe limaInit;
    };
  };

  systemd.services.sandbox-lima-guestagent = {
    description = "Lima guest agent (port forwarding and events for the host agent)";
    wantedBy = [ "multi-user.target" ];
    after = [ "network.target" "sandbox-lima-init.service" ];
    requires = [ "sandbox-lima-init.service" ];
    unitConfig.ConditionPathExists = "${cidata}/lima-guestagent";
    serviceConfig = {
      ExecStart = lib.getExe guestAgent;
      Restart = "on-failure";
    };
  };

  # lima-init.sh adds the Lima user at boot; NixOS must not remove it on activation.
  users.mutableUsers = true;
  # `limactl stop` and Lima's host agent use passwordless sudo, as on Lima's own images.
  security.sudo.wheelNeedsPassword = false;
  services.openssh = {
    enable = true;
    settings = {
      PasswordAuthentication = false;
      KbdInteractiveAuthentication = false;
    };
  };
}
