//! Which of the user's toolchains and package caches a run gets, as a pure function over a
//! snapshot of the host ([`HostSnapshot`]: the environment, the home, and what exists). The
//! probing that fills the snapshot lives in `sandbox-host` (`home.rs`).
//!
//! A toolchain is exactly the trees a layout needs (rustup's `~/.rustup` and `~/.cargo/bin`,
//! pyenv's root, nvm's dir, ...) plus each directory of the user's `PATH` that nothing else
//! covers; each is mounted read-only at its real path. A cache is a directory tools download
//! into (`~/.cargo/registry`, `~/.npm`, `~/.cache/pip`, ...), layered copy-on-write.

use std::path::{Path, PathBuf};

/// What the detection may ask of the host. Tests fill it from a map.
pub struct HostSnapshot<'a> {
    /// The user's real home.
    pub home: PathBuf,
    /// The user's `PATH`, split.
    pub path: Vec<PathBuf>,
    /// An environment variable of the user's (non-empty values only).
    pub var: &'a dyn Fn(&str) -> Option<String>,
    /// Whether a directory exists (following links).
    pub is_dir: &'a dyn Fn(&Path) -> bool,
    /// Whether anything exists at the path (a file, a dir, a link).
    pub exists: &'a dyn Fn(&Path) -> bool,
    /// Directories the sandbox shows anyway (the system ones): a `PATH` entry inside them
    /// is no toolchain of its own.
    pub system: Vec<PathBuf>,
}

/// A detected toolchain (see [`crate::model::Toolchain`]), before configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detected {
    pub name: String,
    pub kind: String,
    pub paths: Vec<PathBuf>,
    /// Variables of the user's that locate it (`RUSTUP_HOME`), passed into the run.
    pub pass: Vec<String>,
}

/// A known package cache at its host path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetectedCache {
    pub name: &'static str,
    pub path: PathBuf,
}

impl HostSnapshot<'_> {
    fn dir_var(&self, name: &str) -> Option<PathBuf> {
        (self.var)(name)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    }

    /// `$VAR`, else `~/default`.
    fn located(&self, var: &str, default: &str) -> PathBuf {
        self.dir_var(var).unwrap_or_else(|| self.home.join(default))
    }

    fn cargo_home(&self) -> PathBuf {
        self.located("CARGO_HOME", ".cargo")
    }

    fn xdg(&self, var: &str, default: &str) -> PathBuf {
        self.located(var, default)
    }
}

/// Names a `PATH` directory by the programs it holds.
const BY_PROGRAM: &[(&str, &str)] = &[
    ("cargo", "rust"),
    ("rustc", "rust"),
    ("node", "node"),
    ("npm", "node"),
    ("python3", "python"),
    ("go", "go"),
    ("java", "java"),
    ("bun", "bun"),
    ("deno", "deno"),
];

/// The toolchains of this host, in a stable order. A layout counts when its root exists.
pub fn detect(host: &HostSnapshot<'_>) -> Vec<Detected> {
    let mut found: Vec<Detected> = Vec::new();
    let add =
        |found: &mut Vec<Detected>, name: &str, kind: &str, paths: Vec<PathBuf>, pass: &[&str]| {
            let paths: Vec<PathBuf> = paths.into_iter().filter(|p| (host.exists)(p)).collect();
            if paths.is_empty() {
                return;
            }
            match found.iter_mut().find(|d| d.name == name) {
                Some(d) => {
                    for p in paths {
                        if !d.paths.contains(&p) {
                            d.paths.push(p);
                        }
                    }
                }
                None => found.push(Detected {
                    name: name.into(),
                    kind: kind.into(),
                    paths,
                    pass: pass
                        .iter()
                        .filter(|v| (host.var)(v).is_some())
                        .map(|v| v.to_string())
                        .collect(),
                }),
            }
        };
    let rustup = host.located("RUSTUP_HOME", ".rustup");
    if (host.is_dir)(&rustup) || (host.is_dir)(&host.cargo_home().join("bin")) {
        add(
            &mut found,
            "rust",
            "rustup",
            vec![rustup, host.cargo_home().join("bin")],
            &["RUSTUP_HOME", "CARGO_HOME", "RUSTUP_TOOLCHAIN"],
        );
    }
    let layouts: &[(&str, &str, &str, &str)] = &[
        ("python", "pyenv", "PYENV_ROOT", ".pyenv"),
        ("node", "nvm", "NVM_DIR", ".nvm"),
        ("node", "volta", "VOLTA_HOME", ".volta"),
        ("mise", "mise", "MISE_DATA_DIR", ".local/share/mise"),
        ("asdf", "asdf", "ASDF_DATA_DIR", ".asdf"),
        ("java", "sdkman", "SDKMAN_DIR", ".sdkman"),
        ("bun", "bun", "BUN_INSTALL", ".bun"),
        ("deno", "deno", "DENO_INSTALL", ".deno"),
    ];
    for (name, kind, var, default) in layouts {
        let root = host.located(var, default);
        if (host.is_dir)(&root) {
            add(&mut found, name, kind, vec![root], &[var]);
        }
    }
    // Go: its root when installed in the home, and the binaries `go install` puts in GOPATH.
    let gopath = host.located("GOPATH", "go");
    let mut go = vec![gopath.join("bin")];
    if let Some(root) = host.dir_var("GOROOT") {
        go.push(root);
    }
    if go.iter().any(|p| (host.is_dir)(p)) {
        add(&mut found, "go", "go", go, &["GOROOT", "GOPATH"]);
    }
    // Nix: the user's profile links and the profiles they point into (the store is a
    // system directory already).
    let nix = vec![
        host.home.join(".nix-profile"),
        host.home.join(".local/state/nix/profiles"),
        PathBuf::from("/nix/var/nix/profiles"),
    ];
    if (host.exists)(&nix[0]) || (host.is_dir)(&nix[1]) {
        add(&mut found, "nix", "nix profile", nix, &[]);
    }
    // Every other PATH directory: named by what it holds, or as itself.
    for dir in &host.path {
        if !dir.is_absolute() || !(host.is_dir)(dir) {
            continue;
        }
        let covered = found
            .iter()
            .any(|d| d.paths.iter().any(|p| dir.starts_with(p)))
            || host.system.iter().any(|s| dir.starts_with(s));
        if covered {
            continue;
        }
        let by_program = BY_PROGRAM
            .iter()
            .find(|(program, _)| (host.exists)(&dir.join(program)))
            .map(|(_, name)| *name);
        let name = match by_program {
            Some(name) => name.to_string(),
            None if *dir == host.home.join(".local/bin") => "local-bin".to_string(),
            None => path_name(dir, &host.home),
        };
        add(&mut found, &name, "PATH", vec![dir.clone()], &[]);
    }
    found
}

