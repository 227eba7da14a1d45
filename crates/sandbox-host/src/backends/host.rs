//! The host backend: no boundary, an explicit and labelled opt-out. Commands still get the
//! filtered environment, their own session and process-group cleanup.

use std::sync::Arc;

use sandbox_exec::CommandSpec;
use sandbox_policy::{NetPolicy, Policy};

use crate::error::HostError;
use crate::kind::BackendKind;
use crate::report::Enforcement;
use crate::seam::{Backend, BackendSession, CommandJudge, PreparedCommand, Progress};

pub(crate) struct HostBackend;

fn enforcement() -> Enforcement {
    Enforcement {
        mechanism: "none".into(),
        enforced: vec![
            "nothing: the host backend is an explicit opt-out; the command runs with your \
             full permissions"
                .into(),
            "environment filtering, own session (no TIOCSTI into your terminal), process-group \
             cleanup"
                .into(),
        ],
        ..Enforcement::default()
    }
}

impl Backend for HostBackend {
    fn enforcement(&self, _policy: &Policy) -> Result<Enforcement, HostError> {
        Ok(enforcement())
    }

    fn prepare(
        &self,
        policy: &Policy,
        _progress: &dyn Progress,
    ) -> Result<Arc<dyn BackendSession>, HostError> {
        if matches!(policy.net, NetPolicy::Block { .. }) {
            return Err(HostError::HostCannotBlockNetwork);
        }
        Ok(Arc::new(HostSession {
            enforcement: enforcement(),
        }))
    }
}

struct HostSession {
    enforcement: Enforcement,
}

impl BackendSession for HostSession {
    fn enforcement(&self) -> &Enforcement {
        &self.enforcement
    }

    fn command(&self, spec: CommandSpec) -> Result<PreparedCommand, HostError> {
        // Nothing confines the command, so there is nothing to repair after it either.
        Ok(PreparedCommand::new(
            BackendKind::Host,
            spec,
            None,
            CommandJudge::Plain,
            None,
        ))
    }
}
