#!/bin/sh
# mmdebstrap customize hook for `cargo xtask guest-test` (xtask/src/guest/mod.rs): runs on the
# host with the new root file system in $1 and the build directory in $2, after the packages are
# installed. Everything it runs inside the root comes from Debian's packages.
#
# - Downloads each suite's kernel package (linux-image-amd64's dependency in that suite) and
#   unpacks it into the root without installing it (no initramfs-tools, no bootloader).
# - Keeps only the modules the guests load (and their dependencies), for a small image.
# - Writes a tiny initramfs ($2/initrd.cpio): busybox, the boot modules of every kernel
#   (decompressed, in load order) and init.sh.
# - Copies each kernel image out ($2/vmlinuz-<release>) and lists them in $2/kernels.
# - Adds the unprivileged user (`user`, uid 1000) the checks run as.
set -eu
root="$1"
build="$2"
suites="$3"
boot_modules="virtio_pci virtio_blk ext4 virtio_console 9p 9pnet_virtio"
keep_modules="$boot_modules overlay fuse virtiofs tun kvm kvm_amd kvm_intel vhost_vsock vsock_loopback"

mkdir -p "$root/var/tmp/kernels"
: > "$build/kernels"
for suite in $suites; do
  meta=$(chroot "$root" apt-cache show "linux-image-amd64/$suite" |
    sed -n 's/^Depends: \(linux-image-[^ ,]*\).*/\1/p' | head -n 1)
  [ -n "$meta" ] || { echo "guest image: no linux-image-amd64 in $suite" >&2; exit 1; }
  chroot "$root" sh -c "cd /var/tmp/kernels && apt-get download -q '$meta/$suite'" 2>&1 |
    grep -v 'unsandboxed' || true
  release=${meta#linux-image-}
  echo "$suite $release" >> "$build/kernels"
done
# Unpacked beside the root, then copied in: the packages of older suites ship /lib, which
# extracting into a merged-/usr root would turn from a symlink into a directory.
mkdir -p "$root/usr/lib/modules"
for deb in "$root"/var/tmp/kernels/*.deb; do
  rm -rf "$build/unpacked"
  dpkg-deb -x "$deb" "$build/unpacked"
  cp -a "$build/unpacked/lib/modules/." "$root/usr/lib/modules/"
  cp "$build/unpacked/boot/"vmlinuz-* "$build/"
done
rm -rf "$root/var/tmp/kernels" "$build/unpacked"

init="$root/var/tmp/initramfs"
mkdir -p "$init/bin" "$init/lib/modules"
cp "$root/bin/busybox" "$init/bin/busybox"
cp "$build/init.sh" "$init/init"
chmod 755 "$init/init"

while read -r suite release; do
  chroot "$root" depmod "$release"
  # The closure of the modules kept, then everything else removed.
  for m in $keep_modules; do
    chroot "$root" modprobe -S "$release" --show-depends "$m" 2>/dev/null || true
  done | sed -n 's/^insmod \([^ ]*\).*/\1/p' | sort -u > "$build/keep"
  (cd "$root" && find "lib/modules/$release/kernel" -name '*.ko*') | sed 's|^|/|' |
    grep -vxF -f "$build/keep" | sed "s|^|$root|" | xargs -r rm -f
  chroot "$root" depmod "$release"
  mkdir -p "$init/lib/modules/$release"
  : > "$init/lib/modules/$release/load"
  for m in $boot_modules; do
    chroot "$root" modprobe -S "$release" --show-depends "$m" 2>/dev/null || true
  done | sed -n 's/^insmod \([^ ]*\).*/\1/p' | awk '!seen[$0]++' | while read -r f; do
    name=${f##*/}
    case "$name" in
      *.xz) chroot "$root" xz -dc "$f" > "$init/lib/modules/$release/${name%.xz}"; name=${name%.xz} ;;
      *.zst) chroot "$root" zstd -qdc "$f" > "$init/lib/modules/$release/${name%.zst}"; name=${name%.zst} ;;
      *) cp "$root$f" "$init/lib/modules/$release/$name" ;;
    esac
    echo "$name" >> "$init/lib/modules/$release/load"
  done
  echo "guest image: $suite kernel $release, boot modules: $(tr '\n' ' ' < "$init/lib/modules/$release/load")"
done < "$build/kernels"

chroot "$root" sh -c 'cd /var/tmp/initramfs && find . | cpio --quiet -o -H newc' > "$build/initrd.cpio"
rm -rf "$init"

chroot "$root" useradd --create-home --uid 1000 --shell /bin/bash user
mkdir -p "$root/mnt/harness"
echo guest > "$root/etc/hostname"
