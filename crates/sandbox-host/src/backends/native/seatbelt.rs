//! The native backend on macOS: the policy's SBPL profile, enforced by running the command
//! through `/usr/bin/sandbox-exec -p PROFILE`. `sandbox_init` would allocate between fork and
//! exec, which is not sound in a multi-threaded parent; the system's launcher applies the
//! same profile from a fresh process instead.

use std::ffi::OsString;
use std::path::Path;

use sandbox_exec::CommandSpec;
use sandbox_policy::Policy;

pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";

/// Rewrites `spec` to run under Seatbelt with `policy`'s profile. `program` must already be
/// resolved to an absolute path (so it can never be read as an option of sandbox-exec).
pub fn wrap(policy: &Policy, spec: &CommandSpec, program: &Path) -> CommandSpec {
    let profile = sandbox_policy::compile::seatbelt::compile(policy);
    let mut wrapped = spec.clone();
    wrapped.program = SANDBOX_EXEC.into();
    let mut args: Vec<OsString> = vec!["-p".into(), profile.into(), program.into()];
    args.extend(spec.args.iter().cloned());
    wrapped.args = args;
    wrapped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_the_argv_unchanged_after_the_profile() {
        let dir = tempfile::tempdir().unwrap();
        let policy = sandbox_policy::build(sandbox_policy::PolicyRequest {
            workdir: dir.path().into(),
            ..Default::default()
        })
        .unwrap();
        let spec = CommandSpec::argv(["ls", "-la", "a b"], dir.path()).unwrap();
        let wrapped = wrap(&policy, &spec, Path::new("/bin/ls"));
        assert_eq!(wrapped.program, SANDBOX_EXEC);
        assert_eq!(wrapped.args[0], "-p");
        assert!(wrapped.args[1].to_string_lossy().starts_with("(version 1)"));
        assert_eq!(&wrapped.args[2..], &["/bin/ls", "-la", "a b"]);
    }
}
