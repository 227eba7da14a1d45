//! After a run: the git repositories an agent keeps in its own writable state (Gemini CLI's
//! checkpoints under `~/.gemini/history/<project>/.git`, opencode's snapshots under
//! `~/.local/share/opencode/snapshot/<project>/<worktree>`) hold nothing that runs code when
//! the host's agent next runs git in them.
//!
//! The host's agent runs `git add`, `status`, `commit`, `diff-files`, `write-tree`, `gc` there
//! with the repository's own config, so a run that writes the directory could otherwise plant
//! a `core.fsmonitor`, a `filter.<driver>.clean`, a `gpg.program` with `commit.gpgSign`, a
//! hook, or a pointer (`commondir`, a `.git` file) to a repository of its own; and Gemini CLI
//! writes `.gitconfig` and `.gitignore` beside `.git` with `fs.writeFile`, which follows a
//! link there to any file of the user's. One audit serves every agent (the profile marks
//! such a path `audit: git`), with rules stricter than git's reading:
//!
//! * anything that is neither a directory nor a regular file with one name (a link, a FIFO,
//!   a device, a hard link) is set aside, anywhere in the tree;
//! * a regular file named `.git` (a pointer git follows to another repository) is set aside;
//! * config — `config` and `config.worktree` in a git dir, `.gitconfig*` anywhere (Gemini
//!   CLI's `GIT_CONFIG_GLOBAL` and `GIT_CONFIG_SYSTEM`) — is parsed by git itself and set
//!   aside unless every key is one of [`ALLOWED`], the data keys `git init` and the agents
//!   write (no key that names a program, a driver, a hook path or another file);
//! * in a git dir: `hooks/` holds only git's `*.sample` files; `commondir`, `gitdir`,
//!   `worktrees/` and `objects/info/http-alternates` are set aside; `objects/info/alternates`
//!   is kept only as absolute paths of `objects` directories (opencode shares the project's
//!   object store that way: objects are data, nothing in them runs);
//! * the object store itself (`objects/` but its `info/`) is not walked: data only, and
//!   the biggest part of such a tree.
//!
//! What is set aside is renamed to `<name>.sandbox-set-aside-<random>` in its directory, a
//! name neither git nor the agent reads (and the next audit passes over), never deleted. Like the worktree's git dir audit,
//! this works relative to descriptors opened `O_NOFOLLOW`.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::fcntl::renameat;
use nix::sys::stat::SFlag;
use sandbox_git::quarantine::gitformats::config_entries;

use super::gitdir::{
    describe, names, open_dir, open_subdir, plain_file, read_at, GitDirReport, SetAside,
};
use super::{file_type, fresh_name, lstat_at};

/// The config keys an agent's repository may carry (as git lists them: section and name in
/// lower case), each with the values allowed (`None`: any). All are data: none names a
/// program, a driver, a hook path, an include or another repository.
pub const ALLOWED: &[(&str, Option<&[&str]>)] = &[
    // `git init`.
    ("core.repositoryformatversion", None),
    ("core.filemode", None),
    ("core.bare", None),
    ("core.logallrefupdates", None),
    ("core.ignorecase", None),
    ("core.precomposeunicode", None),
    ("core.symlinks", None),
    ("extensions.objectformat", None),
    ("extensions.refstorage", None),
    // opencode's snapshot init (packages/opencode/src/snapshot/index.ts).
    ("core.autocrlf", None),
    ("core.longpaths", None),
    ("core.quotepath", None),
    ("core.untrackedcache", None),
    // Off only: a path there is a program git runs (`""` is a bare key, git's own daemon).
    ("core.fsmonitor", Some(&["false", "no", "off", "0", ""])),
    ("feature.manyfiles", None),
    ("index.version", None),
    ("index.threads", None),
    ("gc.auto", None),
    // Gemini CLI's `.gitconfig` (packages/core/src/services/gitService.ts).
    ("user.name", None),
    ("user.email", None),
    // Off only: signing runs `gpg.program`.
    ("commit.gpgsign", Some(&["false", "no", "off", "0"])),
];

/// Deeper than any repository an agent keeps (`refs/heads/a/b/…` included): a deeper tree is
/// set aside rather than walked.
const MAX_DEPTH: usize = 48;

