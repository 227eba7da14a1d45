# BoxLite's runtime files (the shim, the guest agent, libkrunfw, e2fsprogs, bwrap) for the
# `boxlite` crate the CLI is built with, taken from the PyPI wheel of the same version, as
# `cargo xtask boxlite-runtime` does (xtask/src/boxlite_runtime.rs): the wheel's one native
# module carries them as payloads at fixed offsets, so each is cut out by offset and length and
# checked against its own sha256 (with `dd`, see `cut`). Nothing is run and no Python is
# imported.
#
# The wheel is a fixed-output fetch with its pinned hash; the offsets, sizes and hashes are
# those of crates/sandbox-boxlite/src/runtime_files.rs (`cargo xtask nix-check` compares the
# two). Only the x86_64 Linux wheel is pinned.
#
# Three of the files are host programs linked against a conventional /lib64 (bwrap, debugfs,
# mke2fs), which NixOS does not have; they are checked first, then given Nix's dynamic loader
# and library path with patchelf (nothing else in them changes), so their final hashes differ
# from the pins: `passthru.patched` names them. The rest (the static shim, guest agent and guest
# tools, and libkrunfw) are the pinned bytes.
{ lib, stdenv, runCommand, fetchurl, unzip, patchelf, glibc, libcap }:
let
  version = "0.10.8";

  # `pip download boxlite==0.10.8 --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64
  # --python-version 3.11 --implementation cp --abi cp311` fetches this file.
  wheelUrl = "https://files.pythonhosted.org/packages/32/37/0ea7c3724bf508403e6d673881ebbc609f2daa401ad295354d53a2a44a6f/boxlite-0.10.8-cp311-cp311-manylinux_2_28_x86_64.whl";
  wheel = fetchurl {
    name = "boxlite-${version}-cp311-cp311-manylinux_2_28_x86_64.whl";
    url = wheelUrl;
    # = passthru.wheelSha256, in hex
    hash = "sha256-v47mStrIVMEoyLxR5nPBZ0jwhABxiSawZvxlFbBWbF4=";
  };

  member = "boxlite/boxlite.cpython-311-x86_64-linux-gnu.so";

  files = [
    { name = "boxlite-guest"; offset = 2762074; size = 21702672; sha256 = "9060428e3ef3d5229b7ec3af9625c2d4aa1096ddfef554ac54d98e82a8f45e72"; }
    { name = "boxlite-shim"; offset = 24464758; size = 28332008; sha256 = "c0d63b75913965a4bb7fdb2a2d70f6b7079ddbdaf0e299d11e13769a51618cda"; }
    { name = "bwrap"; offset = 52796766; size = 166400; sha256 = "301e5e4e943eafc36d56be9748a0c2511a8b8755ccc8e79340a596df7b7db223"; }
    { name = "debugfs"; offset = 52963173; size = 3364296; sha256 = "3ca30fb0fcb80e41aafbe1afb3a792621d4ad788ee164cb8dea57329c1f8e51b"; }
    { name = "guest-mke2fs"; offset = 56327481; size = 560048; sha256 = "7dc5d7d5b99667659c31e1c2482780f350fe7ca035dd6f68a3f954da296a6f62"; }
    { name = "guest-resize2fs"; offset = 56887544; size = 399448; sha256 = "0a2c15cb20fa3e369a02e9712c611037a89236bc52ad109daf02c3d33a19ee97"; }
    { name = "libkrunfw.so.5"; offset = 57287006; size = 21431992; sha256 = "953201c0c367070946a2f99695cb50dbb8980d97e416964bfa3fb1e9d1f15f69"; }
    { name = "mke2fs"; offset = 78719004; size = 2820704; sha256 = "33b1aea6163fde9aadede9876586ca8cf689b904b32b4f5e5c6eaa8a4c2c62ac"; }
  ];

  # Linked against /lib64/ld-linux-x86-64.so.2 with these libraries (readelf -d).
  patched = {
    bwrap = [ glibc libcap ];
    debugfs = [ glibc ];
    mke2fs = [ glibc ];
  };

  # One `dd` per file, no pipe: stdenv runs this body under `set -eu -o pipefail`, and in
  # `tail -c +N … | head -c SIZE` head stops reading early, so tail dies of SIGPIPE (exit 141)
  # and the build aborts. `cargo xtask nix-check` runs this body on the real wheel that way.
  cut = f: ''
    dd if=module.so of="$out/${f.name}" bs=1M iflag=skip_bytes,count_bytes \
      skip=${toString f.offset} count=${toString f.size} status=none
    echo "${f.sha256}  $out/${f.name}" | sha256sum --check --quiet --strict -
    chmod 0555 "$out/${f.name}"
  '';
in
runCommand "boxlite-runtime-${version}"
{
  nativeBuildInputs = [ unzip patchelf ];
  passthru = {
    inherit version wheel wheelUrl member files;
    wheelSha256 = "bf8ee64adac854c128c8bc51e673c16748f08400718926b066fc6515b0566c5e";
    patched = lib.attrNames patched;
  };
  meta = {
    description = "BoxLite ${version}'s runtime files, from the PyPI wheel";
    platforms = [ "x86_64-linux" ];
    # The wheel's payloads: the shim and guest agent are static Rust binaries, libkrunfw
    # carries a Linux kernel; the wheel itself is Apache-2.0.
    license = lib.licenses.asl20;
  };
} ''
  unzip -p ${wheel} ${member} > module.so
  mkdir "$out"
  ${lib.concatMapStrings cut files}
  ${lib.concatStrings (lib.mapAttrsToList (name: libs: ''
    chmod u+w "$out/${name}"
    patchelf --set-interpreter ${stdenv.cc.bintools.dynamicLinker} \
      --set-rpath ${lib.makeLibraryPath libs} "$out/${name}"
    chmod 0555 "$out/${name}"
  '') patched)}
''
