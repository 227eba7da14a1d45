#!/bin/busybox sh
# The guest's initramfs /init (`cargo xtask guest-test`): loads the boot modules of the running
# kernel, mounts the root disk and the harness share, and hands over to the harness's
# guest-init.sh on the real root.
/bin/busybox --install -s /bin
mkdir -p /proc /sys /dev /newroot
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
release=$(uname -r)
while read -r m; do
  insmod "/lib/modules/$release/$m" || echo "init: insmod $m failed"
done < "/lib/modules/$release/load"
# virtio-blk adds its disk while its module loads; the bound covers a slow emulated probe.
n=0
while [ ! -b /dev/vda ] && [ $n -lt 200 ]; do usleep 50000; n=$((n + 1)); done
mount -t ext4 /dev/vda /newroot || { echo "init: cannot mount /dev/vda"; poweroff -f; }
mount -t 9p -o trans=virtio,version=9p2000.L,ro harness /newroot/mnt/harness ||
  { echo "init: cannot mount the harness share"; poweroff -f; }
umount /proc /sys /dev
exec switch_root /newroot /bin/bash /mnt/harness/guest-init.sh
