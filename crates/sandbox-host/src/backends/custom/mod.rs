//! The custom backend: the user's launcher owns the boundary. Its placement is checked when
//! the session is prepared, and again for each command on the PATH the command starts with.

pub(crate) mod launcher;

pub use launcher::LauncherConfig;

use std::sync::Arc;

use sandbox_exec::CommandSpec;
use sandbox_policy::Policy;

use crate::backends::custom::launcher::{self as custom, Launcher};
use crate::error::HostError;
use crate::kind::BackendKind;
use crate::report::Enforcement;
use crate::seam::{
    step, Backend, BackendOptions, BackendSession, CommandJudge, PreparedCommand, Progress,
};

pub(crate) struct CustomBackend {
    pub(crate) options: BackendOptions,
}

fn locate(
    options: &BackendOptions,
    policy: &Policy,
    path: Option<&std::ffi::OsStr>,
) -> Result<Launcher, HostError> {
    custom::locate(
        options.custom.as_ref(),
        policy,
        options.spawn_dir(policy),
        path,
    )
}

impl Backend for CustomBackend {
    fn enforcement(&self, policy: &Policy) -> Result<Enforcement, HostError> {
        let launcher = locate(&self.options, policy, std::env::var_os("PATH").as_deref())?;
        Ok(custom::enforcement(&launcher))
    }

    fn prepare(
        &self,
        policy: &Policy,
        progress: &dyn Progress,
    ) -> Result<Arc<dyn BackendSession>, HostError> {
        // The child's PATH: the same the policy's environment rules give every command.
        let env = policy.env.resolve(std::env::vars_os());
        let path = env
            .iter()
            .find(|(name, _)| name == "PATH")
            .map(|(_, value)| value.clone());
        let launcher = step(progress, "check the launcher", || {
            locate(&self.options, policy, path.as_deref())
        })?;
        Ok(Arc::new(CustomSession {
            options: self.options.clone(),
            policy: policy.clone(),
            enforcement: custom::enforcement(&launcher),
        }))
    }
}

struct CustomSession {
    options: BackendOptions,
    policy: Policy,
    enforcement: Enforcement,
}

impl BackendSession for CustomSession {
    fn enforcement(&self) -> &Enforcement {
        &self.enforcement
    }

    fn command(&self, spec: CommandSpec) -> Result<PreparedCommand, HostError> {
        // The launcher is looked up on the PATH it will be started with: the child's.
        let launcher = locate(&self.options, &self.policy, spec.env_var("PATH"))?;
        let wrapped = custom::wrap(&self.policy, &spec, &launcher);
        Ok(PreparedCommand::new(
            BackendKind::Custom,
            wrapped,
            None,
            CommandJudge::Launcher(launcher.path),
            self.policy.workspace.git.clone(),
        ))
    }
}
