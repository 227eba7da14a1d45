//! Where `sandbox` keeps things, following the XDG base directories. None of these is ever
//! inside a task's worktree: configuration and state that decide the boundary must live where
//! the sandboxed process cannot write (docs/security.md, "What holds, and where it is enforced").

use std::path::PathBuf;

/// The directories of this user.
#[derive(Debug, Clone)]
pub struct Dirs {
    /// `$XDG_CONFIG_HOME/sandbox` (user configuration, trusted).
    pub user_config: PathBuf,
    /// `/etc/sandbox` (system configuration, trusted).
    pub system_config: PathBuf,
    /// `$XDG_STATE_HOME/sandbox` (per-task backend choice and the like).
    pub state: PathBuf,
    /// `$XDG_DATA_HOME/sandbox` (sandbox views live under here by default).
    pub data: PathBuf,
    /// `$XDG_RUNTIME_DIR/sandbox`, or `/tmp/sandbox-<uid>` (sockets, tokens, per-run temp).
    pub runtime: PathBuf,
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"))
}

fn xdg(var: &str, fallback: &str) -> PathBuf {
    match std::env::var_os(var) {
        // The spec says relative values are invalid and must be ignored.
        Some(v) if PathBuf::from(&v).is_absolute() => PathBuf::from(v),
        _ => home().join(fallback),
    }
}

impl Dirs {
    pub fn from_env() -> Self {
        let uid = nix::unistd::getuid();
        let runtime = match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(v) if PathBuf::from(&v).is_absolute() => PathBuf::from(v).join("sandbox"),
            _ => std::env::temp_dir().join(format!("sandbox-{uid}")),
        };
        Dirs {
            user_config: xdg("XDG_CONFIG_HOME", ".config").join("sandbox"),
            system_config: PathBuf::from("/etc/sandbox"),
            state: xdg("XDG_STATE_HOME", ".local/state").join("sandbox"),
            data: xdg("XDG_DATA_HOME", ".local/share").join("sandbox"),
            runtime,
        }
    }

    pub fn user_config_file(&self) -> PathBuf {
        self.user_config.join("config.yaml")
    }

    pub fn system_config_file(&self) -> PathBuf {
        self.system_config.join("config.yaml")
    }
}

/// The views root (`commands::view::views_root`) from the directories and configuration
/// themselves: `views.root`, else `$XDG_DATA_HOME/sandbox/views`.
pub fn views_root_in(dirs: &Dirs, config: &crate::config::Config) -> std::path::PathBuf {
    match &config.views.root {
        Some(r) => crate::config::expand_home(r),
        None => dirs.data.join("views"),
    }
}
