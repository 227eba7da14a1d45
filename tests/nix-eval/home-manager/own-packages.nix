# What home-manager itself puts into `home.packages`, whatever the user's modules say, as it
# does at the pinned revision e705714e918c3b11affcdd15db2cbe3a070420a0 (flake.lock):
#   - modules/home-environment.nix: `home.packages = [ config.home.sessionVariablesPackage ]`,
#     unconditionally (a writeTextFile named hm-session-vars.sh);
#   - modules/manual.nix: the manual page (docs.manPages, a runCommand named
#     home-configuration-reference-manpage) while `manual.manpages.enable`, default true;
#   - modules/misc/xdg/mime.nix: shared-mime-info and two runCommandLocal directories while
#     `xdg.mime.enable`, default `pkgs.stdenv.hostPlatform.isLinux`.
# So a check that a configuration installs nothing else fails against the real home-manager;
# with this stand-in it fails offline too.
{ config, lib, pkgs, ... }:
let
  drv = name: pkgs.standInDerivation name { };
in
{
  options = {
    manual.manpages.enable = lib.mkOption { type = lib.types.bool; default = true; };
    xdg.mime.enable = lib.mkOption { type = lib.types.bool; default = pkgs.stdenv.hostPlatform.isLinux; };
  };

  config.home.packages = lib.mkMerge [
    [ (drv "hm-session-vars.sh") ]
    (lib.mkIf config.manual.manpages.enable [ (drv "home-configuration-reference-manpage") ])
    (lib.mkIf config.xdg.mime.enable [
      (drv "shared-mime-info")
      (drv "dummy-xdg-mime-dirs1")
      (drv "dummy-xdg-mime-dirs2")
    ])
  ];
}
