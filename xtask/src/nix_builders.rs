//! The builder scripts step of `cargo xtask nix-check`: every `runCommand` body
//! (`buildCommand`) of the flake's top-level x86_64-linux derivations whose inputs can be had
//! here is run as stdenv runs it — `bash -e -u -o pipefail`, in an empty build directory, with
//! the derivation's attributes as its environment and `$out` a fresh path — on the real
//! inputs: the host's copy of each tool its `nativeBuildInputs` name, the real downloads of its
//! fixed-output fetches (the BoxLite wheel, fetched by `cargo xtask boxlite-runtime`'s pip
//! download), the real files the evaluation wrote. What it produces is compared with what the
//! Rust side pins.
//!
//! A script whose inputs cannot be had (a tool the host lacks, a fetch this check cannot make)
//! is `skipped: <reason>` (a failure under `CI=true`). A store path the script only names (a
//! library directory patchelf writes into a binary, never read) is given an empty directory.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use sandbox_boxlite::runtime_files;

/// What running one script showed.
pub enum Outcome {
    /// It ran and its output is right; the text says what was compared.
    Ran(String),
    /// A tool or download it needs is missing here (skipped; under CI a failure).
    Unavailable(String),
    /// It needs a derivation built first (a nixpkgs build), which cannot happen here: skipped.
    NeedsBuild(String),
}

/// stdenv's own tools (its `initialPath` and the standard build environment's packages), taken
/// from the Debian packages that carry them: what a runCommand body may use without naming
/// it in `nativeBuildInputs`.
const STDENV_DEBIAN_PACKAGES: &[&str] = &[
    "coreutils",
    "findutils",
    "diffutils",
    "sed",
    "grep",
    "gawk",
    "tar",
    "gzip",
    "bzip2",
    "xz-utils",
    "bash",
    "make",
    "patch",
];

/// Tools whose host copy must be a particular implementation to stand for the nixpkgs one
/// (Debian's `yq` is the Python jq wrapper, nixpkgs' `yq-go` is mikefarah's).
const IMPLEMENTATIONS: &[(&str, &str, &str)] = &[(
    "yq",
    "mikefarah",
    "mikefarah's yq (nixpkgs' yq-go; `go install github.com/mikefarah/yq/v4@latest`)",
)];

