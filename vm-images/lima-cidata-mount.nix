# Where and how the guest mounts Lima's cidata disk (the ISO 9660 volume labelled `cidata`).
# lima-guest.nix mounts it; the NixOS VM test tests/vm/lima-boot.nix mounts it with exactly these
# settings (a test VM replaces `fileSystems` wholesale, so it must restate them).
{
  mountPoint = "/mnt/lima-cidata";
  fileSystem = {
    device = "/dev/disk/by-label/cidata";
    fsType = "iso9660";
    options = [ "ro" "mode=0700" "dmode=0700" "overriderockperm" "exec" "uid=0" "nofail" "x-systemd.device-timeout=30s" ];
  };
}
