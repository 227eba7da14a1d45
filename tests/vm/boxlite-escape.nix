# The escape suite's file and network rows (tests/vm/escape.nix), run inside a BoxLite box
# booted from the flake's box image (`packages.box-image`) by the `sandbox-boxlite` package,
# with its runtime files from the pinned wheel.
#
# The box is a microVM inside the test VM, so the builder needs KVM with nested virtualisation
# (the test VM gets /dev/kvm from QEMU's `-cpu max`; a GitHub-hosted Linux runner has it).
# A builder with `kvm` need not have it, so this test is `legacyPackages.x86_64-linux
# .vm-boxlite-escape` (`nix build .#vm-boxlite-escape`), not a check `nix flake check` runs.
#
# Inside a box, the guest's own files are the guest's to change: what must hold is that nothing
# the user protects on the host changes, that secrets outside the mounts cannot be read, and
# that only the allowed network destinations answer. Every attempt runs under
# `sandbox exec --backend boxlite` and must have started in the box (a marker it prints first,
# from a guest kernel that is not the host's); the damage is then looked for from the host.
{ self, pkgs }:
let
  inherit (pkgs.stdenv.hostPlatform) system;
  sandbox = self.packages.${system}.sandbox-boxlite;
  boxImage = self.packages.${system}.box-image;
