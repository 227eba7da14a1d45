# STAND-IN for oxalica/rust-overlay, used only by `cargo xtask nix-check`, following the pinned
# revision fe2124391e739e7b3e8720cd8a73f06edd0aceba (flake.lock; flake.nix, lib/). `lib.mkRustBin`
# gives the `rust-bin` attribute set; the stable versions listed are those that revision
# has manifests for (manifests/stable/, 1.85.0 and later), so pinning one it lacks
# fails here too.
{
  description = "offline stand-in for rust-overlay (tests/nix-eval)";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs = { nixpkgs, ... }: {
    lib.mkRustBin = {}: pkgs:
      let
        versions = [
          "1.85.0"
          "1.85.1"
          "1.86.0"
          "1.87.0"
          "1.88.0"
          "1.89.0"
          "1.90.0"
          "1.91.0"
          "1.91.1"
          "1.92.0"
          "1.93.0"
          "1.93.1"
          "1.94.0"
          "1.94.1"
          "1.95.0"
          "1.96.0"
          "1.96.1"
          "1.97.0"
          "1.97.1"
        ];
        toolchain = version: profile: pkgs.standInDerivation "rust-${profile}-${version}" {
          standInBinaries = [ "cargo" "rustc" "cargo-clippy" "rustfmt" ];
        };
      in
      {
        stable = nixpkgs.lib.genAttrs versions (v: {
          default = toolchain v "default";
          minimal = toolchain v "minimal";
        });
      };
  };
}
