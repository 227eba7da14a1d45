//! The one list of credential files and directories `sandbox` knows: what must never be
//! mounted into a run (a toolchain tree holding one gets it masked), and what a grant that
//! exposes one warns about (`--allow-read ~` makes `~/.ssh` readable).
//!
//! Data plus pure functions. Paths are relative to the user's home (`.ssh/id_ed25519`);
//! [`Anchor::Anywhere`] entries (`.npmrc`, `.netrc`, `credentials.toml` under a `.cargo`) match
//! at any depth, also under a directory outside the home. [`secrets_under`] walks a directory
//! through an injected listing, so the I/O stays with the caller (`sandbox-host`).

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

/// Where a pattern applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    /// The pattern is a path relative to the home (`.ssh`, `.config/gh/hosts.yml`).
    Home,
    /// The pattern's components match as the tail of any path (`.npmrc` anywhere,
    /// `.cargo/credentials.toml` in any `CARGO_HOME` named `.cargo`).
    Anywhere,
}

/// Whether the secret is one file or a whole directory of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    File,
    Dir,
}

/// One kind of credential file or directory.
#[derive(Debug, PartialEq, Eq)]
pub struct SecretKind {
    /// A stable short id (`ssh`, `cargo-credentials`).
    pub id: &'static str,
    /// `/`-separated components, relative to the home or matched as a tail.
    pub pattern: &'static str,
    pub anchor: Anchor,
    pub shape: Shape,
    /// What it holds, for messages: "SSH private keys".
    pub what: &'static str,
}

const fn home(
    id: &'static str,
    pattern: &'static str,
    shape: Shape,
    what: &'static str,
) -> SecretKind {
    SecretKind {
        id,
        pattern,
        anchor: Anchor::Home,
        shape,
        what,
    }
}

const fn anywhere(
    id: &'static str,
    pattern: &'static str,
    shape: Shape,
    what: &'static str,
) -> SecretKind {
    SecretKind {
        id,
        pattern,
        anchor: Anchor::Anywhere,
        shape,
        what,
    }
}

/// The list. Add here, nowhere else.
pub static SECRETS: &[SecretKind] = &[
    home("ssh", ".ssh", Shape::Dir, "SSH private keys"),
    home("gnupg", ".gnupg", Shape::Dir, "GnuPG private keys"),
    home("aws", ".aws", Shape::Dir, "AWS credentials"),
    home("azure", ".azure", Shape::Dir, "Azure CLI tokens"),
    home(
        "gcloud",
        ".config/gcloud",
        Shape::Dir,
        "Google Cloud credentials",
    ),
    home(
        "kube",
        ".kube/config",
        Shape::File,
        "Kubernetes cluster credentials",
    ),
    home(
        "docker",
        ".docker/config.json",
        Shape::File,
        "Docker registry logins",
    ),
    home(
        "gh",
        ".config/gh/hosts.yml",
        Shape::File,
        "GitHub CLI token",
    ),
    home("hub", ".config/hub", Shape::File, "GitHub hub token"),
    home(
        "glab",
        ".config/glab-cli/config.yml",
        Shape::File,
        "GitLab CLI token",
    ),
    home(
        "git-credentials-xdg",
        ".config/git/credentials",
        Shape::File,
        "git stored passwords",
    ),
    home(
        "password-store",
        ".password-store",
        Shape::Dir,
        "pass password store",
    ),
    home(
        "keyrings",
        ".local/share/keyrings",
        Shape::Dir,
        "desktop keyrings",
    ),
    home(
        "1password",
        ".config/op",
        Shape::Dir,
        "1Password CLI sessions",
    ),
    home(
        "vault",
        ".vault-token",
        Shape::File,
        "HashiCorp Vault token",
    ),
    home(
        "terraform",
        ".terraform.d/credentials.tfrc.json",
        Shape::File,
        "Terraform Cloud token",
    ),
    home("gem", ".gem/credentials", Shape::File, "RubyGems API key"),
    home(
        "maven-settings",
        ".m2/settings.xml",
        Shape::File,
        "Maven server passwords",
    ),
    home(
        "maven-security",
        ".m2/settings-security.xml",
        Shape::File,
        "Maven master password",
    ),
    home(
        "gradle",
        ".gradle/gradle.properties",
        Shape::File,
        "Gradle repository credentials",
    ),
    home("pgpass", ".pgpass", Shape::File, "PostgreSQL passwords"),
    home("mysql", ".my.cnf", Shape::File, "MySQL passwords"),
    home(
        "claude",
        ".claude/.credentials.json",
        Shape::File,
        "Claude Code login",
    ),
    home("codex", ".codex/auth.json", Shape::File, "Codex login"),
    home(
        "gemini",
        ".gemini/oauth_creds.json",
        Shape::File,
        "Gemini CLI login",
    ),
    anywhere(
        "cargo-credentials",
        ".cargo/credentials.toml",
        Shape::File,
        "crates.io token",
    ),
    anywhere(
        "cargo-credentials-legacy",
        ".cargo/credentials",
        Shape::File,
        "crates.io token",
    ),
    anywhere("npmrc", ".npmrc", Shape::File, "npm registry tokens"),
    anywhere(
        "npmrc-global",
        "etc/npmrc",
        Shape::File,
        "npm registry tokens (global npmrc)",
    ),
    anywhere("yarnrc", ".yarnrc.yml", Shape::File, "yarn registry tokens"),
    anywhere("pypirc", ".pypirc", Shape::File, "PyPI upload token"),
    anywhere("netrc", ".netrc", Shape::File, "machine passwords (netrc)"),
    anywhere(
        "netrc-win",
        "_netrc",
        Shape::File,
        "machine passwords (netrc)",
    ),
    anywhere(
        "git-credentials",
        ".git-credentials",
        Shape::File,
        "git stored passwords",
    ),
];