in
(pkgs.testers.runNixOSTest {
  name = "sandbox-boxlite-escape";
  globalTimeout = 20 * 60;

  nodes.machine = {
    environment.systemPackages = [ sandbox pkgs.git pkgs.curl ];
    users.users.alice = {
      isNormalUser = true;
      # /dev/kvm is root:kvm 0660 on NixOS.
      extraGroups = [ "kvm" ];
    };
    virtualisation.memorySize = 4096;
    virtualisation.cores = 2;
    virtualisation.diskSize = 8192;
  };

  # A web server elsewhere on the test network: the network rows' destination.
  nodes.server = {
    systemd.services.web = {
      wantedBy = [ "multi-user.target" ];
      serviceConfig.ExecStart = "${pkgs.python3.interpreter} -m http.server 8080";
    };
    networking.firewall.allowedTCPPorts = [ 8080 ];
  };

  testScript = ''
    import shlex

    HOME = "/home/alice"
    MAIN = f"{HOME}/src/repo"
    COMMON = f"{MAIN}/.git"
    WORKTREE = f"{HOME}/src/task"
    IMAGE = "${boxImage}"


    def as_alice(script):
        return "su --login alice --command " + shlex.quote(script)


    def boxed(script, box, flags):
        # The marker tells "the box ran the command" apart from "no box started" (125).
        inner = 'echo "BOX-STARTED $(uname -r)"; ' + script
        return as_alice(
            f"cd {WORKTREE} && sandbox exec --backend boxlite --box {box} --rootfs {IMAGE} "
            f"--mount {WORKTREE}:{WORKTREE} --workdir {WORKTREE} {flags} "
            f"-- sh -c {shlex.quote(inner)} 2>&1"
        )


    def in_box(what, script, box="escape", flags=""):
        status, output = machine.execute(boxed(script, box, flags))
        machine.log(f"[{box} {flags}] [{what}] exit {status}: {output}")
        started = [line.split()[1:] for line in output.splitlines() if line.startswith("BOX-STARTED")]
        assert started, f"{what}: the command never ran in a box (exit {status}): {output}"
        assert started[0] != [HOST_KERNEL], f"{what}: ran on the host's kernel {HOST_KERNEL}, not in a box"
        assert status != 125, f"{what}: the box was not ready: {output}"
        return status, output


    def works(what, script, **kw):
        status, output = in_box(what, script, **kw)
        assert status == 0, f"{what}: exit {status}: {output}"
        return output


    def fails(what, script, **kw):
        status, output = in_box(what, script, **kw)
        assert status != 0, f"{what}: exit 0, the attempt was not stopped: {output}"
        return output


    def protected_state():
        return machine.succeed(
            f"cd {COMMON} && find config hooks info packed-refs -type f 2>/dev/null | sort | xargs -r sha256sum; "
            f"sha256sum {HOME}/.bashrc {HOME}/victim {HOME}/.ssh/id_ed25519"
        )


    start_all()
    machine.wait_for_unit("multi-user.target")
    # The box is a KVM guest of this VM: without nested virtualisation on the builder there
    # is no /dev/kvm here, and nothing below could run.
    status, _ = machine.execute("test -c /dev/kvm && test -r /dev/kvm")
    assert status == 0, (
        "no /dev/kvm inside the test VM: vm-boxlite-escape needs a builder with nested KVM "
        "(kvm_intel nested=1 or kvm_amd nested=1; docs/nix.md)"
    )
    HOST_KERNEL = machine.succeed("uname -r").strip()

    with subtest("set up a repository, a linked worktree and things worth stealing"):
        machine.succeed(as_alice(f"""
          set -eu
          git config --global user.name Alice
          git config --global user.email alice@example.test
          git config --global init.defaultBranch main
          mkdir -p {HOME}/src {HOME}/.ssh
          chmod 700 {HOME}/.ssh
          echo SECRET-PRIVATE-KEY > {HOME}/.ssh/id_ed25519
          chmod 600 {HOME}/.ssh/id_ed25519
          echo '# original bashrc' > {HOME}/.bashrc
          echo victim > {HOME}/victim
          git init -q {MAIN}
          cd {MAIN}
          echo hello > README
          git add README
          git commit -qm init
          git worktree add -q -b task {WORKTREE}
          ln -s {HOME}/victim {WORKTREE}/link-out
        """))
        before = protected_state()

    with subtest("a box boots from the flake's image, with the worktree mounted at its path"):
        output = works("the image's userland", "git --version && python3 -c 'print(6 * 7)'")
        assert "git version" in output and "42" in output.splitlines(), output
        works("write the worktree", "echo from-the-box > made-in-box.txt")
        machine.succeed(f"grep -qx from-the-box {WORKTREE}/made-in-box.txt")

    with subtest("file rows: nothing outside the mounts is reachable from the box"):
        in_box("write outside the worktree", f"echo pwned > {HOME}/outside")
        machine.fail(f"test -e {HOME}/outside")

        in_box("write ~/.bashrc", f"echo pwned >> {HOME}/.bashrc")
        machine.succeed(f"grep -qx '# original bashrc' {HOME}/.bashrc")
        machine.fail(f"grep -q pwned {HOME}/.bashrc")

        _, output = in_box("read ~/.ssh/id_ed25519", f"cat {HOME}/.ssh/id_ed25519")
        assert "SECRET-PRIVATE-KEY" not in output, "the private key was read from inside the box"

        in_box(
            "create a hook in the common git dir",
            f"mkdir -p {COMMON}/hooks && printf '#!/bin/sh\\ntouch /tmp/hook-ran\\n' > {COMMON}/hooks/pre-commit && chmod +x {COMMON}/hooks/pre-commit",
        )
        machine.fail(f"test -e {COMMON}/hooks/pre-commit")

        in_box("git config --local core.hooksPath", "git config --local core.hooksPath x")
        machine.fail(as_alice(f"git -C {MAIN} config --get core.hooksPath"))

        in_box("write packed-refs", f"echo junk > {COMMON}/packed-refs")
        machine.fail(f"grep -q junk {COMMON}/packed-refs")

        in_box("write through a symlink that points outside", "echo pwned > link-out")
        machine.succeed(f"grep -qx victim {HOME}/victim")

        in_box("write through ..", "echo pwned > ../escaped")
        in_box("write through a longer .. path", f"echo pwned > {WORKTREE}/../../escaped2")
        machine.fail(f"test -e {HOME}/src/escaped")
        machine.fail(f"test -e {HOME}/escaped2")

    with subtest("network rows: only the allowed destinations answer"):
        server.wait_for_unit("web.service")
        server.wait_for_open_port(8080)
        address = machine.succeed("getent ahostsv4 server | head -n1 | cut -d' ' -f1").strip()
        fetch = f"python3 -c 'import urllib.request; urllib.request.urlopen(\"http://{address}:8080/\", timeout=10)'"
        # Control: the server answers the test VM itself, so a failure below is the box's doing.
        machine.succeed(f"curl --silent --fail --max-time 10 --output /dev/null http://{address}:8080/")
        works("connect to an allowed host", fetch, box="net-host", flags=f"--allow-net {address}")
        works("connect to an allowed CIDR", fetch, box="net-cidr", flags=f"--allow-net {address}/32")
        fails("connect to a host that is not allowed", fetch, box="net-other", flags="--allow-net 192.0.2.1")

    with subtest("normal work: a commit in the box lands on the task branch"):
        works(
            "git add and commit",
            "echo boxed > file.txt && git add file.txt && "
            "git -c user.name=Alice -c user.email=alice@example.test commit -qm 'from the box'",
        )
        subject = machine.succeed(as_alice(f"git -C {MAIN} log -1 --format=%s task")).strip()
        assert subject == "from the box", f"the commit did not land on the task branch: {subject!r}"

    with subtest("nothing protected changed, and no hook runs when the host next uses git"):
        assert protected_state() == before, "protected files changed"
        machine.succeed(as_alice(f"git -C {WORKTREE} commit -q --allow-empty -m 'from the host'"))
        machine.fail("test -e /tmp/hook-ran")
  '';
}).overrideTestDerivation (old: {
  # runNixOSTest asks for these already; said here because this test cannot run without them:
  # the box is a KVM guest of the test VM.
  requiredSystemFeatures = pkgs.lib.unique (old.requiredSystemFeatures ++ [ "nixos-test" "kvm" ]);
})