/// `~/bin` → `home-bin`, `/snap/bin` → `snap-bin`: a name for a `PATH` directory.
fn path_name(dir: &Path, home: &Path) -> String {
    let (prefix, rest) = match dir.strip_prefix(home) {
        Ok(rest) => ("home-", rest),
        Err(_) => ("", dir),
    };
    let tail: Vec<String> = rest
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(s) => {
                Some(s.to_string_lossy().trim_start_matches('.').to_string())
            }
            _ => None,
        })
        .collect();
    format!("{prefix}{}", tail.join("-"))
}

/// The package caches of this host that exist, by name.
pub fn detect_caches(host: &HostSnapshot<'_>) -> Vec<DetectedCache> {
    let cargo = host.cargo_home();
    let cache = host.xdg("XDG_CACHE_HOME", ".cache");
    let data = host.xdg("XDG_DATA_HOME", ".local/share");
    let gopath = host.located("GOPATH", "go");
    let candidates: Vec<(&'static str, PathBuf)> = vec![
        ("cargo-registry", cargo.join("registry")),
        ("cargo-git", cargo.join("git")),
        ("npm", host.home.join(".npm")),
        ("pnpm", data.join("pnpm/store")),
        ("yarn", cache.join("yarn")),
        ("yarn-berry", host.home.join(".yarn/berry/cache")),
        ("pip", cache.join("pip")),
        ("uv", cache.join("uv")),
        (
            "go-mod",
            host.dir_var("GOMODCACHE")
                .unwrap_or_else(|| gopath.join("pkg/mod")),
        ),
        (
            "go-build",
            host.dir_var("GOCACHE")
                .unwrap_or_else(|| cache.join("go-build")),
        ),
        ("maven", host.home.join(".m2/repository")),
        ("gradle", host.home.join(".gradle/caches")),
        ("gradle-wrapper", host.home.join(".gradle/wrapper")),
    ];
    candidates
        .into_iter()
        .filter(|(_, path)| (host.is_dir)(path))
        .map(|(name, path)| DetectedCache { name, path })
        .collect()
}

/// Which toolchains a run mounts: `auto` (every detected one), `none`, or a list of names;
/// `--toolchain NAME` adds, `--no-toolchains` removes all but those named on the command line.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Selection {
    #[default]
    Auto,
    None,
    Only(Vec<String>),
}

