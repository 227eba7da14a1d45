# What the NixOS and home-manager modules share: the `programs.sandbox` options, the YAML file,
# and the assertion that keeps `settings` inside the schema the CLI accepts.
{ self, lib, pkgs, configPath }:
let
  yaml = pkgs.formats.yaml { };
  settingsSchema = import ./settings.nix;
  system = pkgs.stdenv.hostPlatform.system;
in
{
  options = {
    enable = lib.mkEnableOption "the `sandbox` command, its shell completions and manual page, and its configuration file";

    package = lib.mkOption {
      type = lib.types.package;
      default = self.packages.${system}.sandbox;
      defaultText = lib.literalExpression "sandbox.packages.\${pkgs.stdenv.hostPlatform.system}.sandbox";
      description = ''
        The `sandbox` package. The default is this flake's build, which has the paths of
        `limactl`, `nono`, `mke2fs` and the guest images compiled in.
      '';
    };

    settings = lib.mkOption {
      inherit (yaml) type;
      default = { };
      example = lib.literalExpression ''
        {
          backend = "native";
          read_folders = [ "/srv/datasets" ];
          network = { block = true; allow_ports = [ 3000 ]; };
          env.pass = [ "CARGO_HOME" ];
          timeout = "30m";
        }
      '';
      description = ''
        Configuration written to {file}`${configPath}`, a location the sandboxed process
        cannot write. Keys: `backend`, `additional_folders`, `read_folders`,
        `network.{block,allow_ports,allow_domains}`, `env.{pass,set}`, `timeout`, `views.root`,
        `service.hook_port`, `backends.custom.command`, `backends.nono.path`. Unknown keys
        fail the build, as the CLI would refuse them. Write paths as strings.
      '';
    };
  };

  configFile = settings: yaml.generate "sandbox-config.yaml" settings;

  assertions = settings:
    let
      problems = settingsSchema.check settings;
    in
    [{
      assertion = problems == [ ];
      message = "programs.sandbox.${builtins.concatStringsSep "\nprograms.sandbox." problems}";
    }];
}
