//! The backends this binary links, by name: the four of this crate ([`Backends::builtin`]),
//! plus what the binary adds from its other crates (Lima from `sandbox-lima`; BoxLite from
//! `sandbox-boxlite` when its cargo feature is on). The binary builds one registry and hands
//! it to the CLI and the daemon; a backend not in it is "not in this build", told apart from
//! a name nobody knows.

use std::sync::Arc;

use sandbox_policy::Policy;

use super::{Availability, Backend, BackendKind, BackendOptions, BackendSession, Progress};
use crate::backends::{
    custom::CustomBackend, host::HostBackend, native::NativeBackend, nono::NonoBackend,
};
use crate::error::HostError;

/// A backend the binary links: opens it with this machine's trusted options.
pub trait Provider: Send + Sync {
    /// The name it is chosen by.
    fn kind(&self) -> BackendKind;

    /// Opens the backend. A backend whose commands cannot run in this process (BoxLite's
    /// boxes belong to the daemon) refuses here, with a typed reason.
    fn open(&self, options: &BackendOptions) -> Result<Box<dyn Backend>, HostError>;
}

/// The backends of one build, in [`BackendKind::ALL`] order.
#[derive(Clone, Default)]
pub struct Backends {
    linked: Vec<Arc<dyn Provider>>,
}

impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.kinds()).finish()
    }
}

struct Builtin(BackendKind);

impl Provider for Builtin {
    fn kind(&self) -> BackendKind {
        self.0
    }

    fn open(&self, options: &BackendOptions) -> Result<Box<dyn Backend>, HostError> {
        let options = options.clone();
        Ok(match self.0 {
            BackendKind::Host => Box::new(HostBackend),
            BackendKind::Native => Box::new(NativeBackend { options }),
            BackendKind::Nono => Box::new(NonoBackend { options }),
            BackendKind::Custom => Box::new(CustomBackend { options }),
            other => return Err(HostError::NotInBuild { backend: other }),
        })
    }
}

impl Backends {
    /// The backends of this crate: native, host, nono, custom.
    pub fn builtin() -> Self {
        [
            BackendKind::Native,
            BackendKind::Host,
            BackendKind::Nono,
            BackendKind::Custom,
        ]
        .into_iter()
        .fold(Backends::default(), |b, kind| b.with(Builtin(kind)))
    }

    /// Adds `provider`, replacing one of the same name.
    pub fn with(mut self, provider: impl Provider + 'static) -> Self {
        let kind = provider.kind();
        self.linked.retain(|p| p.kind() != kind);
        self.linked.push(Arc::new(provider));
        let order = |k: BackendKind| BackendKind::ALL.iter().position(|&a| a == k);
        self.linked.sort_by_key(|p| order(p.kind()));
        self
    }

    /// Whether this build has `kind`.
    pub fn contains(&self, kind: BackendKind) -> bool {
        self.linked.iter().any(|p| p.kind() == kind)
    }

    /// The names of this build's backends.
    pub fn kinds(&self) -> impl Iterator<Item = BackendKind> + '_ {
        self.linked.iter().map(|p| p.kind())
    }

    /// Parses a name that must be usable in this build (`sandbox use`, `--backend`,
    /// `box.create`): a known backend this build does not have is refused here, not
    /// remembered.
    pub fn parse(&self, name: &str) -> Result<BackendKind, HostError> {
        let kind = BackendKind::parse(name)?;
        if !self.contains(kind) {
            return Err(HostError::NotInBuild { backend: kind });
        }
        Ok(kind)
    }

    /// Opens `kind` with `options`.
    pub fn open(
        &self,
        kind: BackendKind,
        options: &BackendOptions,
    ) -> Result<Box<dyn Backend>, HostError> {
        match self.linked.iter().find(|p| p.kind() == kind) {
            Some(provider) => provider.open(options),
            None => Err(HostError::NotInBuild { backend: kind }),
        }
    }

    /// Checks `policy` ([`super::check_policy`]), opens `kind` and prepares a session for it.
    /// Runners call it through [`crate::run::Run::prepare`].
    pub fn prepare(
        &self,
        kind: BackendKind,
        policy: &Policy,
        options: &BackendOptions,
        progress: &dyn Progress,
    ) -> Result<Arc<dyn BackendSession>, HostError> {
        super::check_policy(kind, policy, options)?;
        self.open(kind, options)?.prepare(policy, progress)
    }

    /// The one judgement of availability `doctor` and `host.describe` share, for `sample`
    /// (see [`super::sample_policy`]) under `options`.
    pub fn availability(
        &self,
        kind: BackendKind,
        sample: &Policy,
        options: &BackendOptions,
    ) -> Availability {
        super::availability_of(kind, self.open(kind, options), sample, options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Refusing;

    impl Provider for Refusing {
        fn kind(&self) -> BackendKind {
            BackendKind::Boxlite
        }
        fn open(&self, _: &BackendOptions) -> Result<Box<dyn Backend>, HostError> {
            Err(HostError::RunsInDaemon {
                backend: BackendKind::Boxlite,
            })
        }
    }

    #[test]
    fn a_known_backend_outside_the_build_is_refused_as_not_in_build() {
        let builtin = Backends::builtin();
        assert_eq!(
            builtin.kinds().collect::<Vec<_>>(),
            [
                BackendKind::Native,
                BackendKind::Host,
                BackendKind::Nono,
                BackendKind::Custom
            ]
        );
        assert!(matches!(
            builtin.parse("boxlite"),
            Err(HostError::NotInBuild {
                backend: BackendKind::Boxlite
            })
        ));
        assert!(matches!(
            builtin.parse("lima"),
            Err(HostError::NotInBuild {
                backend: BackendKind::Lima
            })
        ));
        assert!(matches!(
            builtin.parse("qemu"),
            Err(HostError::UnknownBackend { .. })
        ));
        assert_eq!(builtin.parse("host").unwrap(), BackendKind::Host);
        let options = BackendOptions::default();
        assert!(matches!(
            builtin.open(BackendKind::Lima, &options),
            Err(HostError::NotInBuild { .. })
        ));
    }

    #[test]
    fn an_added_backend_is_chosen_by_name_and_keeps_its_place_in_the_list() {
        let backends = Backends::builtin().with(Refusing);
        assert_eq!(backends.parse("boxlite").unwrap(), BackendKind::Boxlite);
        assert_eq!(backends.kinds().last(), Some(BackendKind::Boxlite));
        // Its own refusal, typed, not "not in this build".
        let options = BackendOptions::default();
        assert!(matches!(
            backends.open(BackendKind::Boxlite, &options),
            Err(HostError::RunsInDaemon { .. })
        ));
        let scratch = tempfile::tempdir().unwrap();
        let sample = crate::seam::sample_policy(scratch.path(), None).unwrap();
        let a = backends.availability(BackendKind::Boxlite, &sample, &options);
        assert!(!a.available);
        assert!(a.reason.unwrap().contains("daemon"));
        // The host backend opens and is available everywhere.
        assert!(
            backends
                .availability(BackendKind::Host, &sample, &options)
                .available
        );
    }
}
