#!/usr/bin/python3
"""The guest's command agent (`cargo xtask guest-test`, xtask/src/guest/mod.rs).

One JSON object a line each way on the virtio-serial port named `agent`. The agent says
{"ready": true, ...} once, then answers each request in order:

  {"id": N, "argv": [...], "user": "root"|"user", "env": {...}, "cwd": "...", "stdin": "...",
   "timeout": SECONDS}
      -> {"id": N, "exit": CODE|null, "signal": SIG|null, "timed_out": bool, "seconds": S,
          "stdout": "...", "stderr": "..."}
  {"id": N, "op": "poweroff"} -> {"id": N, "poweroff": true}, then the guest powers off.

Byte strings travel as JSON strings of code points 0-255 (latin-1), so any output is lossless.
"""
import json
import os
import pwd
import subprocess
import sys
import time


def find_port(name):
    base = "/sys/class/virtio-ports"
    for entry in os.listdir(base):
        with open(os.path.join(base, entry, "name")) as f:
            if f.read().strip() == name:
                return "/dev/" + entry
    raise SystemExit(f"agent: no virtio-serial port named {name!r}")


def base_env(user):
    pw = pwd.getpwnam(user)
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
        "HOME": pw.pw_dir,
        "USER": user,
        "LOGNAME": user,
        "SHELL": pw.pw_shell,
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "XDG_RUNTIME_DIR": f"/run/user/{pw.pw_uid}",
    }, pw


def run(req):
    user = req.get("user", "root")
    env, pw = base_env(user)
    env.update(req.get("env") or {})
    kwargs = {}
    if pw.pw_uid != 0:
        kwargs.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
    stdin = req.get("stdin")
    start = time.monotonic()
    reply = {"id": req["id"], "exit": None, "signal": None, "timed_out": False}
    try:
        proc = subprocess.run(
            req["argv"],
            env=env,
            cwd=req.get("cwd") or pw.pw_dir,
            input=stdin.encode("latin-1") if stdin is not None else b"",
            capture_output=True,
            timeout=req.get("timeout"),
            start_new_session=True,
            **kwargs,
        )
        out, err, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out, err, code = e.stdout or b"", e.stderr or b"", None
        reply["timed_out"] = True
    except OSError as e:
        out, err, code = b"", f"agent: cannot run {req['argv'][0]}: {e}\n".encode(), 127
    if code is not None and code < 0:
        reply["signal"] = -code
    else:
        reply["exit"] = code
    reply["seconds"] = time.monotonic() - start
    reply["stdout"] = out.decode("latin-1")
    reply["stderr"] = err.decode("latin-1")
    return reply


def main():
    fd = os.open(find_port("agent"), os.O_RDWR)
    reader = os.fdopen(fd, "rb", buffering=0, closefd=False)

    def send(obj):
        data = (json.dumps(obj) + "\n").encode()
        while data:
            data = data[os.write(fd, data):]

    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    send({"ready": True, "kernel": os.uname().release, "uptime": uptime})
    buf = b""
    while True:
        chunk = reader.read(65536)
        if not chunk:
            # The host side is not connected (read gives EOF until it is).
            time.sleep(0.05)
            continue
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if not line.strip():
                continue
            req = json.loads(line)
            if req.get("op") == "poweroff":
                send({"id": req["id"], "poweroff": True})
                os.sync()
                with open("/proc/sysrq-trigger", "w") as f:
                    f.write("o")
                return
            try:
                send(run(req))
            except Exception as e:  # noqa: BLE001 - the host must get an answer
                send({"id": req.get("id"), "exit": None, "signal": None, "timed_out": False,
                      "seconds": 0, "stdout": "", "stderr": f"agent: {e!r}\n"})


if __name__ == "__main__":
    main()
    # PID 1 must not exit: wait for the power-off the sysrq started.
    while True:
        time.sleep(3600)
