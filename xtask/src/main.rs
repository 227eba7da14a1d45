//! Development automation: `cargo xtask <task>`.
//!
//! Tasks:
//! - `nix-check`: what this build machine can prove about the Nix flake (DESIGN §5): every
//!   `.nix` file parses and passes `deadnix` and `nixpkgs-fmt`, the flake's outputs have the
//!   expected structure when evaluated offline against the stand-in inputs in
//!   `tests/nix-eval/`, and the NixOS / home-manager modules evaluate. Builds and VM tests
//!   need a machine with a current Nix and KVM (docs/nix.md).

mod nix_check;

use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  nix-check   parse, lint and evaluate the Nix flake offline (see docs/nix.md)

environment:
  SANDBOX_NIXPKGS_LIB  a nixpkgs or nixpkgs.lib checkout; nix-check then also evaluates the
                       modules with the real module system (skipped when unset)
  CI=true              a missing tool is an error instead of a skipped step";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("nix-check") if args.len() == 1 => match nix_check::run() {
            Ok(summary) if summary.failed == 0 => ExitCode::SUCCESS,
            Ok(_) => ExitCode::FAILURE,
            Err(err) => {
                eprintln!("error: nix-check could not run: {err:#}");
                ExitCode::FAILURE
            }
        },
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
