//! `cargo xtask nix-check`: parse, lint and evaluate the Nix flake without network access.
//!
//! Each step prints one line: `ok: …`, `skipped: <reason>` (a tool is missing, or the real
//! nixpkgs lib is not available), or `FAILED: …` followed by the details. The run fails when a
//! step fails; under `CI=true` a missing tool counts as a failure, so CI cannot pass by
//! skipping everything.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Output;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use xshell::{cmd, Shell};

/// Inputs of the flake, each replaced by its stand-in under `tests/nix-eval/`.
const INPUTS: &[&str] = &["nixpkgs", "crane", "home-manager"];

/// Top-level outputs `nix flake show` must list.
const OUTPUTS: &[&str] = &[
    "packages",
    "apps",
    "checks",
    "devShells",
    "nixosModules",
    "homeModules",
    "homeManagerModules",
];

/// Outputs whose structure `tests/nix-eval/structure.nix` asserts, and the function for each.
const STRUCTURE: &[(&str, &str)] = &[
    ("packages", "packages"),
    ("checks", "checks"),
    ("apps", "apps"),
    ("devShells", "devShells"),
    ("nixosModules", "modules \"nixosModules\""),
    ("homeModules", "modules \"homeModules\""),
    ("homeManagerModules", "modules \"homeManagerModules\""),
];

const NIX_FEATURES: &[&str] = &["--extra-experimental-features", "nix-command flakes"];

pub struct Summary {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
}

struct Reporter {
    ci: bool,
    summary: Summary,
}

impl Reporter {
    fn ok(&mut self, what: impl AsRef<str>) {
        println!("ok: {}", what.as_ref());
        self.summary.passed += 1;
    }

    fn skipped(&mut self, reason: impl AsRef<str>) {
        println!("skipped: {}", reason.as_ref());
        self.summary.skipped += 1;
    }

    fn failed(&mut self, what: impl AsRef<str>, details: impl AsRef<str>) {
        println!("FAILED: {}", what.as_ref());
        let details = details.as_ref().trim_end();
        if !details.is_empty() {
            for line in details.lines() {
                println!("    {line}");
            }
        }
        self.summary.failed += 1;
    }

    /// A required tool is absent: skipped on a developer machine, a failure under CI.
    fn missing(&mut self, step: &str, tool: &str, install: &str) {
        let reason = format!("{step}: `{tool}` not found (install: {install})");
        if self.ci {
            self.failed(reason, "CI must install it; see docs/nix.md");
        } else {
            self.skipped(reason);
        }
    }

    fn record(&mut self, what: impl AsRef<str>, result: Result<String>) {
        match result {
            Ok(detail) if detail.is_empty() => self.ok(what),
            Ok(detail) => self.ok(format!("{} ({detail})", what.as_ref())),
            Err(err) => self.failed(what, format!("{err:#}")),
        }
    }
}

