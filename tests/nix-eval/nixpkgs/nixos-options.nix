# Declarations of the NixOS options that nixos-modules/, vm-images/ and the tests' nodes set,
# with the types NixOS declares them with (nixos/modules/… in nixpkgs at the pinned revision
# e2587cae, flake.lock). A submodule lists only
# the sub-options we use and has no freeform type unless NixOS's has one, so a misspelt name
# is an error, as in NixOS.
{ lib, config, pkgs, ... }:
let
  inherit (lib) mkOption types;
  opt = type: default: mkOption { inherit type default; };
  unitOption = types.oneOf [ types.str types.bool types.int (types.listOf types.str) ];
  stub = name: pkgs.standInDerivation name { };
in
{
  options = {
    assertions = opt (types.listOf types.unspecified) [ ];
    warnings = opt (types.listOf types.str) [ ];

    nixpkgs.hostPlatform = mkOption { type = types.str; };

    system.stateVersion = mkOption { type = types.str; };
    system.build = mkOption {
      type = types.lazyAttrsOf types.unspecified;
      default = { };
    };

    networking.hostName = opt types.str "nixos";
    networking.firewall.allowedTCPPorts = opt (types.listOf types.port) [ ];
    documentation.enable = opt types.bool true;

    boot.isContainer = opt types.bool false;
    boot.kernelParams = opt (types.listOf types.str) [ ];

    environment.systemPackages = opt (types.listOf types.package) [ ];
    environment.etc = opt
      (types.attrsOf (types.submodule {
        options.source = mkOption { type = types.path; };
        options.text = mkOption { type = types.nullOr types.lines; default = null; };
      }))
      { };

    systemd.tmpfiles.rules = opt (types.listOf types.str) [ ];
    systemd.services = opt
      (types.attrsOf (types.submodule {
        options = {
          description = opt types.str "";
          wantedBy = opt (types.listOf types.str) [ ];
          after = opt (types.listOf types.str) [ ];
          requires = opt (types.listOf types.str) [ ];
          unitConfig = opt (types.attrsOf unitOption) { };
          serviceConfig = opt (types.attrsOf unitOption) { };
        };
      }))
      { };

    fileSystems = opt
      (types.attrsOf (types.submodule {
        options = {
          device = opt (types.nullOr types.str) null;
          fsType = opt types.str "auto";
          options = opt (types.nonEmptyListOf types.str) [ "defaults" ];
        };
      }))
      { };

    users.mutableUsers = opt types.bool true;
    users.users = opt
      (types.attrsOf (types.submodule {
        options.isNormalUser = opt types.bool false;
        options.extraGroups = opt (types.listOf types.str) [ ];
      }))
      { };

    security.sudo.wheelNeedsPassword = opt types.bool true;

    services.openssh = {
      enable = opt types.bool false;
      # NixOS: a freeform sshd_config with some keys declared.
      settings = opt
        (types.submodule {
          freeformType = types.attrsOf (types.nullOr (types.oneOf [ types.str types.int types.bool (types.listOf types.str) ]));
          options.PasswordAuthentication = opt types.bool true;
          options.KbdInteractiveAuthentication = opt types.bool true;
        })
        { };
    };
  };

  # What nixos/modules/image/images.nix provides; the flake reads the qemu-efi image.
  config.system.build.images.qemu-efi = stub "nixos-image-stand-in-${config.networking.hostName}" // {
    passthru.filePath = "nixos.qcow2";
    filePath = "nixos.qcow2";
  };
}