/// Runs the script of `name` (an attribute of the flake's packages or checks for
/// x86_64-linux), described by `builders.nix`. `packages` is `stand-in-packages.nix`'s table,
/// `workspace` where `cargo xtask boxlite-runtime` keeps the wheel, `scratch` a directory to
/// work in.
pub fn run_script(
    name: &str,
    script: &Value,
    packages: &Value,
    workspace: &Path,
    scratch: &Path,
) -> Result<Outcome> {
    let env = script["env"].as_object().context("no env")?;
    if env.get("buildCommand").and_then(Value::as_str).is_none() {
        bail!("{name} has no buildCommand");
    }
    let dir = scratch.join(name);
    std::fs::create_dir_all(&dir)?;

    // The store paths the script names.
    let mut text = String::new();
    for value in env.values() {
        text.push_str(&env_value(value));
        text.push('\n');
    }
    let store_path = regex::Regex::new(r"/nix/store/[0-9a-z]{32}-[^/\s'\x22$;:)]+")?;
    let referenced: BTreeSet<String> = store_path
        .find_iter(&text)
        .map(|m| m.as_str().to_owned())
        .collect();

    let native: BTreeMap<String, &Value> = script["nativeBuildInputs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| Some((d["path"].as_str()?.to_owned(), d)))
        .collect();
    let fetches: BTreeMap<String, &Value> = script["fetches"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| Some((d["path"].as_str()?.to_owned(), d)))
        .collect();

    // A derivation that would have to be built first (anything but a stand-in package, a
    // fetch, or a file the evaluation wrote) rules the script out, before any tool is looked
    // for.
    if let Some(reference) = referenced.iter().find(|r| {
        !Path::new(r.as_str()).exists()
            && !fetches.contains_key(r.as_str())
            && !native.contains_key(r.as_str())
            && packages.get(r.as_str()).is_none()
    }) {
        return Ok(Outcome::NeedsBuild(format!(
            "it needs {reference} built first (no nixpkgs can build here)"
        )));
    }

    // Each referenced store path, as a path here.
    let mut substitute: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut path_dirs = Vec::new();
    let mut provided = Vec::new();
    for reference in &referenced {
        if Path::new(reference).exists() {
            continue;
        }
        if let Some(fetch) = fetches.get(reference) {
            match fetched(fetch, workspace)? {
                Ok(local) => {
                    provided.push(format!(
                        "{} (downloaded)",
                        fetch["name"].as_str().unwrap_or("?")
                    ));
                    substitute.insert(reference.clone(), local);
                }
                Err(reason) => return Ok(Outcome::Unavailable(reason)),
            }
            continue;
        }
        let package = native
            .get(reference)
            .copied()
            .or_else(|| packages.get(reference.as_str()));
        let Some(package) = package else {
            return Ok(Outcome::NeedsBuild(format!(
                "it needs {reference} built first (no nixpkgs can build here)"
            )));
        };
        let pname = package["name"].as_str().unwrap_or("package");
        let local = dir.join("inputs").join(pname.trim_end_matches("-stand-in"));
        let bin = local.join("bin");
        std::fs::create_dir_all(&bin)?;
        let needed = native.contains_key(reference);
        if let Err(reason) = link_tools(package, &bin) {
            if needed {
                return Ok(Outcome::Unavailable(format!(
                    "its nativeBuildInputs need {pname}: {reason}"
                )));
            }
        }
        if needed {
            path_dirs.push(bin);
            provided.push(format!(
                "{} (host tools)",
                pname.trim_end_matches("-stand-in")
            ));
        } else {
            provided.push(format!(
                "{} (only named: an empty directory)",
                pname.trim_end_matches("-stand-in")
            ));
        }
        substitute.insert(reference.clone(), local);
    }
    // A nativeBuildInput the script never names is still on its PATH.
    for (reference, package) in &native {
        if referenced.contains(reference) || Path::new(reference).exists() {
            continue;
        }
        let pname = package["name"].as_str().unwrap_or("package");
        let bin = dir.join("inputs").join(pname).join("bin");
        std::fs::create_dir_all(&bin)?;
        if let Err(reason) = link_tools(package, &bin) {
            return Ok(Outcome::Unavailable(format!(
                "its nativeBuildInputs need {pname}: {reason}"
            )));
        }
        provided.push(format!(
            "{} (host tools)",
            pname.trim_end_matches("-stand-in")
        ));
        path_dirs.push(bin);
    }
    path_dirs.push(stdenv_tools(scratch)?);

    let replace = |s: &str| {
        let mut s = s.to_owned();
        for (from, to) in &substitute {
            s = s.replace(from.as_str(), &to.to_string_lossy());
        }
        s
    };

    // The environment stdenv gives a builder: the derivation's attributes, `passAsFile` ones
    // as files, and its own variables.
    let build = dir.join("build");
    let out = dir.join("out");
    std::fs::create_dir_all(&build)?;
    let pass_as_file: Vec<String> = env
        .get("passAsFile")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    let mut command = Command::new("bash");
    command
        .args(["-e", "-u", "-o", "pipefail", "-c", "eval \"$buildCommand\""])
        .current_dir(&build)
        .env_clear();
    for (key, value) in env {
        let value = replace(&env_value(value));
        if pass_as_file.contains(key) {
            let file = dir.join(format!(".attr-{key}"));
            std::fs::write(&file, value)?;
            command.env(format!("{key}Path"), file);
        } else {
            command.env(key, value);
        }
    }
    let path = std::env::join_paths(&path_dirs)?;
    command
        .env("PATH", path)
        .env("out", &out)
        .env("HOME", "/homeless-shelter")
        .env("NIX_BUILD_TOP", &build)
        .env("TMPDIR", &build)
        .env("NIX_BUILD_CORES", "1")
        .env("SOURCE_DATE_EPOCH", "315532800");
    let result = command
        .output()
        .with_context(|| format!("running bash for {name}"))?;
    if !result.status.success() {
        let code = result.status.code().unwrap_or(-1);
        let why = if code == 141 {
            " (141: a command died of SIGPIPE; under pipefail a pipeline whose writer is cut off \
             by its reader, as `tail … | head -c N` is, fails the build)"
        } else {
            ""
        };
        bail!(
            "{name} ({}): `bash -e -u -o pipefail` exited with {code}{why}\n{}{}",
            script["drvName"].as_str().unwrap_or("?"),
            String::from_utf8_lossy(&result.stdout),
            String::from_utf8_lossy(&result.stderr)
        );
    }
    if !out.exists() {
        bail!("{name}: the script succeeded but created no $out");
    }

    let mut compared = format!("ran on {}", provided.join(", "));
    if !script["patched"].as_array().is_none_or(Vec::is_empty) || name == "boxlite-runtime" {
        compared.push_str("; ");
        compared.push_str(&boxlite_output(script, &out, &substitute, env)?);
    }
    Ok(Outcome::Ran(compared))
}

/// A derivation attribute as the builder sees it (what `derivation` does to each type).
fn env_value(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Bool(true) => "1".to_owned(),
        Value::Bool(false) | Value::Null => String::new(),
        Value::Number(n) => n.to_string(),
        Value::Array(items) => items.iter().map(env_value).collect::<Vec<_>>().join(" "),
        Value::Object(o) => o
            .get("outPath")
            .map(env_value)
            .unwrap_or_else(|| value.to_string()),
    }
}

