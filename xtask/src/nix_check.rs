//! `cargo xtask nix-check`: parse, lint and evaluate the Nix flake without network access.
//!
//! Each step prints one line: `ok: …`, `skipped: <reason>` (a tool is missing, or the real
//! nixpkgs lib is not available), or `FAILED: …` followed by the details. The run fails when a
//! step fails; under `CI=true` a missing tool or nixpkgs lib counts as a failure, so CI cannot
//! pass by skipping everything.
//!
//! The evaluation steps run the flake against the stand-ins in `tests/nix-eval/`, whose `lib`
//! is the real nixpkgs lib (an unmodified nixpkgs.lib checkout: `SANDBOX_NIXPKGS_LIB`, else
//! `../shared/nixpkgs-lib` beside the repository); without it they are skipped.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Output;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use xshell::{cmd, Shell};

/// Inputs of the flake, each replaced by its stand-in under `tests/nix-eval/`.
const INPUTS: &[&str] = &["nixpkgs", "crane", "home-manager", "rust-overlay"];

/// Top-level outputs `nix flake show` must list.
const OUTPUTS: &[&str] = &[
    "packages",
    "apps",
    "checks",
    "legacyPackages",
    "devShells",
    "overlays",
    "nixosModules",
    "homeModules",
    "homeManagerModules",
];

/// Outputs whose structure `tests/nix-eval/structure.nix` asserts, and the function for each.
const STRUCTURE: &[(&str, &str)] = &[
    ("packages", "packages"),
    ("checks", "checks"),
    ("legacyPackages", "legacyPackages"),
    ("apps", "apps"),
    ("devShells", "devShells"),
    ("overlays", "overlays"),
    ("nixosModules", "modules \"nixosModules\""),
    ("homeModules", "modules \"homeModules\""),
    ("homeManagerModules", "modules \"homeManagerModules\""),
];

const NIX_FEATURES: &[&str] = &["--extra-experimental-features", "nix-command flakes"];

#[derive(Default)]
pub struct Summary {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
    /// Each failed step with its details, for the breakage test.
    pub failures: Vec<String>,
}

struct Reporter {
    ci: bool,
    /// Print nothing (the breakage test reads the summary instead).
    quiet: bool,
    summary: Summary,
}

impl Reporter {
    fn ok(&mut self, what: impl AsRef<str>) {
        if !self.quiet {
            println!("ok: {}", what.as_ref());
        }
        self.summary.passed += 1;
    }

    fn skipped(&mut self, reason: impl AsRef<str>) {
        if !self.quiet {
            println!("skipped: {}", reason.as_ref());
        }
        self.summary.skipped += 1;
    }

    fn failed(&mut self, what: impl AsRef<str>, details: impl AsRef<str>) {
        let details = details.as_ref().trim_end();
        if !self.quiet {
            println!("FAILED: {}", what.as_ref());
            for line in details.lines() {
                println!("    {line}");
            }
        }
        self.summary
            .failures
            .push(format!("{}\n{details}", what.as_ref()));
        self.summary.failed += 1;
    }

    /// A required tool is absent: skipped on a developer machine, a failure under CI.
    fn missing(&mut self, step: &str, tool: &str, install: &str) {
        self.unavailable(format!("{step}: `{tool}` not found (install: {install})"));
    }

