//! The toolchains' trees searched for credential files, and that search kept between runs.
//!
//! A run grants each enabled toolchain's trees read-only, without the credential files found
//! in their top levels ([`tree_grants`]). What the search found depends only on the listings
//! it read, so it is kept in the state directory (`toolchain-scan`, mode 0600, the host's)
//! with the identity of every directory it listed or looked into — device, inode and change
//! time, which no one can set back (writing an entry, a rename, a `utimensat` all move it) —
//! and a later run that finds them all unchanged takes the answer for a `stat` each instead
//! of reading them again. A tree not searched before (a toolchain added to `PATH`) is
//! searched; a directory changed within the last [`RACY`] is searched again next time too
//! (a change within the same clock tick as the search would not move its change time).

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sandbox_policy::secrets::{self, ListedEntry};
use sandbox_policy::Masked;
use serde::{Deserialize, Serialize};

use super::{list, scan_secrets_with};

/// How deep a toolchain's tree is searched for credential files on every run: its top two
/// levels (a run pays for each directory listed). Deeper known places are named in
/// [`DEEP_SECRETS`].
const SECRET_DEPTH: usize = 2;

/// Where layouts keep a credential file deeper down: `(parent of the versions, file)`, the
/// versions listed once each (nvm keeps a global `npmrc` at `versions/node/<v>/etc/npmrc`).
const DEEP_SECRETS: &[(&str, &str)] = &[("versions/node", "etc/npmrc")];

/// A directory whose change time is this recent is not trusted to have been seen whole.
const RACY: Duration = Duration::from_secs(2);

/// The file in the state directory.
const FILE: &str = "toolchain-scan";

/// One directory the search depended on, as it was: `None` when it did not exist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Seen {
    path: PathBuf,
    id: Option<(u64, u64, i64, i64)>,
}

impl Seen {
    fn now(path: &Path) -> Seen {
        use std::os::unix::fs::MetadataExt as _;
        Seen {
            path: path.to_path_buf(),
            // Followed, as the listing followed it.
            id: std::fs::metadata(path)
                .ok()
                .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec())),
        }
    }

    fn racy(&self, now: SystemTime) -> bool {
        let Some((_, _, secs, nanos)) = self.id else {
            return false;
        };
        let changed = SystemTime::UNIX_EPOCH
            + Duration::new(
                u64::try_from(secs).unwrap_or(0),
                nanos.clamp(0, 999_999_999) as u32,
            );
        changed + RACY > now
    }
}

/// What the search of one tree found: the grants the tree becomes and what it left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Found {
    tree: PathBuf,
    home: PathBuf,
    grants: Vec<PathBuf>,
    /// `(path, is a directory, what it is)`.
    masked: Vec<(PathBuf, bool, String)>,
    seen: Vec<Seen>,
}

/// The searches of a run: those kept from earlier runs, and whether any was redone.
#[derive(Debug, Default)]
pub(super) struct Scans {
    dir: Option<PathBuf>,
    found: Vec<Found>,
    changed: bool,
}

/// What the kept searches depend on besides the directories: this program (its rules of
/// what a credential file is) and the format.
fn key() -> String {
    use std::os::unix::fs::MetadataExt as _;
    let exe = std::env::current_exe()
        .and_then(std::fs::metadata)
        .map(|m| format!("{}:{}:{}:{}", m.dev(), m.ino(), m.mtime(), m.mtime_nsec()))
        .unwrap_or_default();
    format!("v1|{exe}")
}

impl Scans {
    /// The searches kept in the private state directory `dir` (none: nothing kept).
    pub(super) fn load(dir: Option<&Path>) -> Scans {
        let found = dir
            .and_then(|d| crate::privdir::recall(d, FILE, &key()))
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default();
        Scans {
            dir: dir.map(Path::to_path_buf),
            found,
            changed: false,
        }
    }

    /// Keeps what was searched anew (nothing is written when every answer was kept).
    pub(super) fn store(self) {
        self.store_at(SystemTime::now());
    }

    /// [`Self::store`] as at `now`.
    fn store_at(self, now: SystemTime) {
        let (Some(dir), true) = (&self.dir, self.changed) else {
            return;
        };
        let keep: Vec<&Found> = self
            .found
            .iter()
            .filter(|f| !f.seen.iter().any(|s| s.racy(now)))
            .collect();
        if let Ok(text) = serde_json::to_string(&keep) {
            crate::privdir::remember(dir, FILE, &key(), &text);
        }
    }

