//! A run's own directory under the quarantines' parent: removed when the run is done, or by
//! a later run when its process is gone.

use std::path::Path;

/// Removes a run directory. overlayfs leaves directories without permissions in its work
/// dir (`work/work`, `incompat/volatile`): ours, so made removable first — root removes them
/// anyway, anyone else would fail.
pub(super) fn remove_run_dir(dir: &Path) {
    make_removable(dir);
    if let Err(e) = std::fs::remove_dir_all(dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "could not remove a git quarantine");
    }
}

fn make_removable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            make_removable(&entry.path());
        }
    }
}

/// Removes run directories whose process is gone (a run that was killed outright).
pub(super) fn remove_abandoned(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH);
        if gone {
            remove_run_dir(&entry.path());
        }
    }
}
