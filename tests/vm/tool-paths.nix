# The tool paths the package's wrapper sets resolve inside a NixOS system that uses the
# module, `sandbox doctor` reports each as the package's ("baked") and a runtime variable as
# overriding it, the nono backend runs with the package's nono (an escape included), and what
# the module installs around the binary is there: the configuration file the CLI accepts,
# completions and the manual page.
#
# `sandbox doctor --json` contract this test relies on: every tool is reported by an object
# with a "path" and a "source" that is "baked", "env", "config" or "path" (see docs/nix.md).
{ self, pkgs }:
let
  package = self.packages.${pkgs.stdenv.hostPlatform.system}.sandbox;
  baked = package.toolPaths;
  example = import ../modules/example-settings.nix;
in
pkgs.testers.runNixOSTest {
  name = "sandbox-tool-paths";
  globalTimeout = 15 * 60;

  nodes.machine = { pkgs, ... }: {
    imports = [ self.nixosModules.default ];
    programs.sandbox = {
      enable = true;
      # backends.nono.path would override the package's nono, which this test is about.
      settings = example // { backends = removeAttrs example.backends [ "nono" ]; };
    };
    environment.systemPackages = [ pkgs.git pkgs.file ];
    # The folders the example settings grant.
    systemd.tmpfiles.rules = [ "d /srv/cache 0755 root root -" "d /srv/datasets 0755 root root -" ];
    virtualisation.memorySize = 1024;
  };

  testScript = ''
    import json

    BAKED = json.loads(${builtins.toJSON (builtins.toJSON baked)})
    TOOLS = {"SANDBOX_PACKAGE_NONO": "nono"}


    def objects(value):
        """Every JSON object in a report, depth first."""
        if isinstance(value, dict):
            yield value
            for item in value.values():
                yield from objects(item)
        elif isinstance(value, list):
            for item in value:
                yield from objects(item)


    def entry_for(report, path):
        found = [o for o in objects(report) if o.get("path") == path]
        assert found, f"sandbox doctor --json does not report {path}: {json.dumps(report, indent=2)}"
        return found[0]


    machine.wait_for_unit("multi-user.target")

    with subtest("the wrapper sets exactly the tools a backend uses"):
        assert set(BAKED) == set(TOOLS), f"baked paths: {BAKED}"
        wrapper = machine.succeed("readlink -f \"$(command -v sandbox)\"").strip()
        assert wrapper == "${package}/bin/sandbox", f"sandbox on PATH is {wrapper}, not the module's package"
        for variable, path in BAKED.items():
            machine.succeed(f"grep -qF {path} {wrapper}")

    with subtest("the baked paths resolve in this system, and nono is new enough"):
        version = machine.succeed(f"{BAKED['SANDBOX_PACKAGE_NONO']} --version").split()[-1]
        assert tuple(int(p) for p in version.split(".")) >= (0, 81, 0), f"nono {version}"

    with subtest("doctor reports the baked paths as baked"):
        report = json.loads(machine.succeed("sandbox doctor --json"))
        for variable in TOOLS:
            entry = entry_for(report, BAKED[variable])
            assert entry.get("source") == "baked", f"{variable}: expected source 'baked', got {entry}"
        human = machine.succeed("sandbox doctor")
        for variable in TOOLS:
            assert BAKED[variable] in human, f"`sandbox doctor` does not show {BAKED[variable]}"

    with subtest("a runtime variable overrides a baked path"):
        report = json.loads(machine.succeed("SANDBOX_NONO=/run/current-system/sw/bin/true sandbox doctor --json"))
        entry = entry_for(report, "/run/current-system/sw/bin/true")
        assert entry.get("source") == "env", f"expected source 'env', got {entry}"

    with subtest("the module's configuration file is where the CLI reads it, and it accepts it"):
        machine.succeed("test -f /etc/sandbox/config.yaml")
        machine.succeed("""
          set -eu
          git init -q /root/repo
          git -C /root/repo -c user.name=t -c user.email=t@t commit -q --allow-empty -m init
          git -C /root/repo worktree add -q -b task /root/task
        """)
        policy = machine.succeed("cd /root/task && sandbox policy show --json")
        assert "/srv/datasets" in policy, f"read_folders from /etc/sandbox/config.yaml missing from the policy: {policy}"

    with subtest("the nono backend runs with the baked nono, and holds"):
        out = machine.succeed("cd /root/task && sandbox run --backend nono -- sh -c 'echo inside > file && cat file'")
        assert "inside" in out, out
        status, out = machine.execute("cd /root/task && sandbox run --backend nono -- sh -c 'echo STARTED; echo pwned > /root/outside' 2>&1")
        assert "STARTED" in out and status not in (0, 125), f"exit {status}: {out}"
        machine.fail("test -e /root/outside")

    with subtest("completions and the manual page are installed"):
        machine.succeed("test -s /run/current-system/sw/share/bash-completion/completions/sandbox")
        machine.succeed("test -s ${package}/share/zsh/site-functions/_sandbox")
        machine.succeed("test -s ${package}/share/fish/vendor_completions.d/sandbox.fish")
        machine.succeed("man --where sandbox")
  '';
}
