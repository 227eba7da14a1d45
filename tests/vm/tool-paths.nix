# The tool paths compiled into the package resolve inside a NixOS system that uses the module,
# `sandbox doctor` reports each of them as baked in (and a runtime variable as overriding it),
# and what the module installs around the binary is there: the configuration file the CLI
# accepts, completions and the manual page.
#
# `sandbox doctor --json` contract this test relies on: every tool is reported by an object
# with a "path" and a "source" that is "baked", "env" or "path" (see docs/nix.md).
{ self, pkgs }:
let
  package = self.packages.${pkgs.stdenv.hostPlatform.system}.sandbox;
  baked = package.passthru.bakedPaths;
in
pkgs.testers.runNixOSTest {
  name = "sandbox-tool-paths";

  nodes.machine = { pkgs, ... }: {
    imports = [ self.nixosModules.default ];
    programs.sandbox = {
      enable = true;
      settings = import ../modules/example-settings.nix;
    };
    environment.systemPackages = [ pkgs.git pkgs.file ];
    # The folders the example settings grant.
    systemd.tmpfiles.rules = [ "d /srv/cache 0755 root root -" "d /srv/datasets 0755 root root -" ];
    virtualisation.memorySize = 1024;
  };

  testScript = ''
    import json

    BAKED = json.loads(${builtins.toJSON (builtins.toJSON baked)})
    TOOLS = {"SANDBOX_LIMACTL": "limactl", "SANDBOX_NONO": "nono", "SANDBOX_MKE2FS": "mke2fs"}
    IMAGES = ("SANDBOX_LIMA_IMAGE", "SANDBOX_BOX_IMAGE")


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

    with subtest("the package bakes every tool and both guest images"):
        assert set(TOOLS) | set(IMAGES) <= set(BAKED), f"missing baked paths: {BAKED}"
        binary = machine.succeed("readlink -f \"$(command -v sandbox)\"").strip()
        assert binary == "${package}/bin/sandbox", f"sandbox on PATH is {binary}, not the module's package"
        for variable, path in BAKED.items():
            machine.succeed(f"grep -qF {path} {binary}")

    with subtest("the baked paths resolve in this system"):
        machine.succeed(f"{BAKED['SANDBOX_LIMACTL']} --version")
        machine.succeed(f"{BAKED['SANDBOX_NONO']} --version")
        machine.succeed(f"{BAKED['SANDBOX_MKE2FS']} -V")
        lima_image = BAKED["SANDBOX_LIMA_IMAGE"]
        machine.succeed(f"test -s {lima_image}")
        machine.succeed(f"file --brief {lima_image} | grep -q QCOW")
        box_image = BAKED["SANDBOX_BOX_IMAGE"]
        machine.succeed(f"test -f {box_image}/oci-layout && test -f {box_image}/index.json")

    with subtest("doctor reports the baked paths as baked"):
        report = json.loads(machine.succeed("sandbox doctor --json"))
        for variable in list(TOOLS) + list(IMAGES):
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

    with subtest("completions and the manual page are installed"):
        machine.succeed("test -s /run/current-system/sw/share/bash-completion/completions/sandbox")
        machine.succeed("test -s ${package}/share/zsh/site-functions/_sandbox")
        machine.succeed("test -s ${package}/share/fish/vendor_completions.d/sandbox.fish")
        machine.succeed("man --where sandbox")
  '';
}
