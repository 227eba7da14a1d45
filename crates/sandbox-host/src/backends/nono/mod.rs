//! The nono backend: the policy as a nono manifest, written once per session to a private
//! file, and each command run by the pinned nono CLI behind a trampoline that proves the
//! sandbox was in place ([`crate::nono`]).

pub(crate) mod manifest;

pub use manifest::{plan, NonoLocation};

use std::sync::Arc;

use sandbox_exec::{ChildSetup, CommandSpec};
use sandbox_policy::Policy;

use crate::backends::nono::manifest::{self as nono, Nono, NonoChildSetup, WrittenManifest};
use crate::error::HostError;
use crate::kind::BackendKind;
use crate::report::Enforcement;
use crate::seam::{
    step, Backend, BackendOptions, BackendSession, CommandJudge, PreparedCommand, Progress,
};

pub(crate) struct NonoBackend {
    pub(crate) options: BackendOptions,
}

impl NonoBackend {
    fn locate(&self, policy: &Policy) -> Result<Nono, HostError> {
        nono::locate(
            self.options.nono.as_ref(),
            policy,
            self.options.spawn_dir(policy),
            self.options.private_dir.as_deref(),
        )
    }
}

impl Backend for NonoBackend {
    fn enforcement(&self, policy: &Policy) -> Result<Enforcement, HostError> {
        nono::enforcement(policy, &self.locate(policy)?)
    }

    fn prepare(
        &self,
        policy: &Policy,
        progress: &dyn Progress,
    ) -> Result<Arc<dyn BackendSession>, HostError> {
        let located = step(progress, "locate nono", || self.locate(policy))?;
        let enforcement = nono::enforcement(policy, &located)?;
        let manifest = step(progress, "write the nono manifest", || {
            nono::write_manifest(policy, &self.options.private_dir())
        })?;
        Ok(Arc::new(NonoSession {
            policy: policy.clone(),
            nono: located,
            manifest: Arc::new(manifest),
            enforcement,
        }))
    }
}

struct NonoSession {
    policy: Policy,
    nono: Nono,
    /// Shared with every command, so the file outlives each of them even if the session
    /// goes first.
    manifest: Arc<WrittenManifest>,
    enforcement: Enforcement,
}

impl BackendSession for NonoSession {
    fn enforcement(&self) -> &Enforcement {
        &self.enforcement
    }

    fn command(&self, spec: CommandSpec) -> Result<PreparedCommand, HostError> {
        let marker = Arc::new(nono::start_marker(&self.policy, &self.manifest)?);
        let wrapped = nono::wrap(&spec, &self.nono, &self.manifest, &marker)?;
        // As root, nono would keep every capability; they are dropped before it starts (the
        // enforcement report says so). Then the native backend's terminal ioctl rules, which
        // nono's own seccomp baseline lacks: nono and the command inherit them.
        #[cfg(target_os = "linux")]
        let before = {
            let mut before: Vec<Box<dyn ChildSetup>> = Vec::new();
            if let Some(drop) = crate::backends::native::capabilities::DropCapabilities::when_root()
            {
                before.push(Box::new(drop));
            }
            before.push(Box::new(
                crate::backends::native::seccomp::TerminalFilter::new()?,
            ));
            before
        };
        #[cfg(not(target_os = "linux"))]
        let before: Vec<Box<dyn ChildSetup>> = Vec::new();
        let setup = NonoChildSetup {
            marker: marker.clone(),
            before,
        };
        Ok(PreparedCommand::new(
            BackendKind::Nono,
            wrapped,
            Some(Arc::new(setup)),
            CommandJudge::StartMarker(marker),
            self.policy.workspace.git.clone(),
        )
        .keeping(self.manifest.clone()))
    }
}
