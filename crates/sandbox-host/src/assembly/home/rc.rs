//! The shell files of a private home: a minimal rc (no host rc file is read inside) and a
//! profile that keeps the run's PATH for login shells.

use super::*;
use std::path::Path;

/// The minimal shell rc of a new private home: no host rc file is read inside.
pub const SHELL_RC: &str = "\
# The private home of a sandbox (`sandbox home`): none of your own rc files is read here.
# Edit this file to add what you need; `sandbox home reset` starts over.
PS1='[sandbox] \\w \\$ '
";

/// The variable that carries the run's `PATH` to a login shell's profile.
pub const RUN_PATH: &str = "SANDBOX_PATH";

/// The private home's `.profile` (and `.zprofile`): the shell rc, and the run's `PATH` back
/// after the system's profile reset it (Debian's /etc/profile sets a fixed one), so a login
/// shell finds the toolchains the run has (`bash -lc 'cargo test'`, as Codex runs commands).
pub const PROFILE: &str = "\
# The private home of a sandbox (`sandbox home`): none of your own rc files is read here.
# Edit this file to add what you need; `sandbox home reset` starts over.
PS1='[sandbox] \\w \\$ '
# The run's PATH (its toolchains), which the system's profile resets for a login shell.
if [ -n \"${SANDBOX_PATH-}\" ]; then PATH=$SANDBOX_PATH; export PATH; fi
";

pub(super) fn write_shell_rc(dir: &Path) -> std::io::Result<()> {
    for (name, text) in [
        (".bashrc", SHELL_RC),
        (".profile", PROFILE),
        (".zprofile", PROFILE),
    ] {
        let mut f = std::fs::File::create(dir.join(name))?;
        f.write_all(text.as_bytes())?;
    }
    Ok(())
}

/// A home made before login shells got the run's `PATH` has the shell rc as its `.profile`:
/// that one (untouched since) becomes [`PROFILE`]. One the user edited stays as it is. Never
/// through a link the run left in its place (read `O_NOFOLLOW`, replaced by a rename, both
/// in a descriptor of the home).
pub(super) fn upgrade_profile(dir: &Path) -> std::io::Result<()> {
    use std::io::Read as _;
    let home = crate::beneath::Dir::open(dir)?;
    let name = std::ffi::OsStr::new(".profile");
    let mut old = Vec::new();
    match home.open_file(name) {
        Ok(f) => f.take(SHELL_RC.len() as u64 + 1).read_to_end(&mut old)?,
        Err(_) => return Ok(()),
    };
    if old != SHELL_RC.as_bytes() {
        return Ok(());
    }
    home.replace_file(name, PROFILE.as_bytes())
}