    /// The grants of the toolchain tree `tree`, its credential files left out (added to
    /// `masked`): the kept answer while every directory it read is unchanged, else searched.
    pub(super) fn tree_grants(
        &mut self,
        tree: &Path,
        home: &Path,
        masked: &mut Vec<Masked>,
    ) -> Vec<PathBuf> {
        if !tree.is_dir() {
            return vec![tree.to_path_buf()];
        }
        // rustup's tree is large and holds no credentials; walking it on every run would cost
        // more than the rest of the start-up.
        if tree.join("toolchains").is_dir() && tree.join("settings.toml").exists() {
            return vec![tree.to_path_buf()];
        }
        let at = self
            .found
            .iter()
            .position(|f| f.tree == tree && f.home == home);
        let kept = at.filter(|&i| self.found[i].seen.iter().all(|s| *s == Seen::now(&s.path)));
        let found = match kept {
            Some(i) => self.found[i].clone(),
            None => {
                let found = search(tree, home);
                self.changed = true;
                match at {
                    Some(i) => self.found[i] = found.clone(),
                    None => self.found.push(found.clone()),
                }
                found
            }
        };
        for (path, dir, what) in found.masked {
            if !masked.iter().any(|m| m.path == path) {
                masked.push(Masked { path, dir, what });
            }
        }
        found.grants
    }
}

/// Searches `tree` (a directory, not rustup's), recording every directory read as it was
/// just before (a change after that moves its change time).
fn search(tree: &Path, home: &Path) -> Found {
    let seen: RefCell<Vec<Seen>> = RefCell::new(Vec::new());
    let note = |dir: &Path| {
        let mut seen = seen.borrow_mut();
        if !seen.iter().any(|s| s.path == dir) {
            seen.push(Seen::now(dir));
        }
    };
    let recorded = |dir: &Path| {
        note(dir);
        list(dir)
    };
    let mut hits = scan_secrets_with(home, tree, SECRET_DEPTH, &recorded);
    for (versions, file) in DEEP_SECRETS {
        for version in recorded(&tree.join(versions)).unwrap_or_default() {
            let path = tree.join(versions).join(&version.name).join(file);
            // Whether the file is there depends on its directory, or on the version's if
            // that directory is missing.
            if let Some(parent) = path.parent() {
                note(parent);
                if let Some(version) = parent.parent() {
                    note(version);
                }
            }
            if let Some(kind) = secrets::is_secret(&path) {
                if path.symlink_metadata().is_ok() {
                    hits.push(secrets::SecretHit { path, kind });
                }
            }
        }
    }
    let mut grants = Vec::new();
    let mut masked = Vec::new();
    if hits.is_empty() {
        grants.push(tree.to_path_buf());
    } else {
        for hit in &hits {
            masked.push((
                hit.path.clone(),
                hit.path.is_dir(),
                hit.kind.what.to_string(),
            ));
        }
        let secrets: Vec<PathBuf> = hits.iter().map(|h| h.path.clone()).collect();
        split(tree, &secrets, &mut grants, &recorded);
    }
    Found {
        tree: tree.to_path_buf(),
        home: home.to_path_buf(),
        grants,
        masked,
        seen: seen.into_inner(),
    }
}

