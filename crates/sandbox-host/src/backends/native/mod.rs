//! The native backend: Landlock + seccomp on Linux (compiled once per session, applied in
//! each child between fork and exec), Seatbelt through `sandbox-exec` on macOS.

#[cfg(target_os = "linux")]
pub mod abi;
#[cfg(target_os = "linux")]
pub(crate) mod capabilities;
#[cfg(target_os = "linux")]
pub(crate) mod child;
mod describe;
#[cfg(target_os = "linux")]
pub(crate) mod landlock;
#[cfg(target_os = "linux")]
pub(crate) mod net;
#[cfg(target_os = "linux")]
pub(crate) mod netns;
#[cfg(target_os = "linux")]
pub(crate) mod options;
#[cfg(target_os = "linux")]
pub(crate) mod plans;
#[cfg(target_os = "linux")]
pub(crate) mod publish;
#[cfg(target_os = "linux")]
pub(crate) mod resolve;
#[cfg(target_os = "linux")]
pub(crate) mod sandbox;
#[cfg(any(target_os = "macos", test))]
pub(crate) mod seatbelt;
#[cfg(target_os = "linux")]
pub mod seccomp;
#[cfg(target_os = "linux")]
pub(crate) mod userns;
#[cfg(target_os = "linux")]
pub(crate) mod view;

pub use describe::{native_forms, private_view, quarantine_layers, NativeForms};

use std::sync::Arc;

use sandbox_exec::CommandSpec;
use sandbox_policy::Policy;

use crate::error::HostError;
use crate::kind::BackendKind;
use crate::report::Enforcement;
use crate::seam::{
    step, Backend, BackendOptions, BackendSession, CommandJudge, PreparedCommand, Progress,
};

pub(crate) struct NativeBackend {
    pub(crate) options: BackendOptions,
}

impl Backend for NativeBackend {
    fn enforcement(&self, policy: &Policy) -> Result<Enforcement, HostError> {
        platform::enforcement(policy, &self.options)
    }

    fn prepare(
        &self,
        policy: &Policy,
        progress: &dyn Progress,
    ) -> Result<Arc<dyn BackendSession>, HostError> {
        let session = step(progress, "compile the native sandbox", || {
            platform::prepare(policy, &self.options)
        })?;
        Ok(Arc::new(session))
    }
}

#[cfg(target_os = "linux")]
mod platform {
    use super::*;
    use crate::backends::native::options::NativeOptions;
    use crate::backends::native::sandbox::NativeSandbox;

    pub(super) fn enforcement(
        policy: &Policy,
        options: &BackendOptions,
    ) -> Result<Enforcement, HostError> {
        crate::backends::native::plans::enforcement(policy, &NativeOptions::of(options))
    }

    pub(crate) struct NativeSession {
        sandbox: Arc<NativeSandbox>,
        git: Option<sandbox_policy::GitLayout>,
        policy: Policy,
    }

    pub(super) fn prepare(
        policy: &Policy,
        options: &BackendOptions,
    ) -> Result<NativeSession, HostError> {
        Ok(NativeSession {
            sandbox: Arc::new(NativeSandbox::prepare(policy, &NativeOptions::of(options))?),
            git: policy.workspace.git.clone(),
            policy: policy.clone(),
        })
    }

    impl BackendSession for NativeSession {
        fn enforcement(&self) -> &Enforcement {
            self.sandbox.enforcement()
        }

        fn proxy_address(&self) -> Option<String> {
            let proxy = self.sandbox.net_plan()?.proxy.as_ref()?;
            Some(format!("127.0.0.1:{}", proxy.port))
        }

