# The escape suite, run for real in a NixOS VM with the module enabled, under the native
# backend and under the nono backend with the nono the package was built with (its wrapper's
# SANDBOX_PACKAGE_NONO; nothing else provides a nono in this VM).
#
# An unprivileged user works in a linked git worktree. Every escape attempt runs under
# `sandbox run --backend B -- sh -c '…'`; it must fail *after* the sandboxed command started
# (so a sandbox that cannot start proves nothing) and the damage is then looked for from
# outside. Normal work (git add and commit in the worktree, writing $TMPDIR) must succeed.
{ self, pkgs }:
pkgs.testers.runNixOSTest {
  name = "sandbox-escape";
  globalTimeout = 20 * 60;

  nodes.machine = { pkgs, ... }: {
    imports = [ self.nixosModules.default ];
    programs.sandbox = {
      enable = true;
      settings.backend = "native";
    };
    users.users.alice.isNormalUser = true;
    environment.systemPackages = [ pkgs.git pkgs.curl ];
    virtualisation.memorySize = 1024;
  };

  testScript = ''
    import json
    import shlex

    HOME = "/home/alice"
    MAIN = f"{HOME}/src/repo"
    COMMON = f"{MAIN}/.git"
    WORKTREE = f"{HOME}/src/task"


    def as_alice(script):
        return "su --login alice --command " + shlex.quote(script)


    def sandboxed(script, flags=""):
        # A marker printed first tells "the sandbox ran the command and it failed" apart from
        # "the sandbox never started" (exit 125), which would prove nothing.
        inner = "echo SANDBOX-STARTED; " + script
        return as_alice(f"cd {WORKTREE} && sandbox run {flags} -- sh -c {shlex.quote(inner)} 2>&1")


    def escape_fails(what, script, flags=""):
        status, output = machine.execute(sandboxed(script, flags))
        machine.log(f"[{flags}] [{what}] exit {status}: {output}")
        assert "SANDBOX-STARTED" in output, f"{what}: the sandboxed command never ran (exit {status}): {output}"
        assert status not in (0, 125), f"{what}: exit {status}, the attempt was not stopped: {output}"
        return output


    def works(what, script, flags=""):
        output = machine.succeed(sandboxed(script, flags))
        assert "SANDBOX-STARTED" in output, f"{what}: no marker in {output!r}"
        return output


    def protected_state():
        # Everything an escape could change, hashed from outside the sandbox.
        return machine.succeed(
            f"cd {COMMON} && find config hooks info packed-refs -type f 2>/dev/null | sort | xargs -r sha256sum; "
            f"sha256sum {HOME}/.bashrc {HOME}/victim {HOME}/.ssh/id_ed25519"
        )


    machine.wait_for_unit("multi-user.target")
    machine.succeed("grep -qw landlock /sys/kernel/security/lsm")

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

    def file_escapes(backend):
        flags = f"--backend {backend}"
        escape_fails("write outside the worktree", f"echo pwned > {HOME}/outside", flags)
        machine.fail(f"test -e {HOME}/outside")

        escape_fails("write ~/.bashrc", 'echo pwned >> "$HOME/.bashrc"', flags)
        machine.succeed(f"grep -qx '# original bashrc' {HOME}/.bashrc")
        machine.fail(f"grep -q pwned {HOME}/.bashrc")

        output = escape_fails("read ~/.ssh/id_ed25519", 'cat "$HOME/.ssh/id_ed25519"', flags)
        assert "SECRET-PRIVATE-KEY" not in output, f"{backend}: the private key was read from inside the sandbox"

        escape_fails(
            "create a hook in the common git dir",
            f"printf '#!/bin/sh\\ntouch /tmp/hook-ran\\n' > {COMMON}/hooks/pre-commit && chmod +x {COMMON}/hooks/pre-commit",
            flags,
        )
        machine.fail(f"test -e {COMMON}/hooks/pre-commit")

        escape_fails("git config --local core.hooksPath", "git config --local core.hooksPath x", flags)
        machine.fail(as_alice(f"git -C {MAIN} config --get core.hooksPath"))

        escape_fails("write packed-refs", f"echo junk > {COMMON}/packed-refs", flags)
        machine.fail(f"grep -q junk {COMMON}/packed-refs")

        escape_fails("write through a symlink that points outside", "echo pwned > link-out", flags)
        machine.succeed(f"grep -qx victim {HOME}/victim")

        escape_fails("write through ..", "echo pwned > ../escaped", flags)
        escape_fails("write through a longer .. path", f"echo pwned > {WORKTREE}/../../escaped2", flags)
        machine.fail(f"test -e {HOME}/src/escaped")
        machine.fail(f"test -e {HOME}/escaped2")

    with subtest("escape attempts fail under the native backend"):
        file_escapes("native")

    with subtest("the nono backend uses the package's nono, 0.81.0 or later"):
        report = json.loads(machine.succeed(as_alice(f"cd {WORKTREE} && sandbox doctor --json")))
        nono = [t for t in report["tools"] if t["name"] == "nono"][0]
        assert nono["source"] == "baked" and nono["path"] == "${self.packages.${pkgs.stdenv.hostPlatform.system}.sandbox.toolPaths.SANDBOX_PACKAGE_NONO}", nono
        version = tuple(int(part) for part in nono["version"].split()[-1].split("."))
        assert version >= (0, 81, 0), f"nono {nono['version']} is older than the backend accepts"

    with subtest("escape attempts fail under the nono backend"):
        file_escapes("nono")

    with subtest("network: a port that is not allowed is unreachable under --block-net"):
        machine.succeed("systemd-run --unit=listener ${pkgs.python3.interpreter} -m http.server 8080 --bind 127.0.0.1")
        machine.wait_for_open_port(8080)
        fetch = "curl --silent --fail --max-time 5 --output /dev/null http://127.0.0.1:8080/"
        # Control: the same connection works without --block-net, so a failure below is the
        # sandbox's doing.
        works("connect without --block-net", fetch)
        escape_fails("TCP connect to a port that is not allowed", fetch, flags="--block-net")
        works("connect to an allowed port", fetch, flags="--block-net --allow-port 8080")

    with subtest("normal work succeeds under both backends"):
        for backend in ("native", "nono"):
            flags = f"--backend {backend}"
            works(
                f"git add and commit in the worktree ({backend})",
                f"echo {backend} > file.txt && git add file.txt && git commit -qm 'from the {backend} sandbox'",
                flags,
            )
            subject = machine.succeed(as_alice(f"git -C {MAIN} log -1 --format=%s task")).strip()
            assert subject == f"from the {backend} sandbox", f"the commit did not land on the task branch: {subject!r}"
            works(f"write $TMPDIR ({backend})", 'test -n "$TMPDIR" && echo ok > "$TMPDIR/scratch" && test "$(cat "$TMPDIR/scratch")" = ok', flags)

    with subtest("nothing protected changed, and no hook runs when the host next uses git"):
        assert protected_state() == before, "protected files changed"
        machine.succeed(as_alice(f"git -C {WORKTREE} commit -q --allow-empty -m 'from the host'"))
        machine.fail("test -e /tmp/hook-ran")
  '';
}
