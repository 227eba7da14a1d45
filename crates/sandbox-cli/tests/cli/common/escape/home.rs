//! The `home` family: one run of the project attacks the private home that the next run of
//! the same project prepares and mounts (`DESIGN.md` §2: descriptors, not paths, for what the
//! host does in a tree a run can write).
//!
//! The attacker is a run that lives beside the victim's runs and swaps `~/.cache` (the parent
//! of the pip cache's mount point, which every run of a lived-in home needs) for a link to a
//! directory outside every grant, over and over. A host that prepares the mount point by path
//! creates `pip` there when the swap falls between its check of `.cache` and its `mkdir`; one
//! that mounts by path mounts onto the link's target. The host backend has no private home,
//! so it is no control here: the row was run against the code before the descriptors instead
//! (see the commit that added it), where the victim created `<outside>/pip`.

use std::path::Path;
use std::process::{Child, Output};

use super::harness::{Attack, Verdict, MARK};

/// The row's name.
pub const SWAP_HOME_DIR: &str =
    "swap a directory of the private home for a link while the next run prepares it";

/// How many victim runs start while the attacker swaps (the code before the descriptors
/// created the file outside within 16 runs in one try of three, 64 runs take seconds).
const VICTIM_RUNS: usize = 64;

/// The attacker: exchanges `~/.cache` (emptied of the pip mount point) with a link to
/// `argv[1]` and back (`renameat2(RENAME_EXCHANGE)`, one atomic step each way), until
/// `attacker-stop` exists in its working directory; `attacker-ready` says the loop runs.
/// Whatever a victim run left in the way is put aside and the pair made again.
pub const ATTACKER: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
cache = os.path.join(os.environ["HOME"], ".cache").encode()
link = cache + b".link"
out = sys.argv[1].encode()
def exchange():
    return libc.renameat2(-100, cache, -100, link, 2) == 0
def repair(n):
    if not os.path.islink(link):
        if os.path.lexists(link):
            os.rename(link, b"%s.%d" % (link, n))
        os.symlink(out, link)
    if os.path.islink(cache):
        os.unlink(cache)
    if not os.path.isdir(cache):
        os.mkdir(cache)
n = 0
while not os.path.exists("attacker-stop"):
    n += 1
    try:
        os.rmdir(cache + b"/pip")
    except OSError:
        pass
    if not (exchange() and exchange()):
        try:
            repair(n)
        except OSError:
            pass
    if n == 1:
        repair(n)
        open("attacker-ready", "w").close()
"#;

pub(super) fn home_attacks() -> Vec<Attack> {
    vec![Attack {
        name: SWAP_HOME_DIR,
        needs: Some("/usr/bin/python3"),
        run: |f, b| {
            if b == "host" {
                return Verdict::Skipped(
                    "host-has-no-private-home",
                    "the host backend has no private home to prepare; the row ran against the \
                     previous code as its control"
                        .into(),
                );
            }
            let target = f.env.path().join("outside-home-swap");
            std::fs::create_dir_all(&target).unwrap();
            let attacker = |dir: &Path| -> Child {
                f.env
                    .cmd()
                    .current_dir(dir)
                    .args(["run", "--backend", "native", "--", "python3", "-c"])
                    .arg(ATTACKER)
                    .arg(&target)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            };
            let victim = || f.run(b, &[], &format!("echo {MARK}"));
            race(&f.task, &target, attacker, victim)
        },
    }]
}

/// Starts the attacker in `dir`, runs the victim [`VICTIM_RUNS`] times while it swaps, then
/// judges by `target` (empty before): anything in it is an escape. Every victim run must have
/// run or failed closed, saying why.
pub fn race(
    dir: &Path,
    target: &Path,
    attacker: impl FnOnce(&Path) -> Child,
    victim: impl Fn() -> Output,
) -> Verdict {
    let ready = dir.join("attacker-ready");
    let stop = dir.join("attacker-stop");
    let mut child = attacker(dir);
    // Its start, or its end without it: the events the attacker gives.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !ready.exists() {
        if child.try_wait().unwrap().is_some() || std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            return Verdict::NotRun(format!("the attacker: {}", crate::common::text(&out)));
        }
        std::thread::yield_now();
    }
    let mut ran = 0;
    let mut refused = Vec::new();
    let mut unclear = Vec::new();
    for _ in 0..VICTIM_RUNS {
        let out = victim();
        if String::from_utf8_lossy(&out.stdout).contains(MARK) {
            ran += 1;
        } else if out.status.code() == Some(125) && !out.stderr.is_empty() {
            refused.push(String::from_utf8_lossy(&out.stderr).trim().to_string());
        } else {
            unclear.push(crate::common::text(&out));
        }
        if std::fs::read_dir(target).unwrap().next().is_some() {
            break;
        }
    }
    std::fs::write(&stop, "").unwrap();
    let attacker_out = child.wait_with_output().unwrap();
    let made: Vec<String> = std::fs::read_dir(target)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    if !made.is_empty() {
        return Verdict::Escaped(format!(
            "the victim made {made:?} in {} (outside every grant)",
            target.display()
        ));
    }
    if !unclear.is_empty() {
        return Verdict::NotRun(format!(
            "a victim run neither ran nor failed closed (125):\n{}\nthe attacker: {}",
            unclear.join("\n"),
            crate::common::text(&attacker_out)
        ));
    }
    crate::common::report(format!(
        "{SWAP_HOME_DIR}: {ran} victim runs ran, {} failed closed{}",
        refused.len(),
        refused
            .first()
            .map(|r| format!(", e.g.: {}", r.lines().last().unwrap_or_default()))
            .unwrap_or_default()
    ));
    Verdict::Blocked
}
