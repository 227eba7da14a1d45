//! Commands resolve inside the view: `argv[0]` is looked up on `PATH` as the private view
//! shows it, not as the host does. A directory of the host's `PATH` that the view does not
//! contain is skipped, and a program found only there gets a hint: where it is on the host and
//! which toolchain or grant would make it visible.

use std::path::{Path, PathBuf};

use sandbox_exec::{CommandSpec, ExecError};
use sandbox_policy::{GrantReason, Policy};

use crate::error::HostError;

/// Where the view's `path` comes from on the host, if the view has it: the same path for
/// system directories, grants and toolchains; the private home's own directory for the rest
/// of the real home's path.
pub fn view_source(policy: &Policy, path: &Path) -> Option<PathBuf> {
    let granted = policy
        .fs
        .system_read
        .iter()
        .chain(policy.fs.devices.iter())
        .chain(
            policy
                .fs
                .read
                .iter()
                .chain(policy.fs.write.iter())
                .filter(|g| g.reason != GrantReason::Home)
                .map(|g| &g.path),
        )
        .any(|p| path.starts_with(p));
    if granted {
        return Some(path.to_path_buf());
    }
    let home = policy.fs.home.as_ref()?;
    if home.caches.iter().any(|c| path.starts_with(&c.path)) {
        return Some(path.to_path_buf());
    }
    let rel = path.strip_prefix(&home.path).ok()?;
    Some(home.dir.join(rel))
}

