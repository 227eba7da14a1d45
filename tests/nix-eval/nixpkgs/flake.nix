# STAND-IN for nixpkgs, used only by `cargo xtask nix-check` to evaluate the flake's output
# structure on a machine that cannot download nixpkgs. It provides exactly the attributes that
# evaluation touches; every "package" is a derivation whose builder fails, so nothing built
# from it can be mistaken for the real thing. Never use it for anything else.
{
  description = "offline stand-in for nixpkgs (tests/nix-eval, structure evaluation only)";

  outputs = _:
    let
      lib = import ./lib.nix;
    in
    {
      inherit lib;
      legacyPackages = lib.genAttrs [ "x86_64-linux" "aarch64-linux" "aarch64-darwin" ]
        (system: import ./pkgs.nix { inherit lib system; });
    };
}
