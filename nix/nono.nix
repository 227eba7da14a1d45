# nono-cli 0.81.0, the version the nono backend requires (crates/sandbox-host/src/nono.rs,
# MIN_VERSION). The pinned nixpkgs carries an older nono, which the backend would refuse.
#
# Built from the crate crates.io serves, the same source `cargo install nono-cli` uses:
#   - the tarball's hash is the sha256 in the crates.io index (`cksum` of nono-cli 0.81.0,
#     26b48f3a…ec03), checked against the downloaded .crate file;
#   - ./nono-Cargo.lock is the Cargo.lock inside that tarball, byte for byte, so every
#     dependency is fetched by nixpkgs' importCargoLock and checked against the sha256 the
#     lock file records: there is no aggregate vendor hash that nobody could verify offline.
# Default features are off, as in CI (`--no-default-features`): the system-keyring feature
# pulls in D-Bus, which the nono backend does not use. nono's own test suite needs a
# writable /usr/bin and a network-capable proxy (nixpkgs' package skips ~60 of its tests),
# so it does not run here; the VM tests run this binary as the nono backend instead.
#
# Built with `toolchain`, the pinned Rust the CLI is built with (nix/packages.nix): nono
# 0.81.0 declares rust-version 1.95, which nixpkgs' rustc need not have.
{ lib, makeRustPlatform, fetchurl, toolchain }:
let
  version = "0.81.0";
  rustPlatform = makeRustPlatform { cargo = toolchain; rustc = toolchain; };
in
rustPlatform.buildRustPackage {
  pname = "nono";
  inherit version;

  src = fetchurl {
    name = "nono-cli-${version}.tar.gz";
    url = "https://crates.io/api/v1/crates/nono-cli/${version}/download";
    hash = "sha256-JrSPOigGUo5Zg8t8jy1Bb2KKH573uPHHTmK2ke017AM=";
  };

  cargoLock.lockFile = ./nono-Cargo.lock;
  buildNoDefaultFeatures = true;
  doCheck = false;

  passthru = { inherit toolchain; };

  meta = {
    description = "Kernel-enforced sandbox for AI agents (the CLI the sandbox nono backend drives)";
    homepage = "https://github.com/nolabs-ai/nono";
    license = lib.licenses.asl20;
    mainProgram = "nono";
    platforms = lib.platforms.linux ++ lib.platforms.darwin;
  };
}
