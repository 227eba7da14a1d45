# The NixOS guest the Lima backend boots (`nix build .#lima-image`). Everything the backend
# runs in the guest is in the image already, so first boot installs nothing: git, bash and
# coreutils for the agent's commands, /bin/bash for Lima's default login shell, the Lima user
# created from cidata at boot, and the mount points for sandbox views.
{ lib, pkgs, modulesPath, ... }:
{
  imports = [
    (modulesPath + "/profiles/qemu-guest.nix")
    ./lima-guest.nix
  ];

  system.stateVersion = "26.05";
  networking.hostName = "sandbox-lima";

  boot.kernelParams = [ "console=tty0" ]
    ++ lib.optional pkgs.stdenv.hostPlatform.isx86_64 "console=ttyS0,115200"
    ++ lib.optional pkgs.stdenv.hostPlatform.isAarch64 "console=ttyAMA0,115200";

  # git for the agent; util-linux (unshare, nsenter, setpriv, findmnt) and sudo for the
  # sandbox backend's provisioning script and its `enter` helper (crates/sandbox-lima).
  environment.systemPackages = with pkgs; [ bashInteractive coreutils git util-linux gawk ];

  # Every terminal and hook is one SSH session on Lima's shared connection (the backend's
  # provisioning checks this and would otherwise fail: /etc/ssh is not writable on NixOS).
  services.openssh.settings.MaxSessions = 128;

  systemd.tmpfiles.rules = [
    # Lima's default login shell is /bin/bash; NixOS only has /bin/sh.
    "L+ /bin/bash - - - - ${pkgs.bashInteractive}/bin/bash"
    # Sandbox views are mounted under here (the backend may also mount them at the host's
    # path; lima-init.sh creates whatever mount point the instance's YAML names).
    "d /sandbox 0755 root root -"
  ];

  documentation.enable = false;
}
