//! The escape suite under the native backend, with the host backend as the control that
//! proves every check can fail. See `common/escape.rs` for the attacks.

mod common;

use common::escape::{self, Verdict};

#[test]
fn native_backend_holds_against_the_escape_suite() {
    let backends = ["host", "native"];
    let rows = escape::run_suite(&backends);
    println!("escape suite (host = control, no boundary):");
    escape::print_table(&backends, &rows);

    let is_root = nix::unistd::geteuid().is_root();
    let mut failures = Vec::new();
    for (name, verdicts) in &rows {
        let (control, native) = (&verdicts[0], &verdicts[1]);
        match native {
            Verdict::Skipped(reason) => println!("skipped: {name}: {reason}"),
            v if v.held() => {}
            other => failures.push(format!("native: {name}: {other:?}")),
        }
        // Without a boundary the attack must work — otherwise its check proves nothing.
        // (Unprivileged, TIOCSTI is already refused by the new session alone.)
        let control_may_hold = name.contains("TIOCSTI") && !is_root;
        match control {
            Verdict::Escaped(_) | Verdict::Skipped(_) => {}
            other if control_may_hold => println!("control held as expected for {name}: {other:?}"),
            other => failures.push(format!(
                "control (host): {name}: expected the attack to work, got {other:?}"
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn normal_work_succeeds_under_the_native_backend() {
    let mut failures = Vec::new();
    for work in escape::normal_work() {
        let fixture = escape::Fixture::new();
        match escape::do_work(&fixture, "native", &work) {
            Ok(()) => println!("ok: {}", work.name),
            Err(detail) => failures.push(format!("{}: {detail}", work.name)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