fn normal_components(path: &Path) -> Option<Vec<&std::ffi::OsStr>> {
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::CurDir => {}
            // An absolute path or `..` is not relative to the home: only tails can match.
            Component::RootDir | Component::Prefix(_) | Component::ParentDir => return None,
        }
    }
    Some(out)
}

fn all_components(path: &Path) -> Vec<&std::ffi::OsStr> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s),
            _ => None,
        })
        .collect()
}

impl SecretKind {
    fn parts(&self) -> impl Iterator<Item = &'static str> + Clone {
        self.pattern.split('/')
    }

    /// The home-relative path of a [`Anchor::Home`] entry.
    pub fn home_path(&self) -> Option<PathBuf> {
        (self.anchor == Anchor::Home).then(|| PathBuf::from(self.pattern))
    }

    /// Whether `rel` is this secret or lies inside it.
    fn matches(&self, rel: &Path) -> bool {
        let parts: Vec<&str> = self.parts().collect();
        match self.anchor {
            Anchor::Home => match normal_components(rel) {
                Some(comps) => {
                    comps.len() >= parts.len()
                        && comps
                            .iter()
                            .zip(&parts)
                            .all(|(c, p)| *c == std::ffi::OsStr::new(p))
                }
                None => false,
            },
            Anchor::Anywhere => {
                let comps = all_components(rel);
                // The pattern matches a window that ends at the last component, or (for a
                // directory pattern) at any component: a file inside a secret dir is secret.
                (parts.len()..=comps.len()).any(|end| {
                    let window = &comps[end - parts.len()..end];
                    let is_tail = end == comps.len();
                    (is_tail || self.shape == Shape::Dir)
                        && window
                            .iter()
                            .zip(&parts)
                            .all(|(c, p)| *c == std::ffi::OsStr::new(p))
                })
            }
        }
    }
}

/// The secret `rel` (relative to the home; or absolute, where only [`Anchor::Anywhere`]
/// entries apply) is, or lies inside.
pub fn is_secret(rel: &Path) -> Option<&'static SecretKind> {
    SECRETS.iter().find(|k| k.matches(rel))
}

/// The home-anchored secrets at or below `dir` (relative to the home): the paths a grant of
/// `dir` would expose if they exist. Pure; the caller checks which exist.
pub fn home_secrets_under(dir: &Path) -> Vec<(PathBuf, &'static SecretKind)> {
    let Some(dir_comps) = normal_components(dir) else {
        return Vec::new();
    };
    SECRETS
        .iter()
        .filter(|k| k.anchor == Anchor::Home)
        .filter_map(|k| {
            let parts: Vec<&str> = k.parts().collect();
            (parts.len() >= dir_comps.len()
                && dir_comps
                    .iter()
                    .zip(&parts)
                    .all(|(c, p)| *c == std::ffi::OsStr::new(p)))
            .then(|| (PathBuf::from(k.pattern), k))
        })
        .collect()
}

