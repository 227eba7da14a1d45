//! Development automation: `cargo xtask <task>`.
//!
//! Tasks:
//! - `nix-check`: what this build machine can prove about the Nix flake (docs/nix.md: no nixpkgs fetch, no KVM guest): every
//!   `.nix` file parses and passes `deadnix` and `nixpkgs-fmt`, the flake's outputs have the
//!   expected structure when evaluated offline against the stand-in inputs in
//!   `tests/nix-eval/`, and the NixOS / home-manager modules evaluate. Builds and VM tests
//!   need a machine with a current Nix and KVM (docs/nix.md).
//! - `nix-breakage`: breaks scratch copies of the flake in the ways `nix-check` must catch
//!   and shows that it fails on each.
//! - `box-image`: the BoxLite backend's offline image, an OCI image layout directory built
//!   from Debian packages (`box_image`).
//! - `boxlite-runtime`: BoxLite's runtime files (shim, guest agent, libkrunfw, e2fsprogs) cut
//!   out of the pinned PyPI wheel, each checked against its pinned sha256
//!   (`boxlite_runtime.rs` has the recipe, docs/boxlite.md the why).
//! - `guest-test`: Debian's kernels (5.10, 6.1, 6.12) booted under QEMU's software emulation,
//!   the native backend's checks run inside each (`guest/`), and the Lima backend's guest side
//!   on virtiofs with its provisioning replayed (`guest/lima.rs`).
//! - `guest-boxlite`: the BoxLite tests that need a booted box, inside a TCG guest with nested
//!   KVM (`guest/boxlite.rs`).
//! - `lima-install`, `lima-image`, `lima-test`: the real Lima — `limactl` built from Lima's Go
//!   module, a Debian guest made with mmdebstrap, and the Lima backend end to end on a VM that
//!   `limactl` boots (`lima/`).
//! - `soak`: the whole workspace suite, round after round, beside CPU hogs (`soak.rs`): the
//!   races that only show under load.

mod box_image;
mod boxlite_runtime;
mod breakage;
mod guest;
mod lima;
mod nix_builders;
mod nix_check;
mod soak;
mod sources;

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  nix-check      parse, lint and evaluate the Nix flake offline (see docs/nix.md)
  nix-breakage   break scratch copies of the flake and show that nix-check fails on each
  boxlite-runtime [--out DIR] [--wheel FILE]
                 BoxLite's runtime files from the pinned wheel (default target/boxlite-runtime)
  box-image [--out DIR]
                 build the box image: an OCI image layout directory of a small Debian
                 userland (mmdebstrap); default DIR target/box-image; prints DIR
  guest-test [--kernel SUITE]... [--quick | --full] [--no-lima | --lima]
             [--no-limits | --limits]
                 boot Debian kernels (suites bullseye, bookworm, bookworm-backports) under
                 QEMU (TCG) and run the native backend's checks in each, as root and as a
                 user (xtask/src/guest/); the escape suite as the user in bookworm's 6.1
                 (--full: everywhere, as both; --quick: nowhere); reports per kernel. First
                 the Lima part: a view's virtiofs mounts served by virtiofsd as Lima serves
                 them, the generated provisioning replayed inside, git's workflow there and
                 the host's import (--lima: only that; --no-lima: without it; needs the Rust
                 virtiofsd: SANDBOX_VIRTIOFSD, PATH, or Lima's vhost-user descriptions).
                 Last in the 6.12 boot the limits part: cgroup v2 mounted and delegated to
                 the user as systemd does, --pids/--memory/--cpus and the groups' removal
                 as root and as the user in a scope of its own (--limits: only that, one
                 boot; --no-limits: without it)
  guest-boxlite [--only PART]... [--cli-filter 'boxlite::NAME...'] [--shell SCRIPT]...
                 boot Debian 12 backports' 6.12 under QEMU (TCG, -cpu max) with nested KVM
                 and run the BoxLite tests that need a booted box inside it (parts: probe,
                 doctor, engine, cli, bench; needs boxlite-runtime and box-image first)
  lima-install [--prefix DIR]
                 build limactl and Lima's guest agent from Lima's Go module at the pinned
                 release (go mod download, checked against the pinned hash) into DIR (default
                 /var/cache/sandbox-lima/lima-VERSION as root, else ~/.cache/sandbox-lima/...),
                 unless the same build is there; print the versions Lima runs with
  lima-image     build the Lima guest image: Debian 12 from Debian's packages (mmdebstrap),
                 an EFI-bootable qcow2, cached by its inputs beside lima-install's; prints
                 its path and digest (for SANDBOX_LIMA_IMAGE)
  lima-test [--keep]
                 the Lima backend against the real limactl: lima-install, lima-image, then as
                 an unprivileged user (sbxlima under root) sandbox run --backend lima in a
                 linked worktree boots one VM (QEMU under TCG where /dev/kvm runs no guest)
                 and the checks of docs/lima.md run on it; the VM is deleted at the end
                 (--keep: left running)
  soak [--rounds N] [--hogs H] [-- ARGS...]
                 build the tests, then run `cargo test --workspace --locked ARGS` N times
                 in a row (default 10) beside H CPU hogs (default 2; `yes`, stopped by pid
                 at the end, on failure and if xtask dies); stops at the first failing
                 round and names it; prints each round's time

