//! `cargo xtask soak [--rounds N] [--hogs H] [-- ARGS…]`: the workspace's whole test suite
//! (`cargo test --workspace --locked ARGS…`), N times in a row, beside H CPU hogs, stopping
//! at the first round that fails and naming it.
//!
//! Why: the races between starting a command and signalling it (issue 34) showed about once
//! in sixty rounds, and only under load; one green run of the suite on an idle machine says
//! little about them. The tests are built once before the hogs start, so every round times
//! the same thing: running the suite.
//!
//! Each hog is a `yes >/dev/null` of ours, killed and reaped by its pid when the soak ends (a
//! failed round and a panic included); a Ctrl-C reaches them too (the terminal's foreground
//! group). (Hogs that were shells stopping their own `yes` when a pipe closed leaked a running
//! `yes` now and then beside the suite: a direct child is simpler and always stopped.)

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use xshell::{cmd, Shell};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub rounds: u32,
    pub hogs: u32,
    /// Passed on to `cargo test` (a filter, `--test-threads`…).
    pub test_args: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            rounds: 10,
            hogs: 2,
            test_args: Vec::new(),
        }
    }
}

/// `--rounds N`, `--hogs H`, then `--` and what goes to `cargo test`.
pub fn parse(args: &[String]) -> Result<Options> {
    let mut options = Options::default();
    let mut rest = args.iter();
    while let Some(flag) = rest.next() {
        let number = |value: Option<&String>| -> Result<u32> {
            let value = value.with_context(|| format!("{flag} needs a number"))?;
            value
                .parse()
                .with_context(|| format!("{flag} {value}: not a number"))
        };
        match flag.as_str() {
            "--rounds" => options.rounds = number(rest.next())?,
            "--hogs" => options.hogs = number(rest.next())?,
            "--" => {
                options.test_args = rest.cloned().collect();
                break;
            }
            other => bail!("unknown argument {other:?}"),
        }
    }
    if options.rounds == 0 {
        bail!("--rounds 0: nothing to soak");
    }
    Ok(options)
}

/// CPU hogs: `yes` processes of ours, stopped by their pid (killed and reaped) when dropped —
/// after the last round, on a failure, on a panic.
struct Hogs(Vec<Hog>);

struct Hog {
    child: Child,
    /// The pid of the hog's `yes`.
    yes: u32,
}

impl Hogs {
    fn start(n: u32) -> Result<Hogs> {
        let mut hogs = Hogs(Vec::new());
        for _ in 0..n {
            let child = Command::new("yes")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .context("starting a CPU hog (yes >/dev/null)")?;
            let yes = child.id();
            hogs.0.push(Hog { child, yes });
        }
        Ok(hogs)
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for hog in &mut self.0 {
            // Child::kill signals this child's pid (SIGKILL), which is still ours until the
            // wait below reaps it.
            let _ = hog.child.kill();
            let _ = hog.child.wait();
        }
    }
}

/// Runs the soak; `Ok(false)` when a round failed (it said which).
pub fn run(root: &Path, options: &Options) -> Result<bool> {
    let sh = Shell::new()?;
    sh.change_dir(root);
    let args = &options.test_args;
    eprintln!("soak: building the tests (cargo test --workspace --locked --no-run)");
    cmd!(sh, "cargo test --workspace --locked --no-run")
        .run()
        .context("building the tests")?;
    let hogs = Hogs::start(options.hogs)?;
    let pids: Vec<String> = hogs.0.iter().map(|h| h.yes.to_string()).collect();
    eprintln!(
        "soak: {} round(s) of cargo test --workspace --locked {} beside {} CPU hog(s) (yes: {})",
        options.rounds,
        args.join(" "),
        hogs.0.len(),
        pids.join(" ")
    );
    let mut times = Vec::new();
    for round in 1..=options.rounds {
        let started = Instant::now();
        let result = cmd!(sh, "cargo test --workspace --locked {args...}").run();
        let took = started.elapsed();
        if let Err(e) = result {
            eprintln!(
                "soak: round {round} of {} FAILED after {} ({e}); {} round(s) passed before it",
                options.rounds,
                seconds(took),
                round - 1
            );
            return Ok(false);
        }
        eprintln!(
            "soak: round {round} of {} passed in {}",
            options.rounds,
            seconds(took)
        );
        times.push(took);
    }
    drop(hogs);
    times.sort();
    eprintln!(
        "soak: {} round(s) passed beside {} CPU hog(s); a round took {} to {} (median {})",
        options.rounds,
        options.hogs,
        seconds(times[0]),
        seconds(times[times.len() - 1]),
        seconds(times[times.len() / 2])
    );
    Ok(true)
}

fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn defaults_are_ten_rounds_beside_two_hogs() {
        assert_eq!(parse(&[]).unwrap(), Options::default());
        assert_eq!(
            parse(&args(&[
                "--rounds",
                "3",
                "--hogs",
                "0",
                "--",
                "-p",
                "sandbox-exec"
            ]))
            .unwrap(),
            Options {
                rounds: 3,
                hogs: 0,
                test_args: args(&["-p", "sandbox-exec"]),
            }
        );
    }

    #[test]
    fn bad_arguments_are_refused() {
        for bad in [
            &["--rounds"][..],
            &["--rounds", "many"],
            &["--rounds", "0"],
            &["--hogs", "-1"],
            &["--soak"],
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad:?}");
        }
    }

    /// A hog runs until dropped, and its `yes` goes with it.
    #[test]
    fn hogs_stop_when_dropped() {
        let hogs = Hogs::start(1).unwrap();
        let yes = hogs.0[0].yes as i32;
        assert!(sandbox_testkit::alive(yes));
        drop(hogs);
        // Killed and reaped by the drop: the pid is gone, not a zombie.
        assert!(
            !std::path::Path::new(&format!("/proc/{yes}")).exists() || !sandbox_testkit::alive(yes),
            "the hog's yes ({yes}) survived"
        );
    }
}
