//! The registry of what this binary links ([`backends`]): this crate's four backends, Lima
//! with its trusted settings, and BoxLite's refusing form when built with the cargo feature
//! `boxlite`. A leaf the context builds once, for the CLI and the daemon alike.

use std::path::{Path, PathBuf};

use sandbox_host::Backends;

use crate::config::expand_home;

/// The backends this binary links, for the CLI and the daemon alike: this crate's four, Lima,
/// and BoxLite when built with the cargo feature `boxlite`.
pub fn backends(dirs: &crate::paths::Dirs, config: &crate::config::Config) -> Backends {
    let dirs = dirs.clone();
    let views_root = crate::paths::views_root_in(&dirs, config);
    let linked = Backends::builtin().with(sandbox_lima::LimaProvider(move || {
        lima_settings_in(&dirs, &views_root)
    }));
    #[cfg(feature = "boxlite")]
    let linked = linked.with(sandbox_boxlite::BoxliteProvider::refusing());
    linked
}

pub fn lima_settings_in(
    dirs: &crate::paths::Dirs,
    views_root: &Path,
) -> sandbox_lima::LimaSettings {
    let home = std::env::var_os("SANDBOX_LIMA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| expand_home(Path::new("~/.sandbox-lima")));
    sandbox_lima::LimaSettings {
        limactl: crate::tools::LIMACTL.resolve(None).path,
        home,
        views_root: views_root.to_path_buf(),
        runtime_dir: dirs.runtime.clone(),
        nix_image: crate::tools::LIMA_IMAGE.resolve(None).path,
        overrides_dir: dirs.user_config.join("lima"),
        private_dir: dirs.runtime.clone(),
        vhost_user_dirs: sandbox_lima::virtiofs::search_dirs_here(),
        start_timeout: lima_start_timeout(),
    }
}

/// `SANDBOX_LIMA_START_TIMEOUT` (`90s`, `30m`, `1h`): how long `limactl start` waits for a
/// VM. Anything else is named and not passed on: Lima's default applies.
fn lima_start_timeout() -> Option<String> {
    let value = std::env::var("SANDBOX_LIMA_START_TIMEOUT").ok()?;
    if value.is_empty() {
        return None;
    }
    if sandbox_lima::limactl::is_start_timeout(&value) {
        Some(value)
    } else {
        eprintln!(
            "sandbox: SANDBOX_LIMA_START_TIMEOUT={value:?} is not a number of seconds, minutes \
             or hours (90s, 30m, 1h): Lima's own 10 minutes apply"
        );
        None
    }
}