fn is_executable_file(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Resolves `spec`'s program on its `PATH` as the view has it (the command then runs that
/// path); a program only the host has fails with [`ExecError::NotInSandbox`] (127), naming
/// where it is and what would make it visible.
pub fn in_view(policy: &Policy, spec: &mut CommandSpec) -> Result<(), HostError> {
    let program = spec.program.clone();
    if program.is_empty() {
        return Ok(());
    }
    if program.as_encoded_bytes().contains(&b'/') {
        return by_path(policy, spec);
    }
    let Some(path_var) = spec.env_var("PATH").map(|p| p.to_os_string()) else {
        return Ok(());
    };
    let mut hidden: Option<PathBuf> = None;
    for dir in std::env::split_paths(&path_var) {
        if !dir.is_absolute() {
            continue;
        }
        let candidate = dir.join(&program);
        match view_source(policy, &candidate) {
            Some(source) if is_executable_file(&source) => {
                // A link must lead somewhere the view has too (a shim into a tree of its own).
                let target_visible = match std::fs::canonicalize(&source) {
                    Ok(target) => {
                        policy
                            .fs
                            .home
                            .as_ref()
                            .is_some_and(|h| target.starts_with(&h.dir))
                            || view_source(policy, &target).as_deref() == Some(target.as_path())
                    }
                    Err(_) => false,
                };
                if target_visible {
                    if source == candidate {
                        spec.program = candidate.into_os_string();
                    }
                    return Ok(());
                }
                hidden.get_or_insert(candidate);
            }
            Some(_) => {
                // Not in the view's tree; the host's own may still hold it (for the hint).
                if is_executable_file(&candidate)
                    && view_source(policy, &candidate).as_deref() != Some(candidate.as_path())
                {
                    hidden.get_or_insert(candidate);
                }
            }
            None => {
                if is_executable_file(&candidate) {
                    hidden.get_or_insert(candidate);
                }
            }
        }
    }
    match hidden {
        Some(host) => Err(HostError::Command(ExecError::NotInSandbox {
            program: program.to_string_lossy().into_owned(),
            hint: hint(policy, &host),
        })),
        // Nowhere at all: the usual "command not found" of the spawn.
        None => Ok(()),
    }
}

/// A program named by its path (`~/mytools/mytool`, `./build.sh`): when the host has a
/// program there and the view does not (a folder of the home no grant shows, the host's
/// `/tmp`), the same hint as for a `PATH` name instead of a bare "command not found". Kernel
/// trees the view mounts itself (`/proc`, `/dev`, `/sys`) are never judged here.
fn by_path(policy: &Policy, spec: &CommandSpec) -> Result<(), HostError> {
    let named = Path::new(&spec.program);
    let path = if named.is_absolute() {
        named.to_path_buf()
    } else {
        spec.cwd.join(named)
    };
    let kernel = ["/proc", "/dev", "/sys"]
        .iter()
        .any(|tree| path.starts_with(tree));
    if kernel || !is_executable_file(&path) {
        return Ok(());
    }
    match view_source(policy, &path) {
        Some(source) if is_executable_file(&source) => Ok(()),
        _ => Err(HostError::Command(ExecError::NotInSandbox {
            program: spec.program.to_string_lossy().into_owned(),
            hint: hint(policy, &path),
        })),
    }
}

/// `cargo is ~/.cargo/bin/cargo, outside the sandbox: it is the rust toolchain, add
/// --toolchain rust`.
pub fn hint(policy: &Policy, host: &Path) -> String {
    let home = policy.fs.home.as_ref();
    let shown = match home.and_then(|h| host.strip_prefix(&h.path).ok()) {
        Some(rel) => format!("~/{}", rel.display()),
        None => host.display().to_string(),
    };
    let dir = host.parent().unwrap_or(host);
    let what = match home.and_then(|h| h.toolchain_of(host)) {
        Some(t) if !t.enabled => format!(
            "it is the {} toolchain ({}), add --toolchain {}",
            t.name, t.kind, t.name
        ),
        Some(t) => format!(
            "it is in the {} toolchain, but leads outside it; grant its target with --allow-read",
            t.name
        ),
        None => format!("grant it with --allow-read {}", dir.display()),
    };
    format!(
        "{} is {shown}, outside the sandbox: {what}",
        host.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_policy::{Grant, HomePolicy, Toolchain};

    fn policy(home: &Path, dir: &Path, chain: &Path, enabled: bool) -> Policy {
        let root = home.parent().unwrap().join("work");
        std::fs::create_dir_all(&root).unwrap();
        let mut p = sandbox_policy::build(sandbox_policy::PolicyRequest {
            workdir: root,
            system_read: Some(vec!["/usr".into()]),
            ..Default::default()
        })
        .unwrap();
        p.fs.write.push(Grant {
            path: dir.to_path_buf(),
            reason: GrantReason::Home,
        });
        if enabled {
            p.fs.read.push(Grant {
                path: chain.to_path_buf(),
                reason: GrantReason::Toolchain,
            });
        }
        p.fs.home = Some(HomePolicy {
            path: home.to_path_buf(),
            dir: dir.to_path_buf(),
            scope: "per-project".into(),
            toolchains: vec![Toolchain {
                name: "rust".into(),
                kind: "rustup".into(),
                paths: vec![chain.to_path_buf()],
                enabled,
            }],
            caches: vec![],
            masked: vec![],
            cache_cap_bytes: None,
        });
        p
    }

    fn exe(path: &Path) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn a_program_only_the_host_has_gets_a_hint_and_a_visible_one_resolves() {
        let t = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(t.path()).unwrap();
        let home = base.join("home");
        let bin = home.join(".cargo/bin");
        let private = base.join("private");
        std::fs::create_dir_all(&private).unwrap();
        exe(&bin.join("cargo"));
        let path = format!("{}:/usr/bin", bin.display());
        let spec_of = || {
            let mut spec = CommandSpec::new(
                sandbox_exec::CommandRequest::Argv(vec!["cargo".into(), "build".into()]),
                &base,
            )
            .unwrap();
            spec.env = vec![("PATH".into(), path.clone().into())];
            spec
        };
        // The toolchain off: the host has it, the view does not.
        let p = policy(&home, &private, &bin, false);
        let mut spec = spec_of();
        let err = in_view(&p, &mut spec).unwrap_err().to_string();
        assert!(
            err.contains("cargo is ~/.cargo/bin/cargo, outside the sandbox")
                && err.contains("add --toolchain rust"),
            "{err}"
        );
        // On: it resolves to the toolchain's path.
        let p = policy(&home, &private, &bin, true);
        let mut spec = spec_of();
        in_view(&p, &mut spec).unwrap();
        assert_eq!(spec.program, bin.join("cargo").into_os_string());
        // Installed into the private home (pip --user): found there.
        let p = policy(&home, &private, &bin, false);
        exe(&private.join(".cargo/bin/cargo"));
        let mut spec = spec_of();
        in_view(&p, &mut spec).unwrap();
    }

    #[test]
    fn a_program_named_by_a_path_only_the_host_has_gets_the_same_hint() {
        let t = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(t.path()).unwrap();
        let home = base.join("home");
        let private = base.join("private");
        std::fs::create_dir_all(&private).unwrap();
        let tool = home.join("mytools/mytool");
        exe(&tool);
        let p = policy(&home, &private, &home.join(".cargo/bin"), false);
        let spec_of = |program: &Path| {
            CommandSpec::new(
                sandbox_exec::CommandRequest::Argv(vec![program.as_os_str().to_owned()]),
                &base,
            )
            .unwrap()
        };
        let err = in_view(&p, &mut spec_of(&tool)).unwrap_err().to_string();
        assert!(
            err.contains("mytool is ~/mytools/mytool, outside the sandbox")
                && err.contains(&format!("--allow-read {}", home.join("mytools").display())),
            "{err}"
        );
        // The view has it (the private home's own copy): it runs.
        exe(&private.join("mytools/mytool"));
        in_view(&p, &mut spec_of(&tool)).unwrap();
        // Nothing there on the host either, or a kernel tree: left to the spawn.
        in_view(&p, &mut spec_of(&home.join("nothing"))).unwrap();
        in_view(&p, &mut spec_of(Path::new("/proc/self/exe"))).unwrap();
    }
}
