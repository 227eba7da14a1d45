//! What every command needs: the user's directories, the trusted configuration and the
//! backends this binary links.

use crate::config::{self, LoadedConfig};
use crate::paths::Dirs;

pub struct Context {
    pub dirs: Dirs,
    pub loaded: LoadedConfig,
    /// The registry of this build's backends, handed to every runner and to the daemon.
    pub backends: sandbox_host::Backends,
}

impl Context {
    pub fn load() -> anyhow::Result<Self> {
        let dirs = Dirs::from_env();
        let loaded = config::load(&dirs.system_config_file(), &dirs.user_config_file())?;
        tracing::debug!(sources = ?loaded.sources, "configuration loaded");
        let backends = crate::registry::backends(&dirs, &loaded.config);
        Ok(Context {
            dirs,
            loaded,
            backends,
        })
    }

    pub fn config(&self) -> &config::Config {
        &self.loaded.config
    }
}
