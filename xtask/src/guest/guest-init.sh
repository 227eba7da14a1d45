#!/bin/bash
# PID 1 on the guest's real root (`cargo xtask guest-test`): a login-session-like system without
# systemd — tmpfs /tmp and /run, /run/user/<uid> for root and `user` — then the host's shares
# (listed in /mnt/harness/shares) and the command agent on the virtio-serial port `agent`.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# Debian's `mount` package is not in the image; busybox's passes the options to the kernel.
mount() { busybox mount "$@"; }
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/user/0 /run/user/1000
chown 1000:1000 /run/user/1000
chmod 700 /run/user/0 /run/user/1000
mount -t tmpfs -o mode=700,uid=1000,gid=1000 tmpfs /run/user/1000
mount -t tmpfs -o mode=700 tmpfs /run/user/0
mount -o remount,rw /
hostname guest
ip link set lo up 2>/dev/null
while read -r tag path mode; do
  [ -n "$tag" ] || continue
  mkdir -p "$path"
  if [ "$mode" = ro ]; then opts=ro,cache=loose; else opts=rw,cache=mmap; fi
  mount -t 9p -o "trans=virtio,version=9p2000.L,msize=512000,$opts" "$tag" "$path" ||
    echo "guest-init: cannot mount share $tag at $path"
done < /mnt/harness/shares
exec python3 /mnt/harness/agent.py
