//! `sandbox why PATH`: whether a path is visible and writable in the next run, and why —
//! asked of the policy and private view a run with these options would get
//! ([`sandbox_policy::why::explain`]). Nothing is run or created.

use std::path::{Path, PathBuf};

use sandbox_host::backend::BackendKind;
use sandbox_policy::why::{explain, Explanation};

use crate::cli::WhyArgs;
use crate::config::expand_home;
use crate::context::Context;
use crate::session::Session;

/// `path` made absolute (`~` expanded, relative to the current directory) and resolved as
/// far as it exists: grants and the view name canonical paths.
fn resolve(path: &Path) -> PathBuf {
    let path = expand_home(path);
    let path = if path.is_absolute() {
        path
    } else {
        std::env::current_dir()
            .map(|d| d.join(&path))
            .unwrap_or(path)
    };
    let mut rest = Vec::new();
    for ancestor in path.ancestors() {
        if let Ok(canonical) = std::fs::canonicalize(ancestor) {
            return rest.iter().rev().fold(canonical, |p: PathBuf, c| p.join(c));
        }
        match ancestor.file_name() {
            Some(name) => rest.push(name.to_os_string()),
            None => break,
        }
    }
    path
}

pub fn run(args: WhyArgs, ctx: &Context) -> anyhow::Result<i32> {
    let session = Session::open(&args.sandbox, ctx, false, None)?;
    let path = resolve(&args.path);
    let (answer, note) = match session.kind {
        BackendKind::Host => (
            Explanation {
                path: path.clone(),
                visible: path.symlink_metadata().is_ok(),
                writable: path.symlink_metadata().is_ok(),
                decided_by: "the host backend: no isolation (your own permissions decide)".into(),
                because: Vec::new(),
            },
            None,
        ),
        BackendKind::Native => {
            let forms = sandbox_host::report::native_forms(&session.policy, &session.options);
            match &forms.view {
                Some(Ok(view)) => (explain(&session.policy, Some(view), &path), None),
                Some(Err(e)) => (
                    explain(&session.policy, None, &path),
                    Some(format!(
                        "the private view cannot be compiled ({e}): by the grants"
                    )),
                ),
                None => (
                    explain(&session.policy, None, &path),
                    Some("no private view on this machine: the kernel's path rules decide".into()),
                ),
            }
        }
        other => (
            explain(&session.policy, None, &path),
            Some(format!("{other}: by the policy's grants")),
        ),
    };
    if args.json {
        let out = serde_json::json!({
            "backend": session.kind.as_str(),
            "path": answer.path,
            "visible": answer.visible,
            "writable": answer.writable,
            "decidedBy": answer.decided_by,
            "because": answer.because,
            "note": note,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(0);
    }
    let state = match (answer.visible, answer.writable) {
        (false, _) => "not visible",
        (true, false) => "visible, read-only",
        (true, true) => "visible and writable",
    };
    println!(
        "{}: {state} in the next run ({})",
        answer.path.display(),
        session.kind
    );
    println!("  decided by: {}", answer.decided_by);
    for line in &answer.because {
        println!("  because:    {line}");
    }
    if let Some(note) = note {
        println!("  note:       {note}");
    }
    Ok(0)
}
