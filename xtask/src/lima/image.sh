#!/bin/bash
# A Debian guest for Lima, made offline from Debian's packages (`cargo xtask lima-image`):
# an EFI-bootable qcow2 disk — a GPT with an EFI system partition (systemd-boot, the kernel and
# its initramfs) and an ext4 root — that boots as Lima's QEMU driver boots a cloud image (OVMF,
# cloud-init's NoCloud data source on Lima's cidata disk). No loop device, no root mount: the
# partitions are made as files (mke2fs -d, mkfs.vfat + mtools) and copied into the disk.
#
# usage: image.sh <build dir> <mirror> <package>...
# Leaves <build dir>/lima-debian.qcow2.
set -euo pipefail
build=$1 mirror=$2
shift 2
packages=$(
  IFS=,
  echo "$*"
)
rootfs=$build/rootfs
boot=$build/boot
mkdir -p "$boot"

# The root file system. The kernel is bookworm-backports' 6.12 (the guest-test's Lima part
# proved the git store overlay on virtiofs there); the rest is bookworm.
# shellcheck disable=SC2016 # the hooks' $1 (the root) is mmdebstrap's to expand
mmdebstrap --mode=auto --quiet --variant=apt --format=directory \
  --include="$packages" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook='echo "LABEL=lima-root / ext4 defaults 0 1" >"$1/etc/fstab"' \
  --customize-hook='mkdir -p "$1/etc/cloud/cloud.cfg.d"' \
  --customize-hook='cat >"$1/etc/cloud/cloud.cfg.d/90-lima.cfg" <<EOF
# Lima hands its cloud-init data on a disk labelled cidata (NoCloud); probing any other
# data source only costs time. The network is rendered for systemd-networkd (the NIC is eth0,
# as the network-config of Lima names it: net.ifnames=0 below).
# Lima sets no locale, and the default of Debian needs the locales package and locale-gen.
datasource_list: [NoCloud, None]
locale: false
system_info:
  network:
    renderers: [networkd]
EOF' \
  --customize-hook='chroot "$1" systemctl enable systemd-networkd.service ssh.service >/dev/null 2>&1' \
  --customize-hook='chroot "$1" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer >/dev/null 2>&1' \
  --customize-hook='rm -f "$1"/etc/ssh/ssh_host_*' \
  --customize-hook='echo lima-debian >"$1/etc/hostname"' \
  --customize-hook='cp "$1"/boot/vmlinuz-* "$1"/boot/initrd.img-* '"'$boot'"'/' \
  --customize-hook='cp "$1"/usr/lib/systemd/boot/efi/systemd-bootx64.efi '"'$boot'"'/' \
  bookworm "$rootfs" \
  "deb $mirror bookworm main" "deb $mirror bookworm-backports main"

vmlinuz=$(ls "$boot"/vmlinuz-*)
initrd=$(ls "$boot"/initrd.img-*)

# The EFI system partition: systemd-boot as the removable-media loader OVMF falls back to,
# one entry, no menu.
esp=$build/esp.img
rm -f "$esp"
mkfs.vfat -C -n LIMA-ESP "$esp" $((128 * 1024)) >/dev/null
mmd -i "$esp" ::/EFI ::/EFI/BOOT ::/loader ::/loader/entries
mcopy -i "$esp" "$boot/systemd-bootx64.efi" ::/EFI/BOOT/BOOTX64.EFI
mcopy -i "$esp" "$vmlinuz" ::/vmlinuz
mcopy -i "$esp" "$initrd" ::/initrd.img
printf 'default debian.conf\ntimeout 0\n' >"$build/loader.conf"
printf 'title Debian (Lima guest)\nlinux /vmlinuz\ninitrd /initrd.img\noptions root=LABEL=lima-root ro console=tty0 console=ttyS0,115200 net.ifnames=0\n' \
  >"$build/debian.conf"
mcopy -i "$esp" "$build/loader.conf" ::/loader/loader.conf
mcopy -i "$esp" "$build/debian.conf" ::/loader/entries/debian.conf

# The root partition: the tree and 512 MiB of room (cloud-init's growpart grows the partition
# and the file system to Lima's disk size at first boot).
root=$build/root.img
rm -f "$root"
used=$(du -sm "$rootfs" | cut -f1)
mke2fs -q -F -t ext4 -L lima-root -d "$rootfs" "$root" "$((used + 512))M"

# The disk: GPT, the ESP at 1 MiB, the root after it, the root last so that it can grow.
esp_mib=$(($(stat -c %s "$esp") / 1048576))
root_mib=$(($(stat -c %s "$root") / 1048576))
raw=$build/disk.raw
rm -f "$raw"
truncate -s $((1 + esp_mib + root_mib + 1))M "$raw"
sfdisk --quiet "$raw" <<EOF
label: gpt
start=1MiB, size=${esp_mib}MiB, type=uefi, name=esp
start=$((1 + esp_mib))MiB, size=${root_mib}MiB, type=linux, name=root
EOF
dd if="$esp" of="$raw" bs=1M seek=1 conv=notrunc,sparse status=none
dd if="$root" of="$raw" bs=1M seek=$((1 + esp_mib)) conv=notrunc,sparse status=none
qemu-img convert -f raw -O qcow2 "$raw" "$build/lima-debian.qcow2"
rm -rf "$rootfs" "$raw" "$root" "$esp"