    /// Something a step needs is absent (`reason` says what).
    fn unavailable(&mut self, reason: String) {
        if self.ci {
            self.failed(reason, "CI must provide it; see docs/nix.md");
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

/// How a run is set up.
#[derive(Clone)]
pub struct Options {
    /// A failure instead of a skip when a tool or the nixpkgs lib is missing.
    pub ci: bool,
    /// Print nothing; the caller reads the summary.
    pub quiet: bool,
    /// The repository whose `../shared/nixpkgs-lib` is used when `SANDBOX_NIXPKGS_LIB` is
    /// unset (the workspace, also when checking a scratch copy of it).
    pub lib_base: PathBuf,
    /// Only the evaluation steps (the breakage test's mutations are all caught there or in
    /// parsing, and linting a scratch copy again would only repeat the main run).
    pub evaluation_only: bool,
    /// Run the builder scripts step (the breakage test skips it where a case cannot be caught
    /// there).
    pub builder_scripts: bool,
}

/// Checks the repository at `root` (the workspace, or a scratch copy of it).
pub fn run(root: &Path, options: &Options) -> Result<Summary> {
    let root = root.to_path_buf();
    let sh = Shell::new()?;
    sh.change_dir(&root);
    let mut report = Reporter {
        ci: options.ci,
        quiet: options.quiet,
        summary: Summary::default(),
    };

    let files = nix_files(&sh, &root)?;
    if files.is_empty() {
        bail!("no .nix files found under {}", root.display());
    }

    if !options.evaluation_only {
        lint(&sh, &root, &files, &mut report)?;
    }

    // 3 to 6. Evaluate.
    let Some(nix) = find_tool("nix") else {
        report.missing("evaluation", "nix", "apt-get install nix-bin");
        return Ok(finish(report, options));
    };
    let lib = match nixpkgs_lib(&options.lib_base) {
        Ok(lib) => lib,
        Err(reason) => {
            report.unavailable(format!(
                "evaluation (flake structure, VM test scripts, modules): {reason}"
            ));
            return Ok(finish(report, options));
        }
    };
    evaluate(&sh, &root, &nix, &lib, options, &mut report)?;
    Ok(finish(report, options))
}

fn finish(report: Reporter, options: &Options) -> Summary {
    let s = &report.summary;
    if !options.quiet {
        println!(
            "nix-check: {} passed, {} failed, {} skipped",
            s.passed, s.failed, s.skipped
        );
    }
    report.summary
}

/// 1 and 2: every file parses; deadnix, nixpkgs-fmt and shellcheck are clean.
fn lint(sh: &Shell, root: &Path, files: &[String], report: &mut Reporter) -> Result<()> {
    // 1. Parse.
    match find_tool("nix-instantiate") {
        None => report.missing("parse", "nix-instantiate", "apt-get install nix-bin"),
        Some(nix_instantiate) => {
            let mut problems = String::new();
            for file in files {
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
    let file_list = files;
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
    let scripts = shell_scripts(root)?;
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

    Ok(())
}

/// The unmodified nixpkgs lib the stand-ins use: `SANDBOX_NIXPKGS_LIB` (a nixpkgs or
/// nixpkgs.lib checkout), else `../shared/nixpkgs-lib` beside the repository, as on the build
/// machine and in CI. Returns the checkout (a flake with `lib/`), or why there is none.
fn nixpkgs_lib(root: &Path) -> std::result::Result<PathBuf, String> {
    let (dir, from) = match std::env::var_os("SANDBOX_NIXPKGS_LIB") {
        Some(dir) => (PathBuf::from(dir), "SANDBOX_NIXPKGS_LIB"),
        None => (
            root.join("../shared/nixpkgs-lib"),
            "../shared/nixpkgs-lib beside the repository",
        ),
    };
    let has_lib =
        |d: &Path| d.join("lib/modules.nix").is_file() && d.join("lib/default.nix").is_file();
    if has_lib(&dir) && dir.join("flake.nix").is_file() {
        return dir
            .canonicalize()
            .map_err(|e| format!("{}: {e}", dir.display()));
    }
    Err(format!(
        "no nixpkgs lib at {} ({from}); point SANDBOX_NIXPKGS_LIB at a nixpkgs.lib checkout \
         (a flake with lib/default.nix and lib/modules.nix)",
        dir.display()
    ))
}

/// 3 to 6: the flake against the stand-ins, the VM test scripts, the modules, the sources
/// the tests read.
fn evaluate(
    sh: &Shell,
    root: &Path,
    nix: &Path,
    lib: &Path,
    options: &Options,
    report: &mut Reporter,
) -> Result<()> {
    let copy = flake_copy(sh, root)?;
    let flake = format!("path:{}", copy.path().display());
    let overrides = stand_in_overrides(copy.path(), lib);
    let eval = Eval {
        sh,
        nix,
        flake: &flake,
        overrides: &overrides,
        structure: &copy.path().join("tests/nix-eval/structure.nix"),
    };

    report.record(
        "flake structure: `nix flake show` lists every output (stand-in inputs, real lib); \
         every package and check instantiates (below)",
        flake_show(&eval),
    );
    for (output, function) in STRUCTURE {
        report.record(
            format!("flake structure: {output}"),
            eval.structure(output, function),
        );
    }
    // The VM tests exist on Linux only; their scripts are the same on every Linux system.
    report.record(
        "VM test scripts (x86_64-linux): python3 byte-compiles each testScript",
        test_scripts(&eval, "x86_64-linux"),
    );
    report.record(
        "lint (stricter than upstream): no builder argument that crane or nixpkgs would pass \
         on to mkDerivation unnoticed (tests/nix-eval/lints.nix)",
        builder_lints(&eval),
    );
    report.record(
        format!(
            "module evaluation: shared settings cases and option docs (lib.evalModules from {})",
            lib.display()
        ),
        modules(sh, nix, copy.path(), &lib.join("lib")),
    );
    report.record(
        "crate sources: every file a test reads is in the crane source (packages.sandbox-unwrapped.src)",
        crate_source(&eval, copy.path()),
    );
    let pins = copy.path().join(BOXLITE_PINS);
    if pins.is_file() {
        report.record(
            format!("BoxLite runtime: nix/boxlite-runtime.nix cuts the files {BOXLITE_PINS} pins"),
            boxlite_pins(&eval, &pins),
        );
    } else {
        report.skipped(format!(
            "BoxLite runtime pins: {BOXLITE_PINS} is not in this tree, so there is nothing to \
             compare nix/boxlite-runtime.nix with"
        ));
    }
    if options.builder_scripts {
        builder_scripts(&eval, copy.path(), lib, &options.lib_base, report)?;
    }
    // Said on every run, so a green nix-check is not read as more than it is.
    report.skipped(
        "builds and VM tests: no nixpkgs can be fetched and no guest can boot here (docs/nix.md); \
         `nix flake check -L` on a Linux host with KVM builds `checks` (the CLI, clippy, \
         nextest, the module checks, the VM tests); the workflow also builds sandbox-boxlite, \
         the images and the Lima variants with `nix build`, and runs vm-boxlite-escape, which \
         needs nested KVM (docs/nix.md)",
    );
    Ok(())
}

/// The lint of tests/nix-eval/lints.nix over the outputs that hold derivations.
fn builder_lints(eval: &Eval) -> Result<String> {
    let text = std::fs::read_to_string(eval.structure.with_file_name("lints.nix"))?;
    let mut failures = Vec::new();
    let mut looked = Vec::new();
    for output in ["packages", "checks", "legacyPackages"] {
        let result = eval.apply(output, &format!("(\n{text}\n)"))?;
        failures.extend(strings(&result["failures"]));
        looked.push(output);
    }
    failures.sort();
    failures.dedup();
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    Ok(looked.join(", "))
}

/// Runs the x86_64-linux `runCommand` bodies whose inputs can be had here, one step each
/// (xtask/src/nix_builders.rs).
fn builder_scripts(
    eval: &Eval,
    copy: &Path,
    lib: &Path,
    workspace: &Path,
    report: &mut Reporter,
) -> Result<()> {
    let system = "x86_64-linux";
    let text = std::fs::read_to_string(eval.structure.with_file_name("builders.nix"))?;
    let packages_expr = format!(
        "import {} {{ realLib = import {}; system = \"{system}\"; }}",
        copy.join("tests/nix-eval/stand-in-packages.nix").display(),
        lib.join("lib").display()
    );
    let (nix, sh) = (eval.nix, eval.sh);
    let out = cmd!(
        sh,
        "{nix} {NIX_FEATURES...} eval --json --impure --expr {packages_expr}"
    )
    .quiet()
    .ignore_status()
    .output()?;
    if !out.status.success() {
        report.failed(
            "builder scripts: listing the stand-in packages",
            stderr(&out),
        );
        return Ok(());
    }
    let packages: Value = serde_json::from_slice(&out.stdout).context("no JSON")?;
    let scratch = sh.create_temp_dir()?;
    for output in ["packages", "checks"] {
        let function = format!("o: (\n{text}\n) o \"{system}\"");
        let scripts = match eval.apply(output, &function) {
            Ok(s) => s,
            Err(err) => {
                report.failed(
                    format!("builder scripts: listing the runCommand bodies of {output}.{system}"),
                    format!("{err:#}"),
                );
                continue;
            }
        };
        for (name, script) in scripts.as_object().into_iter().flatten() {
            let what = format!(
                "builder script: {output}.{system}.{name} under `bash -e -u -o pipefail`, as stdenv runs it"
            );
            match crate::nix_builders::run_script(
                name,
                script,
                &packages,
                workspace,
                scratch.path(),
            ) {
                Ok(crate::nix_builders::Outcome::Ran(detail)) => {
                    report.ok(format!("{what} ({detail})"))
                }
                Ok(crate::nix_builders::Outcome::Unavailable(reason)) => {
                    report.unavailable(format!("{what}: {reason}"))
                }
                Ok(crate::nix_builders::Outcome::NeedsBuild(reason)) => {
                    report.skipped(format!("{what}: {reason}"))
                }
                Err(err) => report.failed(what, format!("{err:#}")),
            }
        }
    }
    Ok(())
}

/// Where `cargo xtask boxlite-runtime` and `sandbox doctor` take the wheel's and the runtime
/// files' pins from.
const BOXLITE_PINS: &str = "crates/sandbox-boxlite/src/runtime_files.rs";

/// The flake's BoxLite runtime (`packages.x86_64-linux.boxlite-runtime`) fetches the wheel the
/// Rust side pins, with the same sha256, and cuts the same files at the same offsets with the
/// same hashes: two copies of one recipe, kept equal here.
fn boxlite_pins(eval: &Eval, pins: &Path) -> Result<String> {
    let rust = std::fs::read_to_string(pins)?;
    let capture = |pattern: &str, text: &str| -> Result<Vec<String>> {
        let caps = regex::Regex::new(pattern)?
            .captures(text)
            .with_context(|| format!("{BOXLITE_PINS}: no match for {pattern}"))?;
        Ok(caps
            .iter()
            .skip(1)
            .map(|m| m.map_or(String::new(), |m| m.as_str().to_owned()))
            .collect())
    };
    let version = capture(r#"pub const VERSION: &str = "([^"]+)";"#, &rust)?.remove(0);
    let wheel = capture(
        r#"LINUX_X86_64_WHEEL: Wheel = Wheel \{\s*file_name: "([^"]+)",\s*sha256: "([0-9a-f]{64})",\s*member: "([^"]+)""#,
        &rust,
    )?;
    let start = rust
        .find("const LINUX_X86_64_FILES")
        .with_context(|| format!("{BOXLITE_PINS}: no LINUX_X86_64_FILES"))?;
    let list = &rust[start..start + rust[start..].find("];").unwrap_or(rust.len() - start)];
    let file = regex::Regex::new(
        r#"RuntimeFile \{\s*name: "([^"]+)",\s*offset: ([0-9_]+),\s*size: ([0-9_]+),\s*sha256: "([0-9a-f]{64})""#,
    )?;
    let number = |s: &str| s.replace('_', "").parse::<u64>();
    let mut rust_files = std::collections::BTreeSet::new();
    for c in file.captures_iter(list) {
        rust_files.insert((
            c[1].to_owned(),
            number(&c[2])?,
            number(&c[3])?,
            c[4].to_owned(),
        ));
    }
    if rust_files.is_empty() {
        bail!("{BOXLITE_PINS}: found no RuntimeFile in LINUX_X86_64_FILES");
    }

    let nix = eval.apply(
        "packages",
        "p: let r = p.x86_64-linux.boxlite-runtime; in { inherit (r) version member files \
         wheelSha256 wheelUrl; wheelName = r.wheel.name; \
         hash = r.wheel.drvAttrs.outputHash or r.wheel.drvAttrs.hash; }",
    )?;
    let text = |key: &str| nix[key].as_str().unwrap_or_default().to_owned();
    let mut nix_files = std::collections::BTreeSet::new();
    for f in nix["files"].as_array().context("no files")? {
        nix_files.insert((
            f["name"].as_str().unwrap_or_default().to_owned(),
            f["offset"].as_u64().unwrap_or(u64::MAX),
            f["size"].as_u64().unwrap_or(u64::MAX),
            f["sha256"].as_str().unwrap_or_default().to_owned(),
        ));
    }
    let sri = {
        let (nix_bin, hex) = (eval.nix, &wheel[1]);
        cmd!(
            eval.sh,
            "{nix_bin} {NIX_FEATURES...} hash to-sri --type sha256 {hex}"
        )
        .quiet()
        .read()
        .context("nix hash to-sri")?
    };

    let mut problems = Vec::new();
    let mut differ = |what: &str, rust: &str, nix: &str| {
        if rust != nix {
            problems.push(format!(
                "{what}: {BOXLITE_PINS} has {rust}, the flake {nix}"
            ));
        }
    };
    differ("version", &version, &text("version"));
    differ("wheel", &wheel[0], &text("wheelName"));
    differ("wheel sha256", &wheel[1], &text("wheelSha256"));
    differ("wheel hash (SRI)", sri.trim(), &text("hash"));
    differ("module", &wheel[2], &text("member"));
    if !text("wheelUrl").ends_with(&format!("/{}", wheel[0])) {
        problems.push(format!(
            "the flake fetches {}, not {}",
            text("wheelUrl"),
            wheel[0]
        ));
    }
    for f in rust_files.symmetric_difference(&nix_files) {
        let side = if rust_files.contains(f) {
            BOXLITE_PINS
        } else {
            "the flake"
        };
        problems.push(format!(
            "only {side} has {} at {} ({} bytes, sha256 {})",
            f.0, f.1, f.2, f.3
        ));
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    Ok(format!(
        "{version}: the wheel's sha256 and {} files",
        rust_files.len()
    ))
}
pub fn workspace_root() -> Result<PathBuf> {
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

/// The repository's files: with git, those it tracks or would track (never `target/`);
/// without (a scratch copy), every file under `root`.
pub fn repo_files(sh: &Shell, root: &Path) -> Result<Vec<String>> {
    let mut files = Vec::new();
    if root.join(".git").exists() {
        let listed = cmd!(
            sh,
            "git -C {root} ls-files -z --cached --others --exclude-standard"
        )
        .quiet()
        .read()
        .with_context(|| format!("listing files with git in {}", root.display()))?;
        files.extend(
            listed
                .split('\0')
                .filter(|f| !f.is_empty() && root.join(f).is_file())
                .map(str::to_owned),
        );
    } else {
        let mut dirs = vec![root.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir)? {
                let path = entry?.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if let Ok(rel) = path.strip_prefix(root) {
                    files.push(rel.to_string_lossy().into_owned());
                }
            }
        }
    }
    files.sort();
    files.dedup();
    Ok(files)
}

/// The repository's `.nix` files.
fn nix_files(sh: &Shell, root: &Path) -> Result<Vec<String>> {
    Ok(repo_files(sh, root)?
        .into_iter()
        .filter(|f| f.ends_with(".nix"))
        .collect())
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
pub fn flake_copy(sh: &Shell, root: &Path) -> Result<xshell::TempDir> {
    let dir = sh.create_temp_dir()?;
    for file in repo_files(sh, root)? {
        let from = root.join(&file);
        let to = dir.path().join(&file);
        let parent = to
            .parent()
            .with_context(|| format!("{} has no parent directory", to.display()))?;
        std::fs::create_dir_all(parent)?;
        std::fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
    }
    Ok(dir)
}

fn stand_in_overrides(copy: &Path, lib: &Path) -> Vec<OsString> {
    let mut args = Vec::new();
    let mut add = |input: &str, path: &Path| {
        args.push("--override-input".into());
        args.push(input.into());
        args.push(format!("path:{}", path.display()).into());
    };
    for input in INPUTS {
        add(input, &copy.join("tests/nix-eval").join(input));
    }
    // The stand-in nixpkgs takes its `lib` from this input.
    add("nixpkgs/nixpkgs-lib", lib);
    args
}

/// Flags for the flake commands (they go after the subcommand).
const FLAKE_FLAGS: &[&str] = &["--offline", "--no-write-lock-file"];

/// The scratch flake with its inputs replaced by the stand-ins.
struct Eval<'a> {
    sh: &'a Shell,
    nix: &'a Path,
    flake: &'a str,
    overrides: &'a [OsString],
    structure: &'a Path,
}

impl Eval<'_> {
    /// `nix eval --json <flake>#<output> --apply <function>`.
    fn apply(&self, output: &str, function: &str) -> Result<Value> {
        let (nix, overrides) = (self.nix, self.overrides);
        let installable = format!("{}#{output}", self.flake);
        let out = cmd!(self.sh, "{nix} {NIX_FEATURES...} eval {FLAKE_FLAGS...} --json {overrides...} {installable} --apply {function}")
            .quiet()
            .ignore_status()
            .output()?;
        if !out.status.success() {
            bail!("evaluating {output} failed:\n{}", stderr(&out));
        }
        serde_json::from_slice(&out.stdout).context("nix eval printed no JSON")
    }

    /// Applies `structure.nix`'s `function` to `output`: { checked, failures }.
    fn structure(&self, output: &str, function: &str) -> Result<String> {
        // The assertions are passed as the text of the function rather than `import`ed, so the
        // flake is still evaluated in pure mode.
        let text = std::fs::read_to_string(self.structure)
            .with_context(|| format!("reading {}", self.structure.display()))?;
        let result = self.apply(output, &format!("(\n{text}\n).{function}"))?;
        let failures: Vec<String> = strings(&result["failures"]);
        if !failures.is_empty() {
            bail!("{}", failures.join("\n"));
        }
        Ok(strings(&result["checked"]).join(", "))
    }
}

fn flake_show(eval: &Eval) -> Result<String> {
    let (nix, overrides, flake) = (eval.nix, eval.overrides, eval.flake);
    let out = cmd!(
        eval.sh,
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

/// Each VM test's script, as the stand-in runNixOSTest hands it to the driver, byte-compiled
/// by python3 (the real driver would fail on a syntax error only on a KVM machine).
fn test_scripts(eval: &Eval, system: &str) -> Result<String> {
    let Some(python) = find_tool("python3") else {
        bail!("python3 not found (apt-get install python3)");
    };
    let text = std::fs::read_to_string(eval.structure)?;
    let mut scripts = serde_json::Map::new();
    // The nested-KVM tests live in legacyPackages (`nix flake check` does not build them).
    for output in ["checks", "legacyPackages"] {
        let found = eval.apply(output, &format!("(\n{text}\n).testScripts \"{system}\""))?;
        scripts.extend(found.as_object().context("no test scripts")?.clone());
    }
    let scripts = &scripts;
    if scripts.is_empty() {
        bail!("no VM tests in checks.{system}");
    }
    let dir = eval.sh.create_temp_dir()?;
    let mut problems = Vec::new();
    for (name, script) in scripts {
        let file = dir.path().join(format!("{name}.py"));
        std::fs::write(
            &file,
            script.as_str().context("a test script is not a string")?,
        )?;
        let out = cmd!(eval.sh, "{python} -m py_compile {file}")
            .quiet()
            .ignore_status()
            .output()?;
        if !out.status.success() {
            problems.push(format!("{name}: {}", stderr(&out)));
        }
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    Ok(scripts.keys().cloned().collect::<Vec<_>>().join(", "))
}

fn modules(sh: &Shell, nix: &Path, copy: &Path, lib: &Path) -> Result<String> {
    let expr = format!(
        "import {} {{ lib = import {}; }}",
        copy.join("tests/nix-eval/modules.nix").display(),
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

/// Every file the workspace's tests read through `CARGO_MANIFEST_DIR` or `include_str!`
/// exists in the source the flake's checks build from: a file outside the crane file set
/// fails `checks.nextest` only on a machine that can run it.
fn crate_source(eval: &Eval, copy: &Path) -> Result<String> {
    let src = eval.apply(
        "packages",
        "p: builtins.unsafeDiscardStringContext \"${p.x86_64-linux.sandbox-unwrapped.src}\"",
    )?;
    let src = PathBuf::from(src.as_str().context("no source path")?);
    let read = crate::sources::files_read_by_tests(copy)?;
    if read.is_empty() {
        bail!("found no file the tests read; the scan in xtask/src/sources.rs is broken");
    }
    let missing: Vec<String> = read
        .iter()
        .filter(|f| !src.join(f).exists())
        .map(|f| f.display().to_string())
        .collect();
    if !missing.is_empty() {
        bail!(
            "read by tests but not in the crane source (add them to the file set in flake.nix): {}",
            missing.join(", ")
        );
    }
    Ok(format!("{} files", read.len()))
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
                || (l.starts_with("warning: the group") && l.contains("build-users-group"))
                || t.starts_with('\u{2022}')
                || t.starts_with('\'')
                || t.starts_with('\u{2192}'))
        })
        .collect::<Vec<_>>()
        .join("\n")
}
