//! External tools and images: where each is found, in this order — the tool's variable at run
//! time (`SANDBOX_NONO`), the configuration (`backends.nono.path`), the path the package was
//! built with, then `PATH`. `sandbox doctor` shows which one won.
//!
//! "The path the package was built with" is a second variable, `SANDBOX_PACKAGE_NONO`, which
//! the Nix package's wrapper sets (`makeBinaryWrapper --set-default`, see flake.nix) rather
//! than a constant compiled in: the binary is then built once, and changing a tool only
//! re-wraps it instead of recompiling the workspace with fat LTO. doctor calls it "baked".

use std::path::{Path, PathBuf};

use serde::Serialize;

/// Where a tool's path came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// Set by the package's wrapper (`SANDBOX_PACKAGE_<TOOL>`).
    Baked,
    /// The variable set at run time.
    Env,
    /// The user or system configuration.
    Config,
    /// Found on `PATH`.
    Path,
    Missing,
}

impl Source {
    /// The name `doctor --json` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Baked => "baked",
            Source::Env => "env",
            Source::Config => "config",
            Source::Path => "path",
            Source::Missing => "missing",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ToolPath {
    pub name: &'static str,
    pub variable: &'static str,
    pub path: Option<PathBuf>,
    pub source: Source,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// A tool this product drives, with the variable that pins it.
pub struct Tool {
    pub name: &'static str,
    pub variable: &'static str,
    /// The variable the package's wrapper sets to the tool it was built with.
    pub package_variable: &'static str,
    /// Flag that prints the version (`None`: an image, not a program).
    pub version_flag: Option<&'static str>,
}

pub const NONO: Tool = Tool {
    name: "nono",
    variable: "SANDBOX_NONO",
    package_variable: "SANDBOX_PACKAGE_NONO",
    version_flag: Some("--version"),
};
pub const LIMACTL: Tool = Tool {
    name: "limactl",
    variable: "SANDBOX_LIMACTL",
    package_variable: "SANDBOX_PACKAGE_LIMACTL",
    version_flag: Some("--version"),
};
pub const MKE2FS: Tool = Tool {
    name: "mke2fs",
    variable: "SANDBOX_MKE2FS",
    package_variable: "SANDBOX_PACKAGE_MKE2FS",
    version_flag: Some("-V"),
};
pub const BWRAP: Tool = Tool {
    name: "bwrap",
    variable: "SANDBOX_BWRAP",
    package_variable: "SANDBOX_PACKAGE_BWRAP",
    version_flag: Some("--version"),
};
pub const LIMA_IMAGE: Tool = Tool {
    name: "lima-image",
    variable: "SANDBOX_LIMA_IMAGE",
    package_variable: "SANDBOX_PACKAGE_LIMA_IMAGE",
    version_flag: None,
};
pub const BOX_IMAGE: Tool = Tool {
    name: "box-image",
    variable: "SANDBOX_BOX_IMAGE",
    package_variable: "SANDBOX_PACKAGE_BOX_IMAGE",
    version_flag: None,
};

pub const ALL: &[&Tool] = &[&NONO, &LIMACTL, &MKE2FS, &BWRAP, &LIMA_IMAGE, &BOX_IMAGE];

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

impl Tool {
    /// Resolves the tool; `configured` is the config file's path for it, if any.
    pub fn resolve(&self, configured: Option<&Path>) -> ToolPath {
        let (path, source) = if let Some(p) =
            std::env::var_os(self.variable).filter(|v| !v.is_empty())
        {
            (Some(PathBuf::from(p)), Source::Env)
        } else if let Some(p) = configured {
            (Some(p.to_path_buf()), Source::Config)
        } else if let Some(p) = std::env::var_os(self.package_variable).filter(|v| !v.is_empty()) {
            (Some(PathBuf::from(p)), Source::Baked)
        } else if self.version_flag.is_some() {
            match on_path(self.name) {
                Some(p) => (Some(p), Source::Path),
                None => (None, Source::Missing),
            }
        } else {
            (None, Source::Missing)
        };
        ToolPath {
            name: self.name,
            variable: self.variable,
            path,
            source,
            version: None,
        }
    }

    /// Resolves and asks the tool for its version (first line of its output).
    pub fn resolve_with_version(&self, configured: Option<&Path>) -> ToolPath {
        let mut found = self.resolve(configured);
        if let (Some(path), Some(flag)) = (&found.path, self.version_flag) {
            if let Ok(out) = std::process::Command::new(path)
                .arg(flag)
                .stdin(std::process::Stdio::null())
                .output()
            {
                let text = if out.stdout.is_empty() {
                    out.stderr
                } else {
                    out.stdout
                };
                found.version = String::from_utf8_lossy(&text)
                    .lines()
                    .next()
                    .map(|l| l.trim().to_string())
                    .filter(|l| !l.is_empty());
            }
        }
        found
    }
}