pub fn run() -> Result<Summary> {
    let root = workspace_root()?;
    let sh = Shell::new()?;
    sh.change_dir(&root);
    let mut report = Reporter {
        ci: std::env::var("CI").is_ok_and(|v| v == "true" || v == "1"),
        summary: Summary {
            passed: 0,
            failed: 0,
            skipped: 0,
        },
    };

    let files = nix_files(&sh, &root)?;
    if files.is_empty() {
        bail!("no .nix files found under {}", root.display());
    }

    // 1. Parse.
    match find_tool("nix-instantiate") {
        None => report.missing("parse", "nix-instantiate", "apt-get install nix-bin"),
        Some(nix_instantiate) => {
            let mut problems = String::new();
            for file in &files {
                let out = cmd!(sh, "{nix_instantiate} --parse {file}")
                    .quiet()
                    .ignore_status()
                    .output()?;
                if !out.status.success() {
                    problems.push_str(&format!("{}:\n{}\n", file, stderr(&out)));
                }
            }
            if problems.is_empty() {
                report.ok(format!(
                    "parse: {} .nix files (nix-instantiate --parse)",
                    files.len()
                ));
            } else {
                report.failed("parse: nix-instantiate --parse", problems);
            }
        }
    }

    // 2. Lint.
    let file_list = &files[..];
    match find_tool("deadnix") {
        None => report.missing("lint", "deadnix", "cargo install deadnix"),
        Some(deadnix) => {
            let out = cmd!(sh, "{deadnix} --fail {file_list...}")
                .quiet()
                .ignore_status()
                .output()?;
            if out.status.success() {
                report.ok(format!(
                    "lint: deadnix --fail ({} files, no unused bindings)",
                    files.len()
                ));
            } else {
                report.failed(
                    "lint: deadnix --fail",
                    format!("{}{}", stdout(&out), stderr(&out)),
                );
            }
        }
    }
    match find_tool("nixpkgs-fmt") {
        None => report.missing("lint", "nixpkgs-fmt", "cargo install nixpkgs-fmt"),
        Some(nixpkgs_fmt) => {
            let out = cmd!(sh, "{nixpkgs_fmt} --check {file_list...}")
                .quiet()
                .ignore_status()
                .output()?;
            if out.status.success() {
                report.ok(format!(
                    "lint: nixpkgs-fmt --check ({} files formatted)",
                    files.len()
                ));
            } else {
                report.failed(
                    "lint: nixpkgs-fmt --check (run `nixpkgs-fmt <file>` to fix)",
                    format!("{}{}", stdout(&out), stderr(&out)),
                );
            }
        }
    }

    // The shell scripts the guest image runs (writeShellApplication shellchecks them at build
    // time too, with errexit, nounset and pipefail set).
    let scripts = shell_scripts(&root)?;
    match find_tool("shellcheck") {
        None => report.missing("lint", "shellcheck", "apt-get install shellcheck"),
        Some(shellcheck) if !scripts.is_empty() => {
            let script_list = &scripts[..];
            let out = cmd!(sh, "{shellcheck} --shell=bash {script_list...}")
                .quiet()
                .ignore_status()
                .output()?;
            if out.status.success() {
                report.ok(format!(
                    "lint: shellcheck ({} guest image scripts)",
                    scripts.len()
                ));
            } else {
                report.failed(
                    "lint: shellcheck",
                    format!("{}{}", stdout(&out), stderr(&out)),
                );
            }
        }
        Some(_) => {}
    }

    // 3 and 4. Evaluate.
    match find_tool("nix") {
        None => {
            report.missing("flake structure", "nix", "apt-get install nix-bin");
            report.missing("module evaluation", "nix", "apt-get install nix-bin");
        }
        Some(nix) => {
            let copy = flake_copy(&sh, &root)?;
            let flake = format!("path:{}", copy.path().display());
            let overrides = stand_in_overrides(copy.path());

            report.record(
                "flake structure: `nix flake show` lists every output (stand-in inputs)",
                flake_show(&sh, &nix, &flake, &overrides),
            );
            for (output, function) in STRUCTURE {
                report.record(
                    format!("flake structure: {output}"),
                    structure(&sh, &nix, &flake, &overrides, copy.path(), output, function),
                );
            }

            report.record(
                "module evaluation: options and config of nixos-modules/ (stand-in lib, modules called directly)",
                modules(&sh, &nix, &root, &root.join("tests/nix-eval/nixpkgs/lib.nix"), false),
            );
            match std::env::var_os("SANDBOX_NIXPKGS_LIB") {
                None => report.skipped(
                    "module evaluation with the real module system: SANDBOX_NIXPKGS_LIB is not set \
                     (point it at a nixpkgs or nixpkgs.lib checkout; CI cannot download one)",
                ),
                Some(dir) => {
                    let lib = real_lib(Path::new(&dir))?;
                    report.record(
                        format!(
                            "module evaluation with the real module system (lib.evalModules from {})",
                            lib.display()
                        ),
                        modules(&sh, &nix, &root, &lib, true),
                    );
                }
            }
        }
    }

    let s = &report.summary;
    println!(
        "nix-check: {} passed, {} failed, {} skipped",
        s.passed, s.failed, s.skipped
    );
    Ok(report.summary)
}

fn workspace_root() -> Result<PathBuf> {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = manifest_dir
        .parent()
        .context("xtask has no parent directory")?
        .to_path_buf();
    if !root.join("flake.nix").is_file() {
        bail!("{} has no flake.nix", root.display());
    }
    Ok(root)
}

/// The repository's `.nix` files: tracked, plus new files git does not ignore.
fn nix_files(sh: &Shell, root: &Path) -> Result<Vec<String>> {
    let listed = cmd!(
        sh,
        "git ls-files --cached --others --exclude-standard -- *.nix"
    )
    .quiet()
    .read()
    .with_context(|| format!("listing .nix files with git in {}", root.display()))?;
    let mut files: Vec<String> = listed
        .lines()
        .filter(|f| root.join(f).is_file())
        .map(str::to_owned)
        .collect();
    files.sort();
    files.dedup();
    Ok(files)
}

/// The `*.sh` files under vm-images/ (their text becomes writeShellApplication scripts).
fn shell_scripts(root: &Path) -> Result<Vec<PathBuf>> {
    let dir = root.join("vm-images");
    let mut scripts = Vec::new();
    if dir.is_dir() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "sh") {
                scripts.push(path);
            }
        }
    }
    scripts.sort();
    Ok(scripts)
}

/// A copy of the files git would commit, so new files count before they are committed and
/// `target/` is never copied into the Nix store.
fn flake_copy(sh: &Shell, root: &Path) -> Result<xshell::TempDir> {
    let dir = sh.create_temp_dir()?;
    let listed = cmd!(sh, "git ls-files -z --cached --others --exclude-standard")
        .quiet()
        .read()?;
    for file in listed.split('\0').filter(|f| !f.is_empty()) {
        let from = root.join(file);
        if !from.is_file() {
            continue; // deleted but still in the index
        }
        let to = dir.path().join(file);
        std::fs::create_dir_all(to.parent().expect("a file has a parent"))?;
        std::fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
    }
    Ok(dir)
}