/// Why `bytes` (a config file) may not stay, if it may not.
fn config_problem(bytes: &[u8]) -> Option<String> {
    let entries = match config_entries(bytes) {
        Ok(entries) => entries,
        Err(e) => return Some(e),
    };
    entries.iter().find_map(|(key, value)| {
        let allowed = ALLOWED.iter().find(|(k, _)| k == key);
        match allowed {
            None => Some(format!(
                "config with {key:?}, not one of the data keys an agent's repository carries \
                 (the host's agent runs git with this config)"
            )),
            Some((_, Some(values))) if !values.contains(&value.to_ascii_lowercase().as_str()) => {
                Some(format!(
                    "config with {key} = {value:?}, which makes the host's git run a program"
                ))
            }
            Some(_) => None,
        }
    })
}

/// Why an `objects/info/alternates` may not stay, if it may not: each line must be an
/// absolute path ending in `/objects` (what opencode's seeding writes), with no `.` or `..`.
fn alternates_problem(bytes: &[u8]) -> Option<String> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Some("alternates that are not UTF-8".into());
    };
    let objects_dir = |line: &str| {
        let path = Path::new(line);
        path.is_absolute()
            && path.file_name() == Some(OsStr::new("objects"))
            && !line.split('/').any(|c| c == "." || c == "..")
    };
    text.lines().find(|line| !objects_dir(line)).map(|line| {
        format!("alternates line {line:?} is not an absolute path to an `objects` directory")
    })
}

/// What an earlier audit set aside: a name neither git nor the agent reads.
fn set_aside_before(name: &OsStr) -> bool {
    name.to_string_lossy().contains(".sandbox-set-aside-")
}

/// Whether the directory `dir` looks like a git dir (broader than git's own test: any one
/// of the names git needs or reads there).
fn is_git_dir(dir: &File) -> bool {
    ["HEAD", "objects", "refs", "config", "hooks", "commondir"]
        .iter()
        .any(|n| matches!(lstat_at(dir, OsStr::new(n)), Ok(Some(_))))
}

struct Walk {
    report: GitDirReport,
}

impl Walk {
    /// Renames `name` of `dir` (at `path`) aside in the same directory, and reports it.
    fn set_aside(&mut self, dir: &File, name: &OsStr, path: &Path, found: String, why: String) {
        let mut entry = SetAside {
            path: path.to_path_buf(),
            found,
            why,
            moved_to: None,
            error: None,
        };
        let at = Some(dir.as_raw_fd());
        let moved = fresh_name("", name, "sandbox-set-aside").and_then(|aside| {
            renameat(at, name, at, aside.as_os_str())
                .map_err(std::io::Error::from)
                .map(|()| aside)
        });
        match moved {
            Ok(aside) => entry.moved_to = Some(path.with_file_name(aside)),
            Err(e) => entry.error = Some(e.to_string()),
        }
        self.report.set_aside.push(entry);
    }

    /// Judges every entry of `dir` (at `path`); `git`: `dir` is a git dir.
    fn dir(&mut self, dir: &File, path: &Path, depth: usize) {
        let git = is_git_dir(dir);
        let mut entries = names(dir);
        entries.sort();
        for name in entries.into_iter().filter(|n| !set_aside_before(n)) {
            let at = path.join(&name);
            let Ok(Some(st)) = lstat_at(dir, &name) else {
                continue;
            };
            let text = name.to_string_lossy();
            let is_dir = file_type(&st) == SFlag::S_IFDIR;
            let problem = if is_dir {
                match text.as_ref() {
                    "worktrees" if git => Some(
                        "a git dir's worktrees, each with its own pointers and config (no \
                         agent makes worktrees in its own repository)"
                            .to_string(),
                    ),
                    "hooks" if git => {
                        if let Ok(sub) = open_subdir(dir, &name) {
                            self.hooks(&sub, &at);
                        }
                        None
                    }
                    "objects" if git => {
                        if let Ok(sub) = open_subdir(dir, &name) {
                            self.objects(&sub, &at);
                        }
                        None
                    }
                    _ if depth >= MAX_DEPTH => {
                        Some(format!("deeper than the {MAX_DEPTH} levels checked"))
                    }
                    _ => {
                        match open_subdir(dir, &name) {
                            Ok(sub) => self.dir(&sub, &at, depth + 1),
                            Err(e) => self.report.notes.push(format!(
                                "git: {} cannot be checked ({e}); look at it before the agent \
                                 runs on the host",
                                at.display()
                            )),
                        }
                        None
                    }
                }
            } else if !plain_file(&st) {
                Some("the host's git or agent would follow it, or block on it".to_string())
            } else if text == ".git" {
                Some(
                    "a `.git` file is a pointer git follows to a repository anywhere (whose \
                     config and hooks would then run)"
                        .to_string(),
                )
            } else if text.starts_with(".gitconfig")
                || git && matches!(text.as_ref(), "config" | "config.worktree")
            {
                match read_at(dir, &name, 1 << 20) {
                    Ok(bytes) => config_problem(&bytes),
                    Err(e) => Some(format!("config that cannot be read whole: {e}")),
                }
            } else if git && matches!(text.as_ref(), "commondir" | "gitdir") {
                Some("a pointer git follows to another repository".to_string())
            } else {
                None
            };
            if let Some(why) = problem {
                self.set_aside(dir, &name, &at, describe(&st), why);
            }
        }
    }

