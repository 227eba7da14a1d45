//! What every command needs: the user's directories and the trusted configuration.

use crate::config::{self, LoadedConfig};
use crate::paths::Dirs;

pub struct Context {
    pub dirs: Dirs,
    pub loaded: LoadedConfig,
}

impl Context {
    pub fn load() -> anyhow::Result<Self> {
        let dirs = Dirs::from_env();
        let loaded = config::load(&dirs.system_config_file(), &dirs.user_config_file())?;
        tracing::debug!(sources = ?loaded.sources, "configuration loaded");
        Ok(Context { dirs, loaded })
    }

    pub fn config(&self) -> &config::Config {
        &self.loaded.config
    }
}
