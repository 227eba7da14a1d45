# STAND-IN for home-manager, used only by `cargo xtask nix-check` (see ../nixpkgs/flake.nix).
# The real module system with declarations of the home-manager options our module and tests
# set (options.nix), as a standalone configuration (`lib.homeManagerConfiguration`) and as
# the NixOS module (`home-manager.users.<name>`), so a misspelt option fails.
{
  description = "offline stand-in for home-manager (tests/nix-eval)";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs = { nixpkgs, ... }:
    let
      inherit (nixpkgs) lib;
      homeOptions = import ./options.nix;
    in
    {
      lib.homeManagerConfiguration = { pkgs, modules, extraSpecialArgs ? { } }:
        let
          evaluated = lib.evalModules {
            modules = modules ++ [ homeOptions { _module.args.pkgs = pkgs; } ];
            specialArgs = extraSpecialArgs;
          };
          checked = lib.standInForce evaluated.config;
        in
        evaluated // {
          activationPackage = assert checked; pkgs.standInDerivation "home-manager-generation" { };
        };

      nixosModules.home-manager = { lib, pkgs, ... }: {
        options.home-manager = {
          useGlobalPkgs = lib.mkOption { type = lib.types.bool; default = false; };
          useUserPackages = lib.mkOption { type = lib.types.bool; default = false; };
          users = lib.mkOption {
            type = lib.types.attrsOf (lib.types.submoduleWith {
              modules = [
                homeOptions
                { _module.args.pkgs = pkgs; }
                # As home-manager's NixOS module does, from users.users.<name>.
                ({ name, ... }: {
                  home.username = lib.mkDefault name;
                  home.homeDirectory = lib.mkDefault "/home/${name}";
                })
              ];
            });
            default = { };
          };
        };
      };
    };
}
