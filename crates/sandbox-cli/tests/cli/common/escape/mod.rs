//! The escape suite: attacks run from inside a sandbox against a real git repository with a
//! linked worktree, each judged from the outside by its effect (a file that must not exist,
//! a process that must still live, a listener that must not have been reached).
//!
//! The same attacks run under `--backend host` as a control: there they must succeed, which
//! proves each check can fail. A backend passes when every attack is blocked (or, for the
//! git pointers, repaired and reported) and every piece of normal work still succeeds.
//!
//! One file per family of attacks (`file`, `git_code`, `git_formats`, `hostfiles`, `process`,
//! `killed`, `network`, `net`, `device`, `pointer`, `store`, `socket`, `home`), in the order [`attacks`] runs them; beside them the
//! harness (`harness`: an [`Attack`] and its [`Verdict`], the judges), the repository every
//! attack runs against (`fixture`), and the normal work that must still succeed (`work`).

mod device;
mod file;
mod fixture;
mod git_code;
mod git_formats;
mod harness;
mod home;
mod hostfiles;
mod killed;
mod net;
mod network;
mod pointer;
mod process;
mod socket;
mod store;
mod work;

pub use device::TERMINAL_DEVICE_MODE;
pub use file::READ_SHADOW;
pub use fixture::{
    git, host_git, nouserns_unavailable, rev_parse, unique, Fixture, DAEMON, NATIVE_NOUSERNS,
    NOUSERNS_WRAPPER,
};
pub use harness::Verdict;
pub use home::{race, ATTACKER, SWAP_HOME_DIR};
pub use killed::{exits_within, OUTLIVES_KILLED_SANDBOX};
pub use net::{ALLOWED_PORT_ELSEWHERE, FAST_OPEN, LISTEN_WITHOUT_BIND, RAW_SOCKET};
pub use store::{HEAD_ON_A_FUTURE_BRANCH, HEAD_PARKED_THEN_KILLED, REPLACE_OBJECT, SHADOW_REF};
pub use work::{do_work, has_quarantine, normal_work};

use std::path::Path;

use device::device_attacks;
use file::file_attacks;
use git_code::git_code_attacks;
use git_formats::git_formats_attacks;
use harness::Attack;
use home::home_attacks;
use hostfiles::hostfiles_attacks;
use killed::killed_attacks;
use net::net_attacks;
use network::network_attacks;
use pointer::pointer_attacks;
use process::process_attacks;
use socket::socket_attacks;
use store::store_attacks;

/// Every attack of the suite, family by family.
pub fn attacks() -> Vec<Attack> {
    [
        file_attacks(),
        git_code_attacks(),
        git_formats_attacks(),
        hostfiles_attacks(),
        process_attacks(),
        killed_attacks(),
        network_attacks(),
        net_attacks(),
        device_attacks(),
        pointer_attacks(),
        store_attacks(),
        socket_attacks(),
        home_attacks(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// One attack's verdict under each backend, and the seconds the row took (all backends).
pub type Row = (String, Vec<Verdict>, f64);

/// Runs every attack and every piece of work under each backend; returns the table rows.
pub fn run_suite(backends: &[&str]) -> Vec<Row> {
    let mut rows = Vec::new();
    // `SANDBOX_ESCAPE_ONLY=<text>|<text>`: only the attacks whose name contains one of them
    // (a quick look at some rows while working on them; the full table is what counts).
    let only = std::env::var("SANDBOX_ESCAPE_ONLY").unwrap_or_default();
    let picked = |name: &str| only.split('|').any(|part| name.contains(part));
    for attack in attacks().into_iter().filter(|a| picked(a.name)) {
        let started = std::time::Instant::now();
        let mut verdicts = Vec::new();
        for backend in backends {
            let verdict = match attack.needs {
                Some(tool) if !Path::new(tool).exists() => {
                    Verdict::Skipped("tool", format!("{tool} missing"))
                }
                _ => (attack.run)(&Fixture::new(), backend),
            };
            verdicts.push(verdict);
        }
        rows.push((
            attack.name.to_string(),
            verdicts,
            started.elapsed().as_secs_f64(),
        ));
    }
    rows
}

/// Prints the table, one column per backend, and the row's seconds (where the time goes in
/// an emulated guest, whose budget is fixed).
pub fn print_table(backends: &[&str], rows: &[Row]) {
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(10);
    let columns: Vec<usize> = backends.iter().map(|b| b.len().max(10)).collect();
    let mut header = format!("{:width$}", "attack");
    for (b, w) in backends.iter().zip(&columns) {
        header.push_str(&format!("  {b:>w$}"));
    }
    header.push_str("  seconds");
    crate::common::report(header);
    for (name, verdicts, seconds) in rows {
        let mut line = format!("{name:width$}");
        for (v, w) in verdicts.iter().zip(&columns) {
            line.push_str(&format!("  {:>w$}", v.short()));
        }
        line.push_str(&format!("  {seconds:7.1}"));
        crate::common::report(line);
    }
}
