# STAND-IN for home-manager, used only by `cargo xtask nix-check` (see ../nixpkgs/flake.nix).
# Follows home-manager at the pinned revision e705714e918c3b11affcdd15db2cbe3a070420a0
# (flake.lock): the real module system with declarations of the home-manager options our
# module and tests set (options.nix) and the packages home-manager adds of its own
# (own-packages.nix), as a standalone configuration (`lib.homeManagerConfiguration`,
# lib/default.nix) and as the NixOS module (`home-manager.users.<name>`, nixos/default.nix),
# so a misspelt option fails and "no packages" is never what a configuration has.
{
  description = "offline stand-in for home-manager (tests/nix-eval)";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs = { nixpkgs, ... }:
    let
      inherit (nixpkgs) lib;
      homeOptions = { imports = [ ./options.nix ./own-packages.nix ]; };
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
