# STAND-IN for home-manager, used only by `cargo xtask nix-check` (see ../nixpkgs/flake.nix).
# The structure evaluation never forces these; they exist so the flake's references resolve.
{
  description = "offline stand-in for home-manager (tests/nix-eval, structure evaluation only)";

  outputs = _: {
    lib.homeManagerConfiguration = _: throw "stand-in home-manager: homeManagerConfiguration is not available offline";
    nixosModules.home-manager = _: { };
  };
}
