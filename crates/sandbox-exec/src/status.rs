//! How a run ended, and the exit status the CLI reports for it (docs/architecture.md, the exit rule).

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

/// The end of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitOutcome {
    /// The command exited with this code.
    Exited(i32),
    /// The command was killed by this signal.
    Signaled(i32),
    /// The run hit its timeout and its group was killed.
    TimedOut(Duration),
}

impl ExitOutcome {
    pub fn from_status(status: std::process::ExitStatus) -> Self {
        match (status.code(), status.signal()) {
            (Some(code), _) => ExitOutcome::Exited(code),
            (None, Some(sig)) => ExitOutcome::Signaled(sig),
            // Stopped/continued are not final states for wait(); treat as a generic failure.
            (None, None) => ExitOutcome::Exited(1),
        }
    }

    /// The command's own code; 124 for a timeout; 128+N for signal N ([`Outcome::status`]).
    pub fn code(&self) -> i32 {
        Outcome::from(*self).status().code
    }

    pub fn success(&self) -> bool {
        matches!(self, ExitOutcome::Exited(0))
    }
}

/// Everything that decides a run's exit status, whichever runner ran it (the CLI, the
/// daemon's host commands, a VM box's guest): the one exit rule is [`Outcome::status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The boundary failed before the command started, or lost it (nothing ran as asked).
    SetupFailed,
    /// The command could not be started.
    NotStarted(Unstartable),
    /// The command exited with this code.
    Exited(i32),
    /// The command was killed by this signal.
    Signaled(i32),
    /// The command hit its timeout and was killed.
    TimedOut(Duration),
}

/// Why a command could not start ([`crate::ExecError::unstartable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unstartable {
    /// No such program (127).
    NotFound,
    /// The program is not executable (126).
    NotExecutable,
    /// Any other failure to start it (125).
    Failed,
}

/// An exit status as the CLI returns it and the daemon's `exit` event carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitStatus {
    /// 124 timed out, 125 the sandbox failed, 126 not executable, 127 not found, 128+N
    /// killed by signal N, else the command's own.
    pub code: i32,
    /// The signal that killed the command, if one did.
    pub signal: Option<i32>,
    pub timed_out: bool,
}

impl Outcome {
    /// The outcome of a command that could not start.
    pub fn not_started(e: &crate::ExecError) -> Outcome {
        Outcome::NotStarted(e.unstartable())
    }

    /// The one exit rule (README.md, "Exit codes"): 124 timeout, 125 setup, 126/127 the
    /// command cannot run, 128+N signal N, else the command's own code.
    pub fn status(self) -> ExitStatus {
        let plain = |code| ExitStatus {
            code,
            signal: None,
            timed_out: false,
        };
        match self {
            Outcome::SetupFailed => plain(125),
            Outcome::NotStarted(Unstartable::NotFound) => plain(127),
            Outcome::NotStarted(Unstartable::NotExecutable) => plain(126),
            Outcome::NotStarted(Unstartable::Failed) => plain(125),
            Outcome::Exited(code) => plain(code),
            Outcome::Signaled(signal) => ExitStatus {
                code: 128 + signal,
                signal: Some(signal),
                timed_out: false,
            },
            Outcome::TimedOut(_) => ExitStatus {
                code: 124,
                signal: None,
                timed_out: true,
            },
        }
    }
}

impl From<ExitOutcome> for Outcome {
    fn from(outcome: ExitOutcome) -> Outcome {
        match outcome {
            ExitOutcome::Exited(code) => Outcome::Exited(code),
            ExitOutcome::Signaled(signal) => Outcome::Signaled(signal),
            ExitOutcome::TimedOut(after) => Outcome::TimedOut(after),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_convention() {
        assert_eq!(ExitOutcome::Exited(3).code(), 3);
        assert_eq!(ExitOutcome::Signaled(9).code(), 137);
        assert_eq!(ExitOutcome::TimedOut(Duration::from_secs(1)).code(), 124);
        assert_eq!(
            ExitOutcome::from_status(std::process::ExitStatus::from_raw(9)),
            ExitOutcome::Signaled(9)
        );
        assert_eq!(
            ExitOutcome::from_status(std::process::ExitStatus::from_raw(2 << 8)),
            ExitOutcome::Exited(2)
        );
    }

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
        let missing = crate::ExecError::NotFound {
            program: "nope".into(),
            searched: None,
        };
        assert_eq!(status(Outcome::not_started(&missing)), (127, None, false));
        assert_eq!(missing.exit_code(), 127);
        let spawn = crate::ExecError::Spawn {
            program: "x".into(),
            cause: "y".into(),
        };
        assert_eq!(spawn.exit_code(), 125);
    }
}