/// One entry of a directory listing, as the caller's `read_dir` gives it. Symbolic links are
/// reported as files (`is_dir: false`): the walk never follows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedEntry {
    pub name: OsString,
    pub is_dir: bool,
}

/// A secret found under a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretHit {
    /// As passed in: `dir` joined with the entry's relative path.
    pub path: PathBuf,
    pub kind: &'static SecretKind,
}

/// Directories a walk never enters: large, and never where credentials live.
const SKIP_DIRS: &[&str] = &[".git", "node_modules", "target", ".cache", ".rustup"];

/// The secrets at or under `dir` (relative to the home, or absolute), found by walking at most
/// `max_depth` levels through `list` (the caller's `read_dir`: `None` when the directory
/// cannot be read). A secret directory is reported once and not entered.
pub fn secrets_under(
    dir: &Path,
    max_depth: usize,
    mut list: impl FnMut(&Path) -> Option<Vec<ListedEntry>>,
) -> Vec<SecretHit> {
    let mut hits = Vec::new();
    if let Some(kind) = is_secret(dir) {
        hits.push(SecretHit {
            path: dir.to_path_buf(),
            kind,
        });
        return hits;
    }
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    while let Some((d, depth)) = stack.pop() {
        let Some(mut entries) = list(&d) else {
            continue;
        };
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        for e in entries {
            let path = d.join(&e.name);
            if let Some(kind) = is_secret(&path) {
                // A file pattern names a file: a directory of that name is not it.
                if e.is_dir == (kind.shape == Shape::Dir) {
                    hits.push(SecretHit { path, kind });
                    continue;
                }
            }
            if e.is_dir
                && depth + 1 < max_depth
                && !SKIP_DIRS.iter().any(|s| e.name == std::ffi::OsStr::new(s))
            {
                stack.push((path, depth + 1));
            }
        }
    }
    hits.sort_by(|a, b| a.path.cmp(&b.path));
    hits
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn id(rel: &str) -> Option<&'static str> {
        is_secret(Path::new(rel)).map(|k| k.id)
    }

    #[test]
    fn the_list_is_well_formed() {
        let mut ids: Vec<&str> = SECRETS.iter().map(|k| k.id).collect();
        ids.sort_unstable();
        let n = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), n, "duplicate ids");
        for k in SECRETS {
            assert!(
                !k.pattern.starts_with('/') && !k.pattern.ends_with('/'),
                "{}",
                k.id
            );
            assert!(k
                .pattern
                .split('/')
                .all(|p| !p.is_empty() && p != ".." && p != "."));
            // Every entry is found by its own pattern.
            assert_eq!(
                is_secret(Path::new(k.pattern)).map(|f| f.pattern),
                Some(k.pattern)
            );
        }
    }

    #[test]
    fn home_anchored_entries_and_what_is_inside_them() {
        assert_eq!(id(".ssh"), Some("ssh"));
        assert_eq!(id(".ssh/id_ed25519"), Some("ssh"));
        assert_eq!(id("./.aws/credentials"), Some("aws"));
        assert_eq!(id(".gnupg/private-keys-v1.d/x.key"), Some("gnupg"));
        assert_eq!(id(".config/gh/hosts.yml"), Some("gh"));
        assert_eq!(id(".kube/config"), Some("kube"));
        assert_eq!(id(".docker/config.json"), Some("docker"));
        // Not anchored at the home: a project's `.ssh` directory is not the user's keys.
        assert_eq!(id("src/.ssh"), None);
        assert_eq!(id("/etc/ssh"), None);
        assert_eq!(id(".config/gh/config.yml"), None);
        assert_eq!(id(".kube"), None);
        assert_eq!(id(".sshx"), None);
    }

    #[test]
    fn anywhere_entries_match_as_tails() {
        assert_eq!(id(".cargo/credentials.toml"), Some("cargo-credentials"));
        assert_eq!(id(".cargo/credentials"), Some("cargo-credentials-legacy"));
        assert_eq!(
            id("/opt/x/.cargo/credentials.toml"),
            Some("cargo-credentials")
        );
        assert_eq!(id(".npmrc"), Some("npmrc"));
        assert_eq!(id("work/proj/.npmrc"), Some("npmrc"));
        assert_eq!(
            id(".nvm/versions/node/v20.1.0/etc/npmrc"),
            Some("npmrc-global")
        );
        assert_eq!(id(".netrc"), Some("netrc"));
        assert_eq!(id(".pypirc"), Some("pypirc"));
        assert_eq!(id(".git-credentials"), Some("git-credentials"));
        // The toolchain trees themselves are not secrets.
        assert_eq!(id(".cargo"), None);
        assert_eq!(id(".cargo/bin/cargo"), None);
        assert_eq!(id(".cargo/registry/cache"), None);
        assert_eq!(id(".rustup/toolchains"), None);
        assert_eq!(id(".npmrc.bak"), None);
        // A file pattern does not make its "children" secret.
        assert_eq!(id(".npmrc/x"), None);
    }

    #[test]
    fn home_secrets_under_a_granted_dir() {
        let all = home_secrets_under(Path::new(""));
        assert_eq!(
            all.len(),
            SECRETS.iter().filter(|k| k.anchor == Anchor::Home).count()
        );
        let config: Vec<&str> = home_secrets_under(Path::new(".config"))
            .iter()
            .map(|(_, k)| k.id)
            .collect();
        assert!(
            config.contains(&"gh") && config.contains(&"gcloud"),
            "{config:?}"
        );
        assert!(!config.contains(&"ssh"));
        assert!(home_secrets_under(Path::new(".cargo")).is_empty());
        assert!(home_secrets_under(Path::new("/abs")).is_empty());
        let ssh = home_secrets_under(Path::new(".ssh"));
        assert_eq!(ssh.len(), 1);
    }

    /// An in-memory tree: path → entries.
    fn tree(paths: &[&str]) -> BTreeMap<PathBuf, Vec<ListedEntry>> {
        let mut map: BTreeMap<PathBuf, Vec<ListedEntry>> = BTreeMap::new();
        for p in paths {
            let is_dir = p.ends_with('/');
            let p = Path::new(p.trim_end_matches('/'));
            let parent = p.parent().unwrap_or(Path::new("")).to_path_buf();
            let entry = ListedEntry {
                name: p.file_name().unwrap_or_default().to_owned(),
                is_dir,
            };
            let list = map.entry(parent).or_default();
            if !list.contains(&entry) {
                list.push(entry);
            }
            if is_dir {
                map.entry(p.to_path_buf()).or_default();
            }
        }
        map
    }

    #[test]
    fn walk_finds_secrets_and_does_not_enter_them() {
        let t = tree(&[
            ".ssh/",
            ".ssh/id_rsa",
            ".cargo/",
            ".cargo/bin/",
            ".cargo/bin/cargo",
            ".cargo/credentials.toml",
            "proj/",
            "proj/.npmrc",
            "proj/node_modules/",
            "proj/node_modules/x/",
            "proj/node_modules/x/.npmrc",
            "deep/",
            "deep/a/",
            "deep/a/b/",
            "deep/a/b/.netrc",
            ".npmrc/",
        ]);
        let mut listed = Vec::new();
        let hits = secrets_under(Path::new(""), 3, |d| {
            listed.push(d.to_path_buf());
            t.get(d).cloned()
        });
        let got: Vec<(String, &str)> = hits
            .iter()
            .map(|h| (h.path.display().to_string(), h.kind.id))
            .collect();
        assert_eq!(
            got,
            vec![
                (".cargo/credentials.toml".to_string(), "cargo-credentials"),
                (".ssh".to_string(), "ssh"),
                ("proj/.npmrc".to_string(), "npmrc"),
            ]
        );
        // Never entered: the secret dir, node_modules, and deeper than 3 levels.
        assert!(!listed.contains(&PathBuf::from(".ssh")));
        assert!(!listed.contains(&PathBuf::from("proj/node_modules")));
        assert!(listed.contains(&PathBuf::from("deep/a")));
        assert!(!listed.contains(&PathBuf::from("deep/a/b")));
        // Deeper walk finds it.
        let hits = secrets_under(Path::new(""), 4, |d| t.get(d).cloned());
        assert!(hits.iter().any(|h| h.path == Path::new("deep/a/b/.netrc")));
    }

    #[test]
    fn walk_of_a_secret_dir_itself() {
        let hits = secrets_under(Path::new(".aws"), 3, |_| panic!("must not list"));
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].kind.id, "aws");
        let hits = secrets_under(Path::new("/nowhere"), 3, |_| None);
        assert!(hits.is_empty());
    }
}
