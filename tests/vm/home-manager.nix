# The home-manager module in a real home-manager activation: the package lands in the user's
# profile and the settings in $XDG_CONFIG_HOME/sandbox/config.yaml.
{ self, pkgs, home-manager }:
pkgs.testers.runNixOSTest {
  name = "sandbox-home-manager";

  nodes.machine = { ... }: {
    imports = [ home-manager.nixosModules.home-manager ];
    users.users.alice.isNormalUser = true;
    home-manager = {
      useGlobalPkgs = true;
      useUserPackages = true;
      users.alice = {
        imports = [ self.homeModules.default ];
        home.stateVersion = "26.05";
        programs.sandbox = {
          enable = true;
          settings = {
            backend = "native";
            network.allow_ports = [ 3000 ];
          };
        };
      };
    };
    virtualisation.memorySize = 1024;
  };

  testScript = ''
    machine.wait_for_unit("multi-user.target")
    machine.wait_for_unit("home-manager-alice.service")
    machine.succeed("su --login alice --command 'sandbox --version'")
    config = machine.succeed("su --login alice --command 'cat \"''${XDG_CONFIG_HOME:-$HOME/.config}/sandbox/config.yaml\"'")
    assert "backend: native" in config, config
    assert "3000" in config, config
    machine.succeed("su --login alice --command 'test -s \"$HOME/.nix-profile/share/bash-completion/completions/sandbox\" || test -s /etc/profiles/per-user/alice/share/bash-completion/completions/sandbox'")
  '';
}
