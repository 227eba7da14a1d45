//! `cargo xtask boxlite-runtime`: BoxLite's runtime files, from the pinned PyPI wheel.
//!
//! The recipe (the flake mirrors it; the pins are in
//! `crates/sandbox-boxlite/src/runtime_files.rs`):
//!
//! 1. Fetch the wheel `boxlite-0.10.8-cp311-cp311-manylinux_2_28_x86_64.whl` with
//!    `python3 -m pip download boxlite==0.10.8 --no-deps --only-binary=:all: --platform
//!    manylinux_2_28_x86_64 --python-version 3.11 --implementation cp --abi cp311` (the
//!    platform flags fetch this exact wheel whatever the local Python is; it is never imported),
//!    or take it from `--wheel FILE`.
//! 2. Check its sha256 against the pin.
//! 3. Read the zip member `boxlite/boxlite.cpython-311-x86_64-linux-gnu.so` (stored deflated).
//! 4. For each pinned file, take `size` bytes at `offset` of that member, check their sha256,
//!    and write them with mode 0755 under the file's name. (In a shell:
//!    `dd if=boxlite.so of=name bs=1M iflag=skip_bytes,count_bytes skip=$offset count=$size`;
//!    never `tail | head`, which SIGPIPEs under `set -o pipefail`.)
//! 5. Into a fresh directory renamed into place at the end, so a half-written runtime is never
//!    found.
//!
//! Output: `<workspace>/target/boxlite-runtime` unless `--out DIR`; the CLI finds it through
//! `SANDBOX_BOXLITE_RUNTIME`, a path baked in at build time, or that default in a workspace
//! build.

use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use sandbox_boxlite::runtime_files::{self, sha256_bytes, sha256_file};

pub struct Options {
    pub out: Option<PathBuf>,
    pub wheel: Option<PathBuf>,
}

pub fn run(root: &Path, options: &Options) -> anyhow::Result<PathBuf> {
    let Some(pin) = runtime_files::wheel() else {
        bail!(
            "no BoxLite {} wheel is pinned for this platform (only linux x86_64 is)",
            runtime_files::VERSION
        );
    };
    let out = options
        .out
        .clone()
        .unwrap_or_else(|| root.join("target/boxlite-runtime"));
    if out.is_dir() && runtime_files::check_dir(&out).iter().all(|c| c.is_ok()) {
        eprintln!(
            "boxlite-runtime: {} is complete and matches the pins",
            out.display()
        );
        return Ok(out);
    }

    let wheel = match &options.wheel {
        Some(w) => w.clone(),
        None => download(root, &pin)?,
    };
    let sha = sha256_file(&wheel).with_context(|| format!("reading {}", wheel.display()))?;
    if sha != pin.sha256 {
        bail!(
            "{}: sha256 {sha}, expected {} (the pinned {}); delete it and run again",
            wheel.display(),
            pin.sha256,
            pin.file_name
        );
    }
    eprintln!("boxlite-runtime: {} sha256 ok", wheel.display());

    let module = read_member(&wheel, pin.member)?;
    let parent = out
        .parent()
        .with_context(|| format!("{} has no parent directory", out.display()))?;
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let staging = parent.join(format!(
        ".{}.partial.{}",
        out.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("runtime"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir(&staging).with_context(|| format!("creating {}", staging.display()))?;
    for file in runtime_files::files() {
        let start = usize::try_from(file.offset)?;
        let end = start + usize::try_from(file.size)?;
        let Some(bytes) = module.get(start..end) else {
            bail!(
                "{}: {} ends at {end}, past the module's {} bytes",
                pin.member,
                file.name,
                module.len()
            );
        };
        let sha = sha256_bytes(bytes);
        if sha != file.sha256 {
            bail!(
                "{} at offset {} of {}: sha256 {sha}, expected {}",
                file.name,
                file.offset,
                pin.member,
                file.sha256
            );
        }
        let path = staging.join(file.name);
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        eprintln!("boxlite-runtime: {:<16} {sha}", file.name);
    }
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("replacing {}", out.display()))?;
    }
    std::fs::rename(&staging, &out)
        .with_context(|| format!("moving {} to {}", staging.display(), out.display()))?;
    let bad: Vec<_> = runtime_files::check_dir(&out)
        .into_iter()
        .filter(|c| !c.is_ok())
        .collect();
    if !bad.is_empty() {
        bail!(
            "{}: files do not match after writing: {bad:?}",
            out.display()
        );
    }
    println!("{}", out.display());
    Ok(out)
}

/// The wheel in `target/boxlite-wheel/`, downloaded with pip unless a copy with the pinned hash
/// is already there.
pub(crate) fn download(root: &Path, pin: &runtime_files::Wheel) -> anyhow::Result<PathBuf> {
    let dir = root.join("target/boxlite-wheel");
    let wheel = dir.join(pin.file_name);
    if wheel.is_file() && sha256_file(&wheel)? == pin.sha256 {
        return Ok(wheel);
    }
    std::fs::create_dir_all(&dir)?;
    let sh = xshell::Shell::new()?;
    let args = pin.pip_args;
    eprintln!(
        "boxlite-runtime: python3 -m pip {} -d {}",
        args.join(" "),
        dir.display()
    );
    xshell::cmd!(
        sh,
        "python3 -m pip --disable-pip-version-check {args...} -d {dir}"
    )
    .quiet()
    .run()
    .context(
        "pip download of the BoxLite wheel failed (pip and PyPI are needed; or pass --wheel FILE)",
    )?;
    if !wheel.is_file() {
        bail!("pip did not leave {} in {}", pin.file_name, dir.display());
    }
    Ok(wheel)
}

fn read_member(wheel: &Path, member: &str) -> anyhow::Result<Vec<u8>> {
    let file = std::fs::File::open(wheel)?;
    let mut archive =
        zip::ZipArchive::new(file).with_context(|| format!("{} is not a zip", wheel.display()))?;
    let mut entry = archive
        .by_name(member)
        .with_context(|| format!("{} has no {member}", wheel.display()))?;
    let mut bytes = Vec::with_capacity(usize::try_from(entry.size()).unwrap_or(0));
    entry
        .read_to_end(&mut bytes)
        .with_context(|| format!("inflating {member}"))?;
    Ok(bytes)
}