/// The local copy of a fixed-output fetch, or why there is none. Only the BoxLite wheel can
/// be fetched here.
fn fetched(fetch: &Value, workspace: &Path) -> Result<std::result::Result<PathBuf, String>> {
    let url = fetch["url"].as_str().unwrap_or_default();
    let Some(pin) = runtime_files::wheel() else {
        return Ok(Err(format!(
            "it fetches {url}; no BoxLite wheel is pinned for this host"
        )));
    };
    if !url.ends_with(&format!("/{}", pin.file_name)) {
        return Ok(Err(format!(
            "it fetches {url}, which this check cannot download"
        )));
    }
    match crate::boxlite_runtime::download(workspace, &pin) {
        Ok(wheel) => {
            let sha = runtime_files::sha256_file(&wheel)?;
            if sha != pin.sha256 {
                bail!(
                    "{} has sha256 {sha}, not the pinned {}",
                    wheel.display(),
                    pin.sha256
                );
            }
            Ok(Ok(wheel))
        }
        Err(err) => Ok(Err(format!(
            "the BoxLite wheel could not be downloaded ({err:#}); `cargo xtask boxlite-runtime` \
             fetches it"
        ))),
    }
}

/// Links the host's copies of a stand-in package's binaries into `bin`. Fails when the host has
/// none of them, or one that is another implementation than nixpkgs' (a binary the host
/// lacks is left out: a script that runs it fails with 127, visibly).
fn link_tools(package: &Value, bin: &Path) -> std::result::Result<(), String> {
    let mut linked = 0;
    let mut missing = Vec::new();
    for binary in package["binaries"].as_array().into_iter().flatten() {
        let binary = binary.as_str().unwrap_or_default();
        match host_tool(binary) {
            Ok(host) => {
                let link = bin.join(binary);
                if !link.exists() {
                    std::os::unix::fs::symlink(&host, &link).map_err(|e| e.to_string())?;
                }
                linked += 1;
            }
            Err((true, reason)) => return Err(reason),
            Err((false, reason)) => missing.push(reason),
        }
    }
    if linked == 0 && !missing.is_empty() {
        return Err(missing.join("; "));
    }
    Ok(())
}

/// The host's `binary`, or why it cannot stand for nixpkgs' (true: it is another tool of the
/// same name).
fn host_tool(binary: &str) -> std::result::Result<PathBuf, (bool, String)> {
    let path =
        which(binary).ok_or_else(|| (false, format!("{binary} is not on this host's PATH")))?;
    if let Some((_, marker, wanted)) = IMPLEMENTATIONS.iter().find(|(b, _, _)| *b == binary) {
        let version = Command::new(&path)
            .arg("--version")
            .output()
            .map(|o| {
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            })
            .unwrap_or_default();
        if !version.contains(marker) {
            return Err((
                true,
                format!(
                    "{} is not {wanted} (--version: {})",
                    path.display(),
                    version.trim()
                ),
            ));
        }
    }
    Ok(path)
}

fn which(binary: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p).map(|d| d.join(binary)).find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// A directory of links to the host's copies of stdenv's tools.
fn stdenv_tools(scratch: &Path) -> Result<PathBuf> {
    let dir = scratch.join("stdenv/bin");
    if dir.is_dir() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir)?;
    let listed = Command::new("dpkg")
        .arg("-L")
        .args(STDENV_DEBIAN_PACKAGES)
        .output()
        .context(
            "dpkg -L (the builder scripts step takes stdenv's tools from Debian's packages)",
        )?;
    for line in String::from_utf8_lossy(&listed.stdout).lines() {
        let path = Path::new(line);
        let in_bin = path
            .parent()
            .is_some_and(|p| p.ends_with("bin") || p.ends_with("sbin"));
        if in_bin && path.is_file() {
            if let Some(file) = path.file_name() {
                let link = dir.join(file);
                if !link.exists() {
                    std::os::unix::fs::symlink(path, link)?;
                }
            }
        }
    }
    if !dir.join("bash").exists() || !dir.join("dd").exists() {
        bail!(
            "dpkg -L {} listed no bash or dd; this step needs a Debian host",
            STDENV_DEBIAN_PACKAGES.join(" ")
        );
    }
    Ok(dir)
}

