//! The command wrapped for nono: the trampoline that leaves the start mark, then `nono run`
//! or `nono wrap` with the manifest.

use super::*;
use crate::error::HostError;
use sandbox_exec::CommandSpec;
use std::ffi::OsString;

/// Rewrites `spec` to run through nono with `manifest`, behind the trampoline that leaves
/// `marker`. The command is resolved here, on the child's PATH, so "not found" is 127 before
/// anything starts, and nono runs exactly the file that was found.
pub fn wrap(
    spec: &CommandSpec,
    nono: &Nono,
    manifest: &WrittenManifest,
    marker: &StartMarker,
) -> Result<CommandSpec, HostError> {
    let program =
        sandbox_exec::resolve::resolve_program(&spec.program, spec.env_var("PATH"), &spec.cwd)?;
    let mut args: Vec<OsString> = manifest
        .plan
        .invocation
        .flags()
        .iter()
        .map(OsString::from)
        .collect();
    args.extend([
        "-c".into(),
        manifest.path.clone().into_os_string(),
        "--".into(),
        SHELL.into(),
        "-c".into(),
    ]);
    match marker {
        StartMarker::Pipe { .. } => {
            args.extend([TRAMPOLINE_FD.into(), TRAMPOLINE_NAME.into()]);
        }
        StartMarker::File { path } => {
            args.extend([
                TRAMPOLINE_FILE.into(),
                TRAMPOLINE_NAME.into(),
                path.clone().into_os_string(),
            ]);
        }
    }
    args.push(program.into_os_string());
    args.extend(spec.args.iter().cloned());

    let mut wrapped = spec.clone();
    wrapped.program = nono.path.clone().into_os_string();
    wrapped.args = args;
    wrapped.env.retain(|(name, _)| !is_nono_variable(name));
    Ok(wrapped)
}
