//! The remote-tracking refs of the run's push remotes (`--allow-push`): they follow what the
//! push made of the remote, nothing else.

use std::path::{Path, PathBuf};

use git2::{Oid, Repository};

use super::{trace, StoreQuarantine};

impl StoreQuarantine {
    /// Lets the run's `git push` to the push remotes `remotes` (git dirs) update this
    /// repository's remote-tracking refs for them: `refs/remotes/<name>/<branch>` is applied
    /// when it names what the remote's `refs/heads/<branch>` holds on the host (after the
    /// push's own quarantine applied it), never anything else.
    pub(super) fn track_push_remotes(&mut self, remotes: &[PathBuf]) {
        if remotes.is_empty() {
            return;
        }
        let Ok(repo) = Repository::open_bare(&self.common) else {
            return;
        };
        let Ok(names) = repo.remotes() else { return };
        for name in names.iter().flatten() {
            let Ok(remote) = repo.find_remote(name) else {
                continue;
            };
            let url = remote.pushurl().or(remote.url()).unwrap_or_default();
            let path = url.strip_prefix("file://").unwrap_or(url);
            if let Some(gitdir) = trace::local_repository(Path::new(path)) {
                if remotes.contains(&gitdir) {
                    self.tracking.push((name.to_string(), gitdir));
                }
            }
        }
    }

    /// The push remote's git dir and branch of a remote-tracking ref of a push remote.
    fn tracking_of<'a>(&'a self, name: &'a str) -> Option<(&'a Path, &'a str)> {
        let rest = name.strip_prefix("refs/remotes/")?;
        self.tracking.iter().find_map(|(remote, gitdir)| {
            let branch = rest.strip_prefix(remote.as_str())?.strip_prefix('/')?;
            (branch != "HEAD" && !branch.is_empty()).then_some((gitdir.as_path(), branch))
        })
    }

    pub(super) fn is_tracking(&self, name: &str) -> bool {
        self.tracking_of(name).is_some()
    }

    /// For a remote-tracking ref of a push remote: the value its branch has on the host.
    pub(super) fn tracked_value(&self, name: &str) -> Option<Option<Oid>> {
        let (gitdir, branch) = self.tracking_of(name)?;
        let repo = Repository::open_bare(gitdir).ok()?;
        Some(repo.refname_to_id(&format!("refs/heads/{branch}")).ok())
    }
}
