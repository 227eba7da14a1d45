# The guest images the CLI's VM backends will boot, for one Linux `system`. The flake builds them
# as packages of their own; the Lima and BoxLite backends add their paths to the package's
# wrapper when they land (docs/nix.md, "Tool paths").
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
