# The home-manager module in a real home-manager activation: the package lands in the user's
# profile, the settings in $XDG_CONFIG_HOME/sandbox/config.yaml, and a sandboxed command run
# as that user follows them: the folder they grant is readable, and an escape is blocked.
{ self, pkgs, home-manager }:
pkgs.testers.runNixOSTest {
  name = "sandbox-home-manager";
  globalTimeout = 15 * 60;

  nodes.machine = { pkgs, ... }: {
    imports = [ home-manager.nixosModules.home-manager ];
    users.users.alice.isNormalUser = true;
    environment.systemPackages = [ pkgs.git ];
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
            read_folders = [ "~/reference" ];
            network.allow_ports = [ 3000 ];
          };
        };
      };
    };
    virtualisation.memorySize = 1024;
  };

  testScript = ''
    import shlex


    def as_alice(script):
        return "su --login alice --command " + shlex.quote(script)


    machine.wait_for_unit("multi-user.target")
    machine.wait_for_unit("home-manager-alice.service")

    with subtest("the package and the configuration file are installed"):
        machine.succeed(as_alice("sandbox --version"))
        config = machine.succeed(as_alice('cat "''${XDG_CONFIG_HOME:-$HOME/.config}/sandbox/config.yaml"'))
        assert "backend: native" in config, config
        assert "~/reference" in config, config
        machine.succeed(as_alice('test -s "$HOME/.nix-profile/share/bash-completion/completions/sandbox" || test -s /etc/profiles/per-user/alice/share/bash-completion/completions/sandbox'))

    with subtest("a sandboxed command follows the module's configuration"):
        machine.succeed(as_alice("""
          set -eu
          mkdir -p ~/reference && echo REFERENCE > ~/reference/data
          echo SECRET > ~/secret
          git config --global user.name Alice && git config --global user.email alice@example.test
          git init -q ~/repo && git -C ~/repo commit -q --allow-empty -m init
          git -C ~/repo worktree add -q -b task ~/task
        """))
        policy = machine.succeed(as_alice("cd ~/task && sandbox policy show --json"))
        assert "/home/alice/reference" in policy, f"read_folders (~/reference) is not in the policy: {policy}"
        out = machine.succeed(as_alice("cd ~/task && sandbox run -- cat /home/alice/reference/data"))
        assert "REFERENCE" in out, out

    with subtest("an escape is blocked"):
        status, out = machine.execute(as_alice("cd ~/task && sandbox run -- sh -c 'echo STARTED; cat ~/secret; echo pwned >> ~/.profile' 2>&1"))
        assert "STARTED" in out, f"the sandboxed command never ran (exit {status}): {out}"
        assert status not in (0, 125), f"exit {status}: {out}"
        assert "SECRET" not in out, f"a file outside the grants was read: {out}"
        machine.fail(as_alice("grep -q pwned ~/.profile"))
  '';
}
