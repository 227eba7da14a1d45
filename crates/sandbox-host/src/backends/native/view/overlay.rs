//! overlayfs's mount options for the git store quarantine's layers, built in the parent.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use super::cstring;
use crate::error::HostError;

/// overlayfs's mount options cannot carry these in a path without escapes, and a wrong
/// escape would mount another directory: such a path is refused instead.
fn overlay_path(path: &Path) -> Result<String, HostError> {
    match path.to_str() {
        Some(p) if !p.contains([',', ':', '\\']) => Ok(p.to_string()),
        _ => Err(HostError::ViewPath {
            path: path.to_path_buf(),
            cause: "the git store quarantine cannot layer a path containing ',', ':' or '\\' \
                    (or one that is not UTF-8); move the repository, or pass --unprotected-git \
                    to run without the quarantine"
                .into(),
        }),
    }
}

/// The options of an overlay of `lower` (the first on top) under the writable `upper`.
pub(super) fn overlay_options(
    lower: &[PathBuf],
    upper: &Path,
    work: &Path,
) -> Result<CString, HostError> {
    let lower: Vec<String> = lower
        .iter()
        .map(|p| overlay_path(p))
        .collect::<Result<_, _>>()?;
    // userxattr: the only way a user namespace may mount an overlay (its metadata goes in
    // user.overlay.* attributes of the private layer). volatile: no syncfs of the upper
    // filesystem when the run's namespace goes away — that would flush every dirty page of
    // the whole filesystem the private dir is on (tens of ms beside a build); the layer is
    // read back from the page cache and thrown away, so it never needs to survive a crash.
    let options = format!(
        "lowerdir={},upperdir={},workdir={},userxattr,volatile",
        lower.join(":"),
        overlay_path(upper)?,
        overlay_path(work)?
    );
    cstring(Path::new(&options))
}