environment:
  SANDBOX_NIXPKGS_LIB  a nixpkgs.lib checkout (a flake with lib/) for the stand-ins' real lib;
                       default ../shared/nixpkgs-lib beside the repository (the evaluation
                       steps are skipped when neither exists)
  SANDBOX_LIMA_CACHE   where lima-install and lima-image keep their builds
  SANDBOX_LIMA_IMAGE_MIRROR
                       the Debian mirror lima-image installs from (default deb.debian.org)
  SANDBOX_BOX_IMAGE_MIRROR
                       the Debian mirror box-image installs from (default
                       http://deb.debian.org/debian)
  CI=true              a missing tool or lib is an error instead of a skipped step";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("nix-check") if args.len() == 1 => {
            let run = |root: PathBuf| {
                let options = nix_check::Options {
                    ci: std::env::var("CI").is_ok_and(|v| v == "true" || v == "1"),
                    quiet: false,
                    evaluation_only: false,
                    builder_scripts: true,
                    lib_base: root.clone(),
                };
                nix_check::run(&root, &options)
            };
            match nix_check::workspace_root().and_then(run) {
                Ok(summary) if summary.failed == 0 => ExitCode::SUCCESS,
                Ok(_) => ExitCode::FAILURE,
                Err(err) => {
                    eprintln!("error: nix-check could not run: {err:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Some("nix-breakage") if args.len() == 1 => match breakage::run() {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(err) => {
                eprintln!("error: nix-breakage could not run: {err:#}");
                ExitCode::FAILURE
            }
        },
        Some("boxlite-runtime") => {
            let mut options = boxlite_runtime::Options {
                out: None,
                wheel: None,
            };
            let mut rest = args[1..].iter();
            while let Some(flag) = rest.next() {
                let value = rest.next().map(PathBuf::from);
                match (flag.as_str(), value) {
                    ("--out", Some(v)) => options.out = Some(v),
                    ("--wheel", Some(v)) => options.wheel = Some(v),
                    _ => {
                        eprintln!("{USAGE}");
                        return ExitCode::from(2);
                    }
                }
            }
            match nix_check::workspace_root().and_then(|r| boxlite_runtime::run(&r, &options)) {
                Ok(_) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("error: boxlite-runtime: {err:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Some("box-image") => match box_image::run(&args[1..]) {
            Ok(_) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("error: box-image: {err:#}");
                ExitCode::FAILURE
            }
        },
        Some("guest-test") => match guest::suite::run(&args[1..]) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(err) => {
                eprintln!("error: guest-test: {err:#}");
                ExitCode::FAILURE
            }
        },
        Some("guest-boxlite") => match guest::boxlite::run(&args[1..]) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(err) => {
                eprintln!("error: guest-boxlite: {err:#}");
                ExitCode::FAILURE
            }
        },
        Some("lima-install") => match lima::install::run(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("error: lima-install: {err:#}");
                ExitCode::FAILURE
            }
        },
        Some("lima-image") => match lima::image::run(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("error: lima-image: {err:#}");
                ExitCode::FAILURE
            }
        },
        Some("lima-test") => match lima::e2e::run(&args[1..]) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(err) => {
                eprintln!("error: lima-test: {err:#}");
                ExitCode::FAILURE
            }
        },
        Some("soak") => {
            let run = |root: PathBuf| {
                let options = soak::parse(&args[1..])?;
                soak::run(&root, &options)
            };
            match nix_check::workspace_root().and_then(run) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(err) => {
                    eprintln!("error: soak: {err:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}
