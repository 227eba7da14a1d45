//! The places whose content decides the boundary — the configuration, the remembered
//! choices, the daemon's token — which no grant of any backend but `host` may reach
//! ([`super::check_policy`]).

use std::path::{Path, PathBuf};

use sandbox_policy::{GrantReason, Policy};

use crate::error::HostError;

/// A place whose content decides the boundary (configuration, remembered choices, the
/// daemon's token), which no grant may put within the sandbox's reach.
#[derive(Debug, Clone)]
pub struct TrustedPlace {
    pub path: PathBuf,
    /// "your sandbox configuration", for messages.
    pub what: String,
    /// Reading it is as bad as writing it (the daemon's host token): read grants count too.
    pub secret: bool,
}

/// The trusted places of this user.
#[derive(Debug, Clone, Default)]
pub struct TrustedPlaces(pub Vec<TrustedPlace>);

/// `path` as it will resolve once it exists: its nearest existing ancestor, canonicalised,
/// joined with the rest (a grant can only name existing, canonical paths).
fn projected(path: &Path) -> Option<PathBuf> {
    let mut rest = Vec::new();
    for ancestor in path.ancestors() {
        if let Ok(canonical) = std::fs::canonicalize(ancestor) {
            return Some(rest.iter().rev().fold(canonical, |p: PathBuf, c| p.join(c)));
        }
        rest.push(ancestor.file_name()?.to_os_string());
    }
    None
}

impl TrustedPlaces {
    /// Refuses a grant that covers a trusted place (a grant of an ancestor, or of the place
    /// itself) or lies inside one (a write grant on the configuration file, a read grant on
    /// the token file): an agent could loosen its own next run, or take over the daemon.
    pub fn check(&self, policy: &Policy) -> Result<(), HostError> {
        for place in &self.0 {
            let Some(at) = projected(&place.path) else {
                continue;
            };
            let grants = policy
                .fs
                .write
                .iter()
                .map(|g| (g, true))
                .chain(policy.fs.read.iter().map(|g| (g, false)));
            for (grant, writable) in grants {
                if !writable && !place.secret {
                    continue;
                }
                let relation = if at.starts_with(&grant.path) {
                    "covers"
                } else if grant.path.starts_with(&at)
                    // The private home is ours, under the state dir, and holds no trusted
                    // file: only a grant covering a trusted place counts for it.
                    && grant.reason != GrantReason::Home
                {
                    "lies inside"
                } else {
                    continue;
                };
                let (kind, harm) = if place.secret {
                    (
                        if writable { "writable grant" } else { "grant" },
                        "a sandboxed agent could read it and control every sandbox",
                    )
                } else {
                    (
                        "writable grant",
                        "a sandboxed agent could change its own boundary for the next run",
                    )
                };
                return Err(HostError::TrustedPlace(format!(
                    "the {kind} {} {relation} {} ({}): {harm}. Grant a narrower path.",
                    grant.path.display(),
                    place.path.display(),
                    place.what
                )));
            }
        }
        Ok(())
    }
}