impl Selection {
    /// Whether `name` is mounted, given names added on the command line.
    pub fn enables(&self, name: &str, added: &[String]) -> bool {
        added.iter().any(|a| a == name)
            || match self {
                Selection::Auto => true,
                Selection::None => false,
                Selection::Only(names) => names.iter().any(|n| n == name),
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    struct Fake {
        dirs: BTreeSet<PathBuf>,
        files: BTreeSet<PathBuf>,
        vars: BTreeMap<String, String>,
    }

    impl Fake {
        fn new(dirs: &[&str], files: &[&str], vars: &[(&str, &str)]) -> Self {
            Fake {
                dirs: dirs.iter().map(PathBuf::from).collect(),
                files: files.iter().map(PathBuf::from).collect(),
                vars: vars
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            }
        }

        fn run<T>(&self, path: &str, f: impl FnOnce(&HostSnapshot<'_>) -> T) -> T {
            let var = |n: &str| self.vars.get(n).cloned();
            let is_dir = |p: &Path| self.dirs.contains(p);
            let exists = |p: &Path| self.dirs.contains(p) || self.files.contains(p);
            let host = HostSnapshot {
                home: "/home/u".into(),
                path: std::env::split_paths(path).collect(),
                var: &var,
                is_dir: &is_dir,
                exists: &exists,
                system: vec!["/usr".into(), "/bin".into()],
            };
            f(&host)
        }
    }

    fn names(found: &[Detected]) -> Vec<(&str, Vec<&str>)> {
        found
            .iter()
            .map(|d| {
                (
                    d.name.as_str(),
                    d.paths.iter().map(|p| p.to_str().unwrap()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn rustup_pyenv_nvm_and_path_dirs_are_found_as_exactly_their_trees() {
        let fake = Fake::new(
            &[
                "/home/u/.rustup",
                "/home/u/.cargo",
                "/home/u/.cargo/bin",
                "/home/u/.cargo/registry",
                "/home/u/.pyenv",
                "/home/u/.pyenv/shims",
                "/home/u/.nvm",
                "/home/u/.local/bin",
                "/home/u/bin",
                "/opt/tools/bin",
                "/usr/bin",
            ],
            &["/opt/tools/bin/node"],
            &[],
        );
        let found = fake.run(
            "/home/u/.cargo/bin:/home/u/.pyenv/shims:/home/u/.local/bin:/home/u/bin:/opt/tools/bin:/usr/bin:relative:/missing",
            detect,
        );
        assert_eq!(
            names(&found),
            vec![
                ("rust", vec!["/home/u/.rustup", "/home/u/.cargo/bin"]),
                ("python", vec!["/home/u/.pyenv"]),
                ("node", vec!["/home/u/.nvm", "/opt/tools/bin"]),
                ("local-bin", vec!["/home/u/.local/bin"]),
                ("home-bin", vec!["/home/u/bin"]),
            ]
        );
        // Never the whole ~/.cargo (credentials, the registry cache): only its bin.
        assert!(!found
            .iter()
            .any(|d| d.paths.contains(&"/home/u/.cargo".into())));
    }

    #[test]
    fn variables_move_the_layouts_and_are_passed() {
        let fake = Fake::new(
            &["/opt/rustup", "/srv/cargo/bin", "/srv/cargo/registry"],
            &[],
            &[("RUSTUP_HOME", "/opt/rustup"), ("CARGO_HOME", "/srv/cargo")],
        );
        let found = fake.run("/srv/cargo/bin:/usr/bin", detect);
        assert_eq!(
            names(&found),
            vec![("rust", vec!["/opt/rustup", "/srv/cargo/bin"])]
        );
        assert_eq!(found[0].pass, vec!["RUSTUP_HOME", "CARGO_HOME"]);
        let caches = fake.run("", detect_caches);
        assert_eq!(
            caches,
            vec![DetectedCache {
                name: "cargo-registry",
                path: "/srv/cargo/registry".into()
            }]
        );
    }

    #[test]
    fn a_path_dir_holding_cargo_joins_the_rust_toolchain() {
        // The test setup of this repository: rustup elsewhere, on PATH, a home of its own.
        let fake = Fake::new(
            &["/root/.rustup", "/root/.cargo/bin"],
            &["/root/.cargo/bin/cargo"],
            &[("RUSTUP_HOME", "/root/.rustup")],
        );
        let found = fake.run("/root/.cargo/bin:/usr/bin", detect);
        assert_eq!(
            names(&found),
            vec![("rust", vec!["/root/.rustup", "/root/.cargo/bin"])]
        );
    }

    #[test]
    fn nothing_installed_nothing_found() {
        let fake = Fake::new(&["/usr/bin"], &[], &[]);
        assert!(fake.run("/usr/bin:/bin", detect).is_empty());
        assert!(fake.run("/usr/bin", detect_caches).is_empty());
    }

    #[test]
    fn caches_are_found_where_the_tools_put_them() {
        let fake = Fake::new(
            &[
                "/home/u/.npm",
                "/home/u/.cache/pip",
                "/xdg/cache/uv",
                "/home/u/go/pkg/mod",
                "/home/u/.m2/repository",
            ],
            &[],
            &[],
        );
        let got: Vec<&str> = fake.run("", detect_caches).iter().map(|c| c.name).collect();
        assert_eq!(got, vec!["npm", "pip", "go-mod", "maven"]);
        let fake = Fake::new(&["/xdg/cache/uv"], &[], &[("XDG_CACHE_HOME", "/xdg/cache")]);
        let got: Vec<&str> = fake.run("", detect_caches).iter().map(|c| c.name).collect();
        assert_eq!(got, vec!["uv"]);
    }

    #[test]
    fn selection() {
        assert!(Selection::Auto.enables("rust", &[]));
        assert!(!Selection::None.enables("rust", &[]));
        assert!(Selection::None.enables("rust", &["rust".into()]));
        let only = Selection::Only(vec!["node".into()]);
        assert!(only.enables("node", &[]) && !only.enables("rust", &[]));
    }
}
