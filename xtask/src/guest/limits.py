#!/usr/bin/python3
"""guest-test's limits part (xtask/src/guest/suite.rs, `limits_part`): the resource limits on
a real cgroup v2 hierarchy, from the attacker's side, with `--backend host` as the control.

    limits.py BIN root           as root, in the root group (v2: groups below /sys/fs/cgroup)
    limits.py BIN user DELEGATED as `user`, in a leaf of DELEGATED, a group delegated to it
                                 the way systemd's user manager gets user@1000.service

As `user` every `sandbox` starts in a fresh scope of its own below DELEGATED, made the way
`systemd-run --user --scope -p Delegate=yes sandbox ...` makes one (a child group the user
creates and moves the new process into), and the scope is removed after it, as systemd does
when a scope's last process is gone: that removal fails if the run left any group behind.

One JSON object a line: {"check": NAME, "ok": BOOL, "summary": TEXT, "detail": TEXT}.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

BIN, MODE = sys.argv[1], sys.argv[2]
DELEGATED = sys.argv[3] if len(sys.argv) > 3 else None
CG = "/sys/fs/cgroup"
PY = "/usr/bin/python3"
WORK = tempfile.mkdtemp(prefix="limits-", dir=os.path.expanduser("~"))
SCOPES = [0]


def emit(check, ok, summary, detail=""):
    print(json.dumps({"check": check, "ok": bool(ok), "summary": summary, "detail": detail}),
          flush=True)


def new_scope():
    """A fresh scope for one sandbox process (as `user`), or None (as root: the root group)."""
    if DELEGATED is None:
        return None
    SCOPES[0] += 1
    path = f"{DELEGATED}/run-{SCOPES[0]}.scope"
    os.mkdir(path)
    return path


def groups_of(scope, pid):
    """The groups a run made: every group below its scope, or (root) the run's named ones."""
    if scope is not None:
        return sorted(p for p, _, _ in os.walk(scope) if p != scope)
    return sorted(glob.glob(f"{CG}/sandbox-{pid}-*"))


def end_scope(scope):
    """Removes the scope as systemd does once it is empty: fails if a group is left in it."""
    if scope is None:
        return None
    left = groups_of(scope, 0)
    try:
        os.rmdir(scope)
    except OSError as e:
        return f"the scope {scope} could not be removed ({e}); left: {left}"
    return None


