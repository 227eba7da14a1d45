use super::*;

#[test]
fn one_rule_gives_every_exit_status() {
    let status = |o: Outcome| {
        let s = o.status();
        (s.code, s.signal, s.timed_out)
    };
    assert_eq!(status(Outcome::Exited(0)), (0, None, false));
    assert_eq!(status(Outcome::Exited(3)), (3, None, false));
    assert_eq!(status(Outcome::Signaled(9)), (137, Some(9), false));
    assert_eq!(
        status(Outcome::TimedOut(Duration::from_secs(1))),
        (124, None, true)
    );
    assert_eq!(status(Outcome::SetupFailed), (125, None, false));
    let missing = ExecError::NotFound {
        program: "nope".into(),
        searched: None,
    };
    assert_eq!(status(Outcome::not_started(&missing)), (127, None, false));
    // Every ExitOutcome maps onto the same codes it always had.
    for o in [
        ExitOutcome::Exited(7),
        ExitOutcome::Signaled(15),
        ExitOutcome::TimedOut(Duration::ZERO),
    ] {
        assert_eq!(Outcome::from(o).status().code, o.code(), "{o:?}");
    }
}
