//! How a run ended, and the exit status the CLI reports for it (docs/architecture.md, the exit rule).

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
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
    pub fn from_status(status: ExitStatus) -> Self {
        match (status.code(), status.signal()) {
            (Some(code), _) => ExitOutcome::Exited(code),
            (None, Some(sig)) => ExitOutcome::Signaled(sig),
            // Stopped/continued are not final states for wait(); treat as a generic failure.
            (None, None) => ExitOutcome::Exited(1),
        }
    }

    /// The command's own code; 124 for a timeout; 128+N for signal N.
    pub fn code(&self) -> i32 {
        match *self {
            ExitOutcome::Exited(code) => code,
            ExitOutcome::Signaled(sig) => 128 + sig,
            ExitOutcome::TimedOut(_) => 124,
        }
    }

    pub fn success(&self) -> bool {
        matches!(self, ExitOutcome::Exited(0))
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
            ExitOutcome::from_status(ExitStatus::from_raw(9)),
            ExitOutcome::Signaled(9)
        );
        assert_eq!(
            ExitOutcome::from_status(ExitStatus::from_raw(2 << 8)),
            ExitOutcome::Exited(2)
        );
    }
}