def spawn(args, scope, **kw):
    def enter():
        if scope is not None:
            with open(f"{scope}/cgroup.procs", "w") as f:
                f.write("0")
    return subprocess.Popen([BIN, "run", "-C", WORK] + args, preexec_fn=enter,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def run(args):
    """One sandbox run in a fresh scope: (exit, stdout, stderr, groups left behind)."""
    scope = new_scope()
    p = spawn(args, scope)
    out, err = p.communicate(timeout=900)
    left = groups_of(scope, p.pid)
    gone = end_scope(scope)
    if gone:
        left.append(gone)
    return p.returncode, out.decode(errors="replace"), err.decode(errors="replace"), left


def text(code, out, err):
    return f"exit {code}\n--- stdout\n{out}--- stderr\n{err}"


def wait_for(path, proc, seconds):
    """Until `path` exists; False when `proc` exits first (a refused run) or in `seconds`."""
    end = time.monotonic() + seconds
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > end:
            return os.path.exists(path)
        time.sleep(0.02)
    return True


def report(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


FORK_LOOP = r"""
import os, time
r, w = os.pipe()
n, err = 0, 0
try:
    while n < 100:
        pid = os.fork()
        if pid == 0:
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        n += 1
except OSError as e:
    err = e.errno
open('count', 'w').write(f'{n} {err}')
open('at-limit', 'w').close()
while not os.path.exists('release'):
    time.sleep(0.02)
"""


def fork_loop(extra):
    for f in ["count", "at-limit", "release"]:
        try:
            os.remove(os.path.join(WORK, f))
        except FileNotFoundError:
            pass
    scope = new_scope()
    p = spawn(extra + ["--", PY, "-c", FORK_LOOP], scope)
    if not wait_for(os.path.join(WORK, "at-limit"), p, 600):
        p.kill()
        out, err = p.communicate()
        return None, text(p.returncode, out.decode(errors="replace"),
                          err.decode(errors="replace")), []
    host_ok = subprocess.run(["/bin/true"]).returncode == 0
    open(os.path.join(WORK, "release"), "w").close()
    out, err = p.communicate(timeout=600)
    left = groups_of(scope, p.pid)
    gone = end_scope(scope)
    if gone:
        left.append(gone)
    n, errno = (int(x) for x in open(os.path.join(WORK, "count")).read().split())
    return (p.returncode, n, errno, host_ok), text(
        p.returncode, out.decode(errors="replace"), err.decode(errors="replace")), left


def check_pids():
    control, ctext, _ = fork_loop(["--backend", "host"])
    rpath = os.path.join(WORK, "pids.json")
    limited, ltext, left = fork_loop(["--pids", "16", "--report-json", rpath])
    rep = report(rpath)
    usage = rep.get("limits", {}).get("usage", {})
    problems = []
    if control is None or control[1:3] != (100, 0):
        problems.append("control: the host backend's loop did not reach 100 forks")
    if limited is None:
        problems.append("the limited loop never finished")
    else:
        code, n, errno, host_ok = limited
        if code != 0:
            problems.append(f"exit {code}")
        if not n < 16:
            problems.append(f"forked {n} times under --pids 16")
        if errno != 11:
            problems.append(f"errno {errno}, not EAGAIN")
        if not host_ok:
            problems.append("the host could not start a process at the run's limit")
        if "reached its process limit (16 processes, cgroup v2" not in ltext:
            problems.append("no 'reached its process limit (16 processes, cgroup v2' notice")
        if not (usage.get("pidsLimitHits") or 0) >= 1:
            problems.append("report: no pidsLimitHits")
        peak = usage.get("peakProcesses")
        if peak is not None and not n <= peak <= 16:
            problems.append(f"report: peakProcesses {peak} outside {n}..16")
    if left:
        problems.append(f"groups left behind: {left}")
    summary = (f"fork loop stopped at {limited[1]} (EAGAIN) under --pids 16, control 100; "
               f"peakProcesses {usage.get('peakProcesses')}; no group left"
               if not problems else "; ".join(problems))
    emit("pids", not problems, summary, f"{ltext}\n--- report\n{json.dumps(rep)}\n"
         f"--- control\n{ctext}")


ALLOCATE = r"""
blocks = []
for _ in range(128):
    b = bytearray(1 << 20)
    for i in range(0, len(b), 4096):
        b[i] = 1
    blocks.append(b)
print('allocated')
"""


def check_memory():
    ccode, cout, cerr, _ = run(["--backend", "host", "--", PY, "-c", ALLOCATE])
    outside = subprocess.Popen(["/bin/sleep", "600"])
    rpath = os.path.join(WORK, "memory.json")
    code, out, err, left = run(["--memory", "32M", "--report-json", rpath, "--",
                                PY, "-c", ALLOCATE])
    outside_alive = outside.poll() is None
    outside.kill()
    outside.wait()
    rep = report(rpath)
    usage = rep.get("limits", {}).get("usage", {})
    problems = []
    if ccode != 0 or "allocated" not in cout:
        problems.append("control: the host backend's loop did not complete")
    if code != 137:
        problems.append(f"exit {code}, not 137")
    if "allocated" in out:
        problems.append("the loop completed")
    if "hit the memory limit (32 MiB, cgroup v2" not in err:
        problems.append("no 'hit the memory limit (32 MiB, cgroup v2' message")
    if not outside_alive:
        problems.append("the process outside the run was killed")
    if not (usage.get("oomKills") or 0) >= 1:
        problems.append("report: no oomKills")
    peak = usage.get("peakMemoryBytes")
    if peak is None or not (8 << 20) < peak <= (32 << 20):
        problems.append(f"report: peakMemoryBytes {peak} not within 8..32 MiB")
    if left:
        problems.append(f"groups left behind: {left}")
    summary = (f"allocation loop killed at --memory 32M (137, the message), outside kept "
               f"running; peakMemoryBytes {peak}, oomKills {usage.get('oomKills')}; "
               f"no group left" if not problems else "; ".join(problems))
    emit("memory", not problems, summary,
         f"{text(code, out, err)}\n--- report\n{json.dumps(rep)}\n--- control\n"
         f"{text(ccode, cout, cerr)}")


CPU_HOG = r"""
import os, time
t0 = time.monotonic()
c0 = os.times()
x = 0
for i in range(3_000_000):
    x += i
c1 = os.times()
wall = time.monotonic() - t0
cpu = (c1.user - c0.user) + (c1.system - c0.system)
print(f'ratio {cpu / wall:.3f} cpu {cpu:.3f} wall {wall:.3f}')
"""


def ratio(out):
    try:
        return float(out.split()[1])
    except (IndexError, ValueError):
        return None


def check_cpu():
    rpath = os.path.join(WORK, "cpu.json")
    code, out, err, left = run(["--cpus", "0.5", "--report-json", rpath, "--",
                                PY, "-c", CPU_HOG])
    ccode, cout, cerr, _ = run(["--backend", "host", "--", PY, "-c", CPU_HOG])
    limited, free = ratio(out), ratio(cout)
    throttled = report(rpath).get("limits", {}).get("usage", {}).get("cpuThrottledPeriods")
    problems = []
    if code != 0 or limited is None:
        problems.append(f"the limited hog: exit {code}")
    elif limited > 0.65:
        problems.append(f"--cpus 0.5 gave {limited} of a core")
    elif free is not None and free > 0.8:
        # Only where the unlimited hog got most of a core is the limit what held it back.
        if not (throttled or 0) > 0:
            problems.append("the kernel never throttled the run")
        if limited < 0.3:
            problems.append(f"far below the limit: {limited}")
    if free is None:
        problems.append("control: no ratio")
    if left:
        problems.append(f"groups left behind: {left}")
    summary = (f"--cpus 0.5 gave {limited} of a core ({throttled} periods throttled), "
               f"unlimited {free}; no group left" if not problems else "; ".join(problems))
    emit("cpu", not problems, summary,
         f"{text(code, out, err)}\n--- control\n{text(ccode, cout, cerr)}")


def check_killed():
    """A SIGKILLed sandbox leaves its groups; the next run (in another scope) removes them."""
    started = os.path.join(WORK, "started")
    try:
        os.remove(started)
    except FileNotFoundError:
        pass
    scope = new_scope()
    p = spawn(["--pids", "50", "--", "sh", "-c", "touch started; exec sleep 600"], scope)
    problems = []
    if not wait_for(started, p, 600):
        p.kill()
        out, err = p.communicate()
        emit("killed", False, "the run never started",
             text(p.returncode, out.decode(errors="replace"), err.decode(errors="replace")))
        end_scope(scope)
        return
    groups = groups_of(scope, p.pid)
    if not groups:
        problems.append("the live run has no group")
    p.kill()
    p.wait()
    kept = [g for g in groups if os.path.isdir(g)]
    if kept != groups:
        problems.append(f"the kill itself removed groups (the test shows nothing): {groups}")
    code, out, err, left = run(["--", "true"])
    still = [g for g in groups if os.path.exists(g)]
    if code != 0:
        problems.append(f"the next run: exit {code}")
    if still:
        problems.append(f"the next run did not remove the killed run's groups: {still}")
    if left:
        problems.append(f"the next run left groups: {left}")
    gone = end_scope(scope)
    if gone:
        problems.append(gone)
    summary = (f"SIGKILLed run's {len(groups)} group(s) removed by the next run: "
               f"{[g.rsplit('/', 1)[-1] for g in groups]}" if not problems
               else "; ".join(problems))
    emit("killed", not problems, summary, text(code, out, err))


def check_not_in_a_scope():
    """As `user`, in the session's leaf (which holds the caller too): no group to use.

    `--memory` has no other mechanism, so it is refused (125) and says which one is missing;
    `--pids` is held by RLIMIT_NPROC in the command's own user namespace (Linux 5.14 and
    later count it per namespace), so the fork loop stops at the limit with no group at all.
    """
    p = subprocess.run([BIN, "run", "-C", WORK, "--memory", "32M", "--", "true"],
                       capture_output=True)
    err = p.stderr.decode(errors="replace")
    problems = []
    if p.returncode != 125 or "--memory 32 MiB (flag) cannot be enforced" not in err:
        problems.append(f"--memory outside a scope: exit {p.returncode}, not refused (125)")
    detail = text(p.returncode, p.stdout.decode(errors="replace"), err)
    for f in ["count", "at-limit", "release"]:
        try:
            os.remove(os.path.join(WORK, f))
        except FileNotFoundError:
            pass
    rpath = os.path.join(WORK, "noscope.json")
    loop = spawn(["--pids", "16", "--report-json", rpath, "--", PY, "-c", FORK_LOOP], None)
    if not wait_for(os.path.join(WORK, "at-limit"), loop, 600):
        loop.kill()
        problems.append("--pids outside a scope: the fork loop never reached its end")
    open(os.path.join(WORK, "release"), "w").close()
    out, lerr = loop.communicate(timeout=600)
    detail += "\n" + text(loop.returncode, out.decode(errors="replace"),
                          lerr.decode(errors="replace"))
    try:
        n, errno = (int(x) for x in open(os.path.join(WORK, "count")).read().split())
    except (OSError, ValueError):
        n, errno = None, None
    if loop.returncode != 0 or n is None or not n < 16 or errno != 11:
        problems.append(f"--pids 16 outside a scope: exit {loop.returncode}, "
                        f"forked {n} (errno {errno})")
    plan = report(rpath).get("limits", {}).get("plan", {}).get("enforced", [])
    mech = next((e.get("mechanism") for e in plan if e.get("controller") == "pids"), None)
    if mech != "rlimit-nproc":
        problems.append(f"--pids outside a scope held by {mech!r}, not rlimit-nproc")
    refusal = next((line.strip() for line in err.splitlines() if "cannot be enforced" in line),
                   err.strip()[:200])[:200]
    summary = (f"outside a scope of its own: --memory refused (125: {refusal}); --pids 16 "
               f"held by RLIMIT_NPROC (fork loop stopped at {n}, EAGAIN)"
               if not problems else "; ".join(problems))
    emit("no-scope", not problems, summary, detail)


def main():
    for check in [check_pids, check_memory, check_cpu, check_killed]:
        try:
            check()
        except Exception as e:  # noqa: BLE001 - one check's failure is its line
            emit(check.__name__[6:], False, f"ERROR {e!r}")
    if MODE == "user":
        check_not_in_a_scope()


main()
