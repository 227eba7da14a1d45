#!/usr/bin/env python3
"""What a pid namespace adds to one native run: unshare(CLONE_NEWPID) beside the user and
mount namespaces, the namespace's init, a proc mount, and the namespace's end.

    python3 crates/sandbox-cli/benches/pidns_cost.py          # as root and as `runuser -u nobody --`

Each round forks a child that unshares user + mount namespaces (as the view does) and forks a
grandchild that mounts a tmpfs and exits; the pid round unshares CLONE_NEWPID too, and its
grandchild (pid 1 of the new namespace) also mounts that namespace's proc. The two kinds of
round alternate, 500 each; the difference of the medians is the pid namespace's cost.
"""
import ctypes
import os
import statistics
import time

CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID = 0x10000000, 0x00020000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_RDONLY, MS_REC, MS_PRIVATE = 2, 4, 8, 1, 0x4000, 1 << 18
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.geteuid(), os.getegid()


def child(pid_namespace):
    flags = CLONE_NEWUSER | CLONE_NEWNS | (CLONE_NEWPID if pid_namespace else 0)
    if libc.unshare(flags) != 0:
        os._exit(2)
    for path, data in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1\n"),
                       ("/proc/self/gid_map", f"{gid} {gid} 1\n")):
        with open(path, "w") as f:
            f.write(data)
    libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None)
    if libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None) != 0:
        os._exit(3)
    os.mkdir("/tmp/proc")
    grandchild = os.fork()
    if grandchild == 0:
        if pid_namespace and libc.mount(b"proc", b"/tmp/proc", b"proc",
                                        MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, None) != 0:
            os._exit(4)
        os._exit(0)
    _, status = os.waitpid(grandchild, 0)
    os._exit(os.waitstatus_to_exitcode(status))


def round_ms(pid_namespace):
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        child(pid_namespace)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"round failed: {os.waitstatus_to_exitcode(status)}")
    return (time.perf_counter() - start) * 1e3


times = {False: [], True: []}
for _ in range(500):
    for kind in (False, True):
        times[kind].append(round_ms(kind))
base, pid = statistics.median(times[False]), statistics.median(times[True])
print(f"view namespaces: {base:.3f} ms; with a pid namespace: {pid:.3f} ms; "
      f"the pid namespace adds {(pid - base) * 1e3:.0f} us (medians of 500)")