/// The BoxLite runtime the script made, against the Rust side's pins
/// (crates/sandbox-boxlite/src/runtime_files.rs): every pinned file is there with its pinned
/// sha256, except those the flake says it patched, which must carry the interpreter the
/// script was told to set.
fn boxlite_output(
    script: &Value,
    out: &Path,
    substitute: &BTreeMap<String, PathBuf>,
    env: &serde_json::Map<String, Value>,
) -> Result<String> {
    let patched: Vec<String> = script["patched"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    let checks = runtime_files::check_dir_allowing(out, &patched);
    let bad: Vec<String> = checks
        .iter()
        .filter(|c| !c.is_ok())
        .map(|c| format!("{c:?}"))
        .collect();
    if !bad.is_empty() {
        bail!(
            "the runtime it made does not match {}:\n{}",
            "crates/sandbox-boxlite/src/runtime_files.rs",
            bad.join("\n")
        );
    }
    let pinned: BTreeSet<&str> = runtime_files::files().iter().map(|f| f.name).collect();
    let made: BTreeSet<String> = std::fs::read_dir(out)?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    let extra: Vec<&String> = made
        .iter()
        .filter(|m| !pinned.contains(m.as_str()))
        .collect();
    if !extra.is_empty() {
        bail!("the runtime it made has files no pin names: {extra:?}");
    }
    // The loader the script was given, as a path here.
    let build_command = env
        .get("buildCommand")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let interpreter = regex::Regex::new(r"--set-interpreter (\S+)")?
        .captures(build_command)
        .map(|c| {
            let mut s = c[1].to_owned();
            for (from, to) in substitute {
                s = s.replace(from.as_str(), &to.to_string_lossy());
            }
            s
        });
    for name in &patched {
        let Some(expected) = &interpreter else {
            bail!("{name} is declared patched, but the script sets no interpreter");
        };
        let got = Command::new("patchelf")
            .arg("--print-interpreter")
            .arg(out.join(name))
            .output()
            .context("patchelf --print-interpreter")?;
        let got = String::from_utf8_lossy(&got.stdout).trim().to_owned();
        if &got != expected {
            bail!("{name}: interpreter {got}, not {expected}");
        }
    }
    Ok(format!(
        "{} files match {} ({} sha256-pinned, {} patched: {})",
        made.len(),
        "crates/sandbox-boxlite/src/runtime_files.rs",
        made.len() - patched.len(),
        patched.len(),
        patched.join(" ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(body: &str) -> Value {
        serde_json::json!({
            "drvName": "test",
            "env": { "buildCommand": body, "name": "test", "passAsFile": ["expected"], "expected": "hello" },
            "nativeBuildInputs": [],
            "fetches": [],
            "patched": [],
        })
    }

    fn run(body: &str) -> Result<Outcome> {
        let scratch = scratch_dir();
        let result = run_script(
            "t",
            &script(body),
            &serde_json::json!({}),
            &scratch,
            &scratch,
        );
        let _ = std::fs::remove_dir_all(&scratch);
        result
    }

    fn scratch_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "nix-builders-test-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_pipe_whose_reader_stops_early_fails_as_under_stdenv() {
        // `yes` writes forever; `head` stops after one byte, so `yes` dies of SIGPIPE and,
        // under pipefail, the pipeline fails with 141, as `tail | head -c` did.
        let err = match run("yes | head -c 1 > \"$out\"") {
            Err(err) => format!("{err:#}"),
            Ok(_) => panic!("a SIGPIPE under pipefail passed"),
        };
        assert!(err.contains("exited with 141"), "{err}");
    }

    #[test]
    fn unset_variables_fail_and_pass_as_file_attributes_are_files() {
        let err = match run("echo \"$notSet\" > \"$out\"") {
            Err(err) => format!("{err:#}"),
            Ok(_) => panic!("an unset variable passed under -u"),
        };
        assert!(err.contains("notSet: unbound variable"), "{err}");
        match run("test \"$(cat \"$expectedPath\")\" = hello && touch \"$out\"") {
            Ok(Outcome::Ran(_)) => {}
            Ok(_) => panic!("skipped"),
            Err(err) => panic!("{err:#}"),
        }
    }

    #[test]
    fn only_stdenv_tools_and_native_inputs_are_on_path() {
        // jq is on this host, but not in the (empty) nativeBuildInputs.
        if which("jq").is_none() {
            eprintln!("skipped: no jq on this host to leave out");
            return;
        }
        let err = match run("jq --version > \"$out\"") {
            Err(err) => format!("{err:#}"),
            Ok(_) => panic!("a tool outside nativeBuildInputs was found"),
        };
        assert!(err.contains("exited with 127"), "{err}");
    }
}