/// `dir`'s entries as grants, descending into those that hold a secret, leaving the secrets.
fn split(
    dir: &Path,
    secrets: &[PathBuf],
    out: &mut Vec<PathBuf>,
    list: &dyn Fn(&Path) -> Option<Vec<ListedEntry>>,
) {
    let Some(entries) = list(dir) else {
        return;
    };
    for e in entries {
        let path = dir.join(&e.name);
        if secrets.contains(&path) {
            continue;
        }
        if e.is_dir && secrets.iter().any(|s| s.starts_with(&path)) {
            split(&path, secrets, out, list);
        } else {
            out.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree like pyenv's: versions with a few levels each.
    fn tree(at: &Path) -> PathBuf {
        let tree = at.join(".pyenv");
        for d in [
            "versions/3.12.1/bin",
            "plugins/pyenv-virtualenv/bin",
            "shims",
        ] {
            std::fs::create_dir_all(tree.join(d)).unwrap();
        }
        tree
    }

    /// A temporary directory with a private state directory and a home path in it.
    fn state_and_home() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let state = t.path().join("state");
        crate::privdir::ensure("native", &state).unwrap();
        let home = t.path().join("home");
        (t, state, home)
    }

    fn grants(scans: &mut Scans, tree: &Path, home: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let mut masked = Vec::new();
        let g = scans.tree_grants(tree, home, &mut masked);
        (g, masked.into_iter().map(|m| m.path).collect())
    }

    /// A kept search is taken while nothing it read changed; a credential file put into a
    /// directory it listed (the search at depth 2, and nvm's deep `npmrc`) is found by the
    /// next run — even when the directory's time is set back.
    #[test]
    fn a_kept_search_is_redone_when_a_directory_it_read_changes() {
        let (_dir, state, home) = state_and_home();
        let tree = tree(&home);
        let mut scans = Scans::load(Some(&state));
        assert_eq!(
            grants(&mut scans, &tree, &home),
            (vec![tree.clone()], vec![])
        );
        scans.store();
        // The directories are new (racy): nothing kept yet. Once they are older, it is.
        assert!(Scans::load(Some(&state)).found.is_empty());
        let mut scans = Scans::load(Some(&state));
        grants(&mut scans, &tree, &home);
        scans.store_at(later());
        let kept = Scans::load(Some(&state));
        assert_eq!(kept.found.len(), 1, "kept once nothing is racy");
        let mut scans = Scans::load(Some(&state));
        assert_eq!(grants(&mut scans, &tree, &home).0, vec![tree.clone()]);
        assert!(!scans.changed, "taken from what was kept");

        // A credential file where the search looks, the listed directory's time set back.
        let secret = tree.join("versions/.netrc");
        std::fs::write(&secret, "machine x password y").unwrap();
        set_mtime(
            &tree.join("versions"),
            SystemTime::now() - Duration::from_secs(3600),
        );
        let mut scans = Scans::load(Some(&state));
        let (g, masked) = grants(&mut scans, &tree, &home);
        assert!(scans.changed, "searched again");
        assert_eq!(masked, vec![secret.clone()]);
        assert!(!g.contains(&tree) && !g.contains(&secret), "{g:?}");
        assert!(g.contains(&tree.join("versions/3.12.1")), "{g:?}");
    }

    /// nvm's global npmrc, three levels down, is found when it appears after a search.
    #[test]
    fn a_deep_npmrc_that_appears_is_found() {
        let (_dir, state, home) = state_and_home();
        let nvm = home.join(".nvm");
        std::fs::create_dir_all(nvm.join("versions/node/v20.1.0/bin")).unwrap();
        let mut scans = Scans::load(Some(&state));
        assert_eq!(grants(&mut scans, &nvm, &home).1, Vec::<PathBuf>::new());
        scans.store_at(later());
        assert_eq!(Scans::load(Some(&state)).found.len(), 1);
        let npmrc = nvm.join("versions/node/v20.1.0/etc/npmrc");
        std::fs::create_dir_all(npmrc.parent().unwrap()).unwrap();
        std::fs::write(&npmrc, "//registry.npmjs.org/:_authToken=x").unwrap();
        let mut scans = Scans::load(Some(&state));
        assert_eq!(grants(&mut scans, &nvm, &home).1, vec![npmrc]);
    }

    /// A file not ours alone is never taken: it is searched again.
    #[test]
    fn a_kept_search_others_can_write_is_ignored() {
        use std::os::unix::fs::PermissionsExt as _;
        let (_dir, state, home) = state_and_home();
        let tree = tree(&home);
        let mut scans = Scans::load(Some(&state));
        grants(&mut scans, &tree, &home);
        scans.store_at(later());
        let file = state.join(FILE);
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(Scans::load(Some(&state)).found.len(), 1);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(Scans::load(Some(&state)).found.is_empty());
    }

    /// A moment when the directories made by a test are no longer recent.
    fn later() -> SystemTime {
        SystemTime::now() + RACY + Duration::from_secs(1)
    }

    fn set_mtime(path: &Path, to: SystemTime) {
        let f = std::fs::File::open(path).unwrap();
        f.set_modified(to).unwrap();
    }
}
