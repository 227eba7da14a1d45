# STAND-IN for nixpkgs, used only by `cargo xtask nix-check` on a machine that cannot download
# nixpkgs; it follows nixpkgs at the pinned revision e2587caef70cea85dd97d7daab492899902dbf5d
# (flake.lock), file by file as each stand-in names. `lib` is the REAL nixpkgs lib (the `nixpkgs-lib` input, which nix-check points at
# an unmodified nixpkgs.lib checkout, ../shared/nixpkgs-lib), with two parts replaced because
# nix 2.8 cannot run them or they live outside lib (lib.nix). The packages are derivations
# that refuse to build (pkgs.nix), and NixOS is the real module system with declarations of
# the NixOS options our modules set (nixos.nix), so a misspelt option fails. Never use it
# for anything else.
{
  description = "offline stand-in for nixpkgs (tests/nix-eval)";

  inputs.nixpkgs-lib.url = "github:nix-community/nixpkgs.lib";

  outputs = { nixpkgs-lib, ... }:
    let
      lib = import ./lib.nix { realLib = nixpkgs-lib.lib; inherit pkgsFor; };
      pkgsFor = system: import ./pkgs.nix { inherit lib system; };
    in
    {
      inherit lib;
      legacyPackages = lib.genAttrs [ "x86_64-linux" "aarch64-linux" "aarch64-darwin" ] pkgsFor;
    };
}