        fn command(&self, mut spec: CommandSpec) -> Result<PreparedCommand, HostError> {
            if self.sandbox.has_view() {
                crate::backends::native::resolve::in_view(&self.policy, &mut spec)?;
            } else {
                crate::assembly::home_without_view(&self.policy, &mut spec.env);
            }
            // The proxy variables (and whatever else the network plan adds), pointing at the
            // proxy's listener inside the command's namespace.
            if let Some(plan) = self.sandbox.net_plan() {
                for (name, value) in plan.env() {
                    spec.set_env(name, value);
                }
                // git's remotes of a credential's git host, to the proxy (`--credential
                // github`), after the git settings the command already has.
                crate::assembly::add_git_config(&mut spec.env, &plan.git_settings());
            }
            // The ruleset fd and the BPF programs are shared: each child applies them anew.
            // The view is the command's own when it quarantines the git store.
            let (child, stores) = self.sandbox.command()?;
            let mut store = stores.store;
            // git inside reports its errors to a socket in the private TMPDIR, so a command
            // that fails on a pinned ref gets a line that says so (unless the user traces
            // git events elsewhere already).
            let tmpdir = spec.env_var("TMPDIR").map(std::path::PathBuf::from);
            if let (Some(store), Some(tmpdir), None) =
                (store.as_mut(), tmpdir, spec.env_var("GIT_TRACE2_EVENT"))
            {
                let pushes = stores.pushes.iter().map(|(r, _)| r.clone()).collect();
                if let Some(target) = store.listen_for_git_errors(&tmpdir, pushes) {
                    spec.env.push(("GIT_TRACE2_EVENT".into(), target));
                    if spec.env_var("GIT_TRACE2_EVENT_NESTING").is_none() {
                        spec.env
                            .push(("GIT_TRACE2_EVENT_NESTING".into(), "1".into()));
                    }
                }
            }
            let mut prepared = PreparedCommand::new(
                BackendKind::Native,
                spec,
                Some(Arc::new(child) as Arc<dyn sandbox_exec::ChildSetup>),
                CommandJudge::Plain,
                self.git.clone(),
            )
            .with_store(store)
            .with_pushes(stores.pushes)
            .with_net(
                stores
                    .net
                    .map(|net| Box::new(net) as Box<dyn crate::seam::CommandNetwork>),
            );
            // The layers' claim ends with the command's processes (and its mounts).
            if let Some(claim) = stores.caches {
                prepared = prepared.keeping(Arc::new(claim));
            }
            Ok(prepared)
        }
    }
}

#[cfg(target_os = "macos")]
mod platform {
    use super::*;

    pub(super) fn enforcement(
        _policy: &Policy,
        _options: &BackendOptions,
    ) -> Result<Enforcement, HostError> {
        Ok(Enforcement {
            mechanism: "seatbelt".into(),
            enforced: vec![
                "filesystem: only the listed paths; git hooks, config, info and packed-refs \
                 read-only even inside writable trees (SBPL last-match-wins)"
                    .into(),
                "signals only to processes of the same sandbox".into(),
                "network: blocked except localhost TCP ports when --block-net".into(),
            ],
            ..Enforcement::default()
        })
    }

    pub(crate) struct NativeSession {
        policy: Policy,
        enforcement: Enforcement,
    }

    pub(super) fn prepare(
        policy: &Policy,
        options: &BackendOptions,
    ) -> Result<NativeSession, HostError> {
        Ok(NativeSession {
            policy: policy.clone(),
            enforcement: enforcement(policy, options)?,
        })
    }

    impl BackendSession for NativeSession {
        fn enforcement(&self) -> &Enforcement {
            &self.enforcement
        }

        fn command(&self, spec: CommandSpec) -> Result<PreparedCommand, HostError> {
            let program = sandbox_exec::resolve::resolve_program(
                &spec.program,
                spec.env_var("PATH"),
                &spec.cwd,
            )?;
            let wrapped = crate::backends::native::seatbelt::wrap(&self.policy, &spec, &program);
            Ok(PreparedCommand::new(
                BackendKind::Native,
                wrapped,
                None,
                CommandJudge::Plain,
                self.policy.workspace.git.clone(),
            ))
        }
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
mod platform {
    use super::*;

    pub(super) enum NativeSession {}

    pub(super) fn enforcement(_: &Policy, _: &BackendOptions) -> Result<Enforcement, HostError> {
        Err(HostError::NoNativeSandbox)
    }

    pub(super) fn prepare(_: &Policy, _: &BackendOptions) -> Result<NativeSession, HostError> {
        Err(HostError::NoNativeSandbox)
    }

    impl BackendSession for NativeSession {
        fn enforcement(&self) -> &Enforcement {
            match *self {}
        }
        fn command(&self, _: CommandSpec) -> Result<PreparedCommand, HostError> {
            match *self {}
        }
    }
}