fn stand_in_overrides(copy: &Path) -> Vec<OsString> {
    let mut args = Vec::new();
    for input in INPUTS {
        args.push("--override-input".into());
        args.push((*input).into());
        args.push(format!("path:{}", copy.join("tests/nix-eval").join(input).display()).into());
    }
    args
}

/// Flags for the flake commands (they go after the subcommand).
const FLAKE_FLAGS: &[&str] = &["--offline", "--no-write-lock-file"];

fn flake_show(sh: &Shell, nix: &Path, flake: &str, overrides: &[OsString]) -> Result<String> {
    let out = cmd!(
        sh,
        "{nix} {NIX_FEATURES...} flake show {FLAKE_FLAGS...} --json {overrides...} {flake}"
    )
    .quiet()
    .ignore_status()
    .output()?;
    if !out.status.success() {
        bail!("nix flake show failed:\n{}", stderr(&out));
    }
    let shown: Value =
        serde_json::from_slice(&out.stdout).context("nix flake show --json printed no JSON")?;
    let missing: Vec<&str> = OUTPUTS
        .iter()
        .copied()
        .filter(|o| shown.get(o).is_none())
        .collect();
    if !missing.is_empty() {
        bail!(
            "outputs missing from `nix flake show`: {}",
            missing.join(", ")
        );
    }
    Ok(OUTPUTS.join(", "))
}

fn structure(
    sh: &Shell,
    nix: &Path,
    flake: &str,
    overrides: &[OsString],
    copy: &Path,
    output: &str,
    function: &str,
) -> Result<String> {
    // The assertions are passed as the text of the function rather than `import`ed, so the
    // flake is still evaluated in pure mode.
    let path = copy.join("tests/nix-eval/structure.nix");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let apply = format!("(\n{text}\n).{function}");
    let installable = format!("{flake}#{output}");
    let out = cmd!(sh, "{nix} {NIX_FEATURES...} eval {FLAKE_FLAGS...} --json {overrides...} {installable} --apply {apply}")
        .quiet()
        .ignore_status()
        .output()?;
    if !out.status.success() {
        bail!("evaluating {output} failed:\n{}", stderr(&out));
    }
    let result: Value = serde_json::from_slice(&out.stdout).context("nix eval printed no JSON")?;
    let failures: Vec<String> = strings(&result["failures"]);
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    Ok(strings(&result["checked"]).join(", "))
}

fn modules(sh: &Shell, nix: &Path, root: &Path, lib: &Path, deep: bool) -> Result<String> {
    let expr = format!(
        "import {} {{ lib = import {}; deep = {deep}; }}",
        root.join("tests/nix-eval/modules.nix").display(),
        lib.display()
    );
    let out = cmd!(
        sh,
        "{nix} {NIX_FEATURES...} eval --json --impure --expr {expr}"
    )
    .quiet()
    .ignore_status()
    .output()?;
    if !out.status.success() {
        bail!("evaluating the modules failed:\n{}", stderr(&out));
    }
    let results: Value = serde_json::from_slice(&out.stdout).context("nix eval printed no JSON")?;
    let results = results
        .as_object()
        .context("the module report is not an object")?;
    let failures: Vec<String> = results
        .iter()
        .filter(|(_, v)| **v != Value::Bool(true))
        .map(|(k, v)| format!("{k}: {}", v.as_str().unwrap_or("failed")))
        .collect();
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    Ok(format!("{} checks", results.len()))
}

/// `SANDBOX_NIXPKGS_LIB` may name a nixpkgs checkout, a nixpkgs.lib checkout, or `lib/` itself.
fn real_lib(dir: &Path) -> Result<PathBuf> {
    for candidate in [dir.join("lib"), dir.to_path_buf()] {
        if candidate.join("modules.nix").is_file() && candidate.join("default.nix").is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "SANDBOX_NIXPKGS_LIB={} holds no nixpkgs lib (expected lib/default.nix and lib/modules.nix)",
        dir.display()
    )
}

fn find_tool(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    // `cargo install` puts deadnix and nixpkgs-fmt here, which need not be on PATH.
    if let Some(cargo_home) = std::env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(cargo_home).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo/bin"));
    }
    dirs.into_iter()
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| v.to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Nix's stderr without its progress chatter and the note about the (expected) lock file
/// changes that the stand-in overrides cause.
fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            !(l.starts_with("evaluating '")
                || l.starts_with("warning: not writing modified lock file")
                || t.starts_with('\u{2022}')
                || t.starts_with('\'')
                || t.starts_with('\u{2192}'))
        })
        .collect::<Vec<_>>()
        .join("\n")
}