    /// `hooks/`: git's own `*.sample` files only.
    fn hooks(&mut self, dir: &File, path: &Path) {
        for name in names(dir).into_iter().filter(|n| !set_aside_before(n)) {
            let Ok(Some(st)) = lstat_at(dir, &name) else {
                continue;
            };
            if plain_file(&st) && name.to_string_lossy().ends_with(".sample") {
                continue;
            }
            let why = "a hook (git runs it by name) where only git's samples belong".to_string();
            self.set_aside(dir, &name, &path.join(&name), describe(&st), why);
        }
    }

    /// A directory git reads data from: anything but a plain file is set aside.
    fn plain_only(&mut self, dir: &File, path: &Path) {
        for name in names(dir).into_iter().filter(|n| !set_aside_before(n)) {
            let Ok(Some(st)) = lstat_at(dir, &name) else {
                continue;
            };
            if !plain_file(&st) {
                let why = "git would follow it, or block on it".to_string();
                self.set_aside(dir, &name, &path.join(&name), describe(&st), why);
            }
        }
    }

    /// `objects/`: only `info/` is judged (the objects and packs are data).
    fn objects(&mut self, dir: &File, path: &Path) {
        let info = OsStr::new("info");
        let Ok(Some(st)) = lstat_at(dir, info) else {
            return;
        };
        let at = path.join(info);
        if file_type(&st) != SFlag::S_IFDIR {
            let why = "git expects a directory there and would follow it".to_string();
            self.set_aside(dir, info, &at, describe(&st), why);
            return;
        }
        let Ok(sub) = open_subdir(dir, info) else {
            return;
        };
        for name in names(&sub).into_iter().filter(|n| !set_aside_before(n)) {
            let Ok(Some(st)) = lstat_at(&sub, &name) else {
                continue;
            };
            let problem = if file_type(&st) == SFlag::S_IFDIR {
                // `commit-graphs/` (a split commit-graph `git gc` may write): plain files only.
                if let Ok(inner) = open_subdir(&sub, &name) {
                    self.plain_only(&inner, &at.join(&name));
                }
                None
            } else if !plain_file(&st) {
                Some("git would follow it, or block on it".to_string())
            } else {
                match name.to_str() {
                    Some("alternates") => match read_at(&sub, &name, 1 << 20) {
                        Ok(bytes) => alternates_problem(&bytes),
                        Err(e) => Some(format!("alternates that cannot be read whole: {e}")),
                    },
                    Some("http-alternates") => {
                        Some("alternates fetched over http: no agent writes them".to_string())
                    }
                    _ => None,
                }
            };
            if let Some(why) = problem {
                self.set_aside(&sub, &name, &at.join(&name), describe(&st), why);
            }
        }
    }
}

/// Audits the git repositories under each of `roots` (an agent profile's `audit: git`
/// paths) once every process of the run is gone, and sets aside what could run code on the
/// host (see the module comment).
pub fn audit_agent_repos(roots: &[PathBuf]) -> GitDirReport {
    let mut walk = Walk {
        report: GitDirReport::default(),
    };
    for root in roots {
        match open_dir(root) {
            Ok(dir) => walk.dir(&dir, root, 0),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => walk.report.notes.push(format!(
                "git: the agent's repositories under {} cannot be checked after the run ({e}); \
                 do not start the agent on the host before looking at them",
                root.display()
            )),
        }
    }
    walk.report
}

#[cfg(test)]
mod tests;
