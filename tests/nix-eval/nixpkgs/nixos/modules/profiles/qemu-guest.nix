# STAND-IN for nixpkgs' nixos/modules/profiles/qemu-guest.nix (kernel modules for QEMU guests;
# it sets nothing our checks look at).
_: { }
