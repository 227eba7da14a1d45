# What the NixOS and home-manager modules share: the `programs.sandbox` options and the YAML
# file. `settings` is typed from the CLI's schema (settings.nix), so a misspelt key or a
# wrong value fails the system or home build with the option's name, as the CLI would refuse
# the file.
{ self, lib, pkgs, configPath }:
let
  yaml = pkgs.formats.yaml { };
  settingsType = import ./settings.nix { inherit lib; };

  # The package from this package set: the user's nixpkgs with overlays.default applied, or
  # the same overlay applied here (which builds against `pkgs` too, never a second nixpkgs).
  # Checked by its passthru, so an unrelated package of the same name is never picked.
  overlaid = pkgs.sandbox.passthru.sandbox-unwrapped or null != null;
  packages = if overlaid then pkgs else pkgs // self.overlays.default pkgs pkgs;
in
{
  options = {
    enable = lib.mkEnableOption "the `sandbox` command, its shell completions and manual page, and its configuration file";

    package = lib.mkPackageOption packages "sandbox" {
      nullable = true;
      extraDescription = ''
        Built from this flake's `overlays.default` against the same nixpkgs as the rest of
        the configuration. Its wrapper points the nono backend at the nono it was built
        with. `null` writes the configuration file without installing a package.
      '';
    };

    settings = lib.mkOption {
      inherit (settingsType) type;
      default = { };
      example = lib.literalExpression ''
        {
          backend = "native";
          read_folders = [ "/srv/datasets" "~/shared" ];
          network = { block = true; allow_ports = [ 3000 ]; };
          env.pass = [ "CARGO_HOME" ];
          timeout = "30m";
        }
      '';
      description = ''
        Configuration written to {file}`${configPath}`, a location the sandboxed process
        cannot write. The options mirror `sandbox config schema`; unset (`null`) keys are left
        out, and no file is written when nothing is set. Write paths as strings
        (`"/srv/cache"` or `"~/cache"`): a Nix path would be copied into the store.
      '';
    };
  };

  # The settings as written: only what is set.
  effective = settings: settingsType.prune settings;

  configFile = settings: yaml.generate "sandbox-config.yaml" (settingsType.prune settings);
}
