# The guest images the CLI's VM backends boot, for one Linux `system`. The flake compiles their
# store paths into the `sandbox` binary (SANDBOX_LIMA_IMAGE, SANDBOX_BOX_IMAGE).
{ nixpkgs, system }:
let
  limaGuest = nixpkgs.lib.nixosSystem {
    modules = [
      ./lima.nix
      { nixpkgs.hostPlatform = system; }
    ];
  };
in
{
  # A NixOS system for Lima, made by nixpkgs' own image builder (nixos/modules/image):
  # an EFI-bootable qcow2 disk. The file is `lima-image/${lima-image.passthru.filePath}`.
  lima-image = limaGuest.config.system.build.images.qemu-efi;

  # The OCI layout directory BoxLite boots.
  box-image = import ./box-image.nix { pkgs = nixpkgs.legacyPackages.${system}; };
}
