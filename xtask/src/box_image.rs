//! `cargo xtask box-image`: the OCI image layout directory the BoxLite backend boots from
//! without a registry (`box.create` with `rootfs`, `sandbox exec --rootfs DIR`).
//!
//! The userland is Debian's, installed by `mmdebstrap` from the Debian archive: a shell,
//! coreutils, git, python3, CA certificates and apt (so a box can be provisioned further).
//! Everything after that is done here, with `tar`, `flate2`, `sha2` and `oci-spec`:
//!
//! - layer 1 is mmdebstrap's root file system tar, gzip'd;
//! - layer 2 adds the box's user (`USER`) to `/etc/passwd` and `/etc/group`, its home, and an
//!   empty `/dev` (mmdebstrap's device nodes are left out: the guest mounts its own);
//! - the configuration's default command is `sleep infinity`, so a box stays up between execs.
//!
//! The user is fixed, `sandbox` with uid and gid 1000, rather than the host user's: the image
//! must be the same on every host and in the flake (a Nix build cannot know who will run it),
//! and 1000 is the first regular user on Debian, Ubuntu, Fedora and NixOS, so on most
//! single-user machines the worktrees mounted into the box are writable by it as they are. The
//! backend reads the user from the configuration's labels (`LABEL_USER`, `LABEL_UID`) and can run
//! a command as another uid where the host user differs.
//!
//! A stamp beside the output (`<out>.stamp`) holds the inputs; when it matches and the layout
//! is complete, a second run does nothing.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use oci_spec::image::{
    Arch, ConfigBuilder, Descriptor, DescriptorBuilder, ImageConfiguration,
    ImageConfigurationBuilder, ImageIndex, ImageIndexBuilder, ImageManifest, ImageManifestBuilder,
    MediaType, OciLayout, OciLayoutBuilder, Os, PlatformBuilder, RootFsBuilder, Sha256Digest,
    ANNOTATION_REF_NAME,
};
use serde_json::json;
use sha2::{Digest as _, Sha256};

/// The box's user: its name, uid and gid, home and shell (see the module documentation).
pub const USER: User = User {
    name: "sandbox",
    uid: 1000,
    gid: 1000,
    home: "/home/sandbox",
    shell: "/bin/bash",
};

/// The image's default command: it keeps the box up until it is stopped.
pub const DEFAULT_COMMAND: &[&str] = &["/bin/sleep", "infinity"];

/// Labels the backend reads the user from.
pub const LABEL_USER: &str = "dev.sandbox.box.user";
pub const LABEL_UID: &str = "dev.sandbox.box.uid";

/// The tag in `index.json` (`org.opencontainers.image.ref.name`).
pub const TAG: &str = "latest";

/// Debian release and packages. `--variant=apt` is the essential set plus apt; the rest is
/// asked for by name (their dependencies follow, recommendations do not).
const SUITE: &str = "bookworm";
const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
const VARIANT: &str = "apt";
const PACKAGES: &[&str] = &["bash", "coreutils", "git", "python3", "ca-certificates"];
/// Documentation nobody reads in a box: a third of the size.
const DPKG_EXCLUDES: &[&str] = &[
    "/usr/share/doc/*",
    "/usr/share/man/*",
    "/usr/share/info/*",
    "/usr/share/locale/*",
];
/// Every file's mtime and the image's creation time, so the same packages give the same
/// digests (mmdebstrap honours SOURCE_DATE_EPOCH too).
const SOURCE_DATE_EPOCH: u64 = 1_700_000_000;
const CREATED: &str = "2023-11-14T22:13:20Z";

/// A user of the image.
#[derive(Clone, Copy, Debug)]
pub struct User {
    pub name: &'static str,
    pub uid: u32,
    pub gid: u32,
    pub home: &'static str,
    pub shell: &'static str,
}

impl User {
    pub fn passwd_line(&self) -> String {
        format!(
            "{}:x:{}:{}:sandbox box user:{}:{}",
            self.name, self.uid, self.gid, self.home, self.shell
        )
    }

    pub fn group_line(&self) -> String {
        format!("{}:x:{}:", self.name, self.gid)
    }
}

/// `cargo xtask box-image [--out DIR]`.
pub fn run(args: &[String]) -> Result<PathBuf> {
    let out = match args {
        [] => crate::nix_check::workspace_root()?.join("target/box-image"),
        [flag, dir] if flag == "--out" => absolute(Path::new(dir))?,
        _ => bail!("usage: cargo xtask box-image [--out DIR]"),
    };
    let mirror =
        std::env::var("SANDBOX_BOX_IMAGE_MIRROR").unwrap_or_else(|_| DEFAULT_MIRROR.to_owned());
    let inputs = inputs(&mirror);
    let stamp = stamp_path(&out);

    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == inputs) && is_complete(&out) {
        eprintln!(
            "box-image: up to date (inputs unchanged: {})",
            stamp.display()
        );
        println!("{}", out.display());
        return Ok(out);
    }

    let build = with_suffix(&out, ".build");
    let staged = build.join("layout");
    if build.exists() {
        std::fs::remove_dir_all(&build).with_context(|| format!("removing {}", build.display()))?;
    }
    std::fs::create_dir_all(&build)?;
    let rootfs = build.join("rootfs.tar");
    eprintln!(
        "box-image: installing Debian {SUITE} ({}) from {mirror} with mmdebstrap",
        PACKAGES.join(", ")
    );
    debootstrap(&rootfs, &mirror)?;
    eprintln!("box-image: writing the OCI layout");
    write_layout(&staged, &rootfs, &USER)?;
    let layout = validate(&staged).context("the layout just written does not validate")?;
    check_contents(&layout).context("the image just written lacks something")?;

    let _ = std::fs::remove_file(&stamp);
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    std::fs::rename(&staged, &out)
        .with_context(|| format!("moving the layout to {}", out.display()))?;
    std::fs::write(&stamp, &inputs)?;
    std::fs::remove_dir_all(&build)?;
    let size: u64 = layout.manifest.layers().iter().map(|l| l.size()).sum();
    eprintln!(
        "box-image: done: manifest {}, {} layers, {} MiB compressed, user {} (uid {}), command {:?}",
        layout.index.manifests()[0].digest(),
        layout.manifest.layers().len(),
        size / (1024 * 1024),
        USER.name,
        USER.uid,
        DEFAULT_COMMAND.join(" ")
    );
    println!("{}", out.display());
    Ok(out)
}

fn absolute(path: &Path) -> Result<PathBuf> {
    Ok(if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    })
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

pub fn stamp_path(out: &Path) -> PathBuf {
    with_suffix(out, ".stamp")
}

/// Everything the image is made from. The recipe is this file, so it is hashed in: a change
/// to how the image is made rebuilds it.
fn inputs(mirror: &str) -> String {
    let recipe = hex(&Sha256::digest(include_bytes!("box_image.rs")));
    // The alternate display of a JSON value is `to_string_pretty`'s output.
    format!(
        "{:#}\n",
        json!({
        "suite": SUITE,
        "mirror": mirror,
        "variant": VARIANT,
        "packages": PACKAGES,
        "dpkgExcludes": DPKG_EXCLUDES,
        "architecture": std::env::consts::ARCH,
        "user": USER.passwd_line(),
        "group": USER.group_line(),
        "cmd": DEFAULT_COMMAND,
        "sourceDateEpoch": SOURCE_DATE_EPOCH,
        "recipeSha256": recipe,
        })
    )
}

/// The layout's files are all there with their sizes (the full check, with digests, is
/// `validate`; this one is for the up-to-date test, which must be instant).
fn is_complete(out: &Path) -> bool {
    let check = || -> Result<()> {
        let index = ImageIndex::from_file(out.join("index.json"))?;
        for m in index.manifests() {
            let manifest = ImageManifest::from_file(blob_path(out, m)?)?;
            for d in std::iter::once(manifest.config()).chain(manifest.layers()) {
                let len = std::fs::metadata(blob_path(out, d)?)?.len();
                ensure!(len == d.size(), "size");
            }
        }
        ensure!(!index.manifests().is_empty(), "no manifest");
        Ok(())
    };
    check().is_ok()
}

/// The root file system tar, by mmdebstrap (root mode as root, else user namespaces).
fn debootstrap(tar: &Path, mirror: &str) -> Result<()> {
    let mut cmd = Command::new("mmdebstrap");
    cmd.env("SOURCE_DATE_EPOCH", SOURCE_DATE_EPOCH.to_string())
        .args([
            "--mode=auto",
            "--quiet",
            "--format=tar",
            "--skip=output/dev",
        ])
        .arg(format!("--variant={VARIANT}"))
        .arg(format!("--include={}", PACKAGES.join(",")));
    for pattern in DPKG_EXCLUDES {
        cmd.arg(format!("--dpkgopt=path-exclude={pattern}"));
    }
    cmd.arg(SUITE).arg(tar).arg(mirror);
    let status = match cmd.status() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            bail!("mmdebstrap not found (install: apt-get install mmdebstrap)")
        }
        other => other.context("running mmdebstrap")?,
    };
    ensure!(status.success(), "mmdebstrap failed ({status})");
    Ok(())
}

/// Writes the OCI layout for the root file system tar `rootfs` (a tar of `./…` or `…` paths
/// holding at least `etc/passwd` and `etc/group`) and the user layer for `user` into `dir`.
pub fn write_layout(dir: &Path, rootfs: &Path, user: &User) -> Result<()> {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;

    let base = compress_layer(&blobs, File::open(rootfs)?)?;
    let (passwd, group) = read_accounts(rootfs)?;
    let user_tar = user_layer(&passwd, &group, user)?;
    let users = compress_layer(&blobs, user_tar.as_slice())?;

    let arch = match std::env::consts::ARCH {
        "x86_64" => Arch::Amd64,
        "aarch64" => Arch::ARM64,
        other => bail!("no OCI architecture for {other}"),
    };
    let labels = HashMap::from([
        (LABEL_USER.to_owned(), user.name.to_owned()),
        (LABEL_UID.to_owned(), user.uid.to_string()),
    ]);
    let config = ImageConfigurationBuilder::default()
        .created(CREATED)
        .architecture(arch.clone())
        .os(Os::Linux)
        .config(
            ConfigBuilder::default()
                .cmd(
                    DEFAULT_COMMAND
                        .iter()
                        .map(|s| s.to_string())
                        .collect::<Vec<_>>(),
                )
                .env(vec![
                    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
                    "LANG=C.UTF-8".to_owned(),
                ])
                .working_dir("/")
                .labels(labels)
                .build()?,
        )
        .rootfs(
            RootFsBuilder::default()
                .typ("layers")
                .diff_ids(vec![base.diff_id.clone(), users.diff_id.clone()])
                .build()?,
        )
        .build()?;
    let config = write_blob(&blobs, MediaType::ImageConfig, &canonical_json(&config)?)?;

    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(config)
        .layers(vec![base.descriptor, users.descriptor])
        .build()?;
    let mut manifest = write_blob(
        &blobs,
        MediaType::ImageManifest,
        &canonical_json(&manifest)?,
    )?;
    manifest.set_annotations(Some(HashMap::from([(
        ANNOTATION_REF_NAME.to_owned(),
        TAG.to_owned(),
    )])));
    manifest.set_platform(Some(
        PlatformBuilder::default()
            .architecture(arch)
            .os(Os::Linux)
            .build()?,
    ));
    let index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![manifest])
        .build()?;
    std::fs::write(dir.join("index.json"), canonical_json(&index)?)?;
    OciLayoutBuilder::default()
        .image_layout_version("1.0.0")
        .build()?
        .to_file(dir.join("oci-layout"))?;
    Ok(())
}

struct Layer {
    descriptor: Descriptor,
    diff_id: String,
}

/// Gzips `tar` into a blob, hashing both sides: the blob's digest names it, the uncompressed
/// digest is the configuration's diff_id.
fn compress_layer(blobs: &Path, tar: impl Read) -> Result<Layer> {
    let partial = blobs.join(format!(".partial-{}", std::process::id()));
    let mut uncompressed = HashingReader::new(tar);
    let mut gz = GzEncoder::new(
        HashingWriter::new(BufWriter::new(File::create(&partial)?)),
        Compression::default(),
    );
    io::copy(&mut uncompressed, &mut gz)?;
    let mut compressed = gz.finish()?;
    compressed.inner.flush()?;
    let digest = hex(&compressed.hasher.finalize_reset());
    std::fs::rename(&partial, blobs.join(&digest))?;
    Ok(Layer {
        descriptor: descriptor(MediaType::ImageLayerGzip, compressed.len, &digest)?,
        diff_id: format!("sha256:{}", hex(&uncompressed.hasher.finalize())),
    })
}

/// JSON with its object keys sorted: oci-spec keeps labels and annotations in hash maps, whose
/// order changes from run to run, and the blobs' digests must not. (Sorted here rather than
/// left to serde_json's map, which keeps insertion order when any crate in the build enables
/// its `preserve_order` feature.)
fn canonical_json(value: &impl serde::Serialize) -> Result<Vec<u8>> {
    fn sorted(value: serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => {
                let mut entries: Vec<_> = map.into_iter().collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                serde_json::Value::Object(
                    entries.into_iter().map(|(k, v)| (k, sorted(v))).collect(),
                )
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.into_iter().map(sorted).collect())
            }
            other => other,
        }
    }
    Ok(serde_json::to_vec(&sorted(serde_json::to_value(value)?))?)
}

fn write_blob(blobs: &Path, media_type: MediaType, bytes: &[u8]) -> Result<Descriptor> {
    let digest = hex(&Sha256::digest(bytes));
    std::fs::write(blobs.join(&digest), bytes)?;
    descriptor(media_type, bytes.len() as u64, &digest)
}

fn descriptor(media_type: MediaType, size: u64, digest: &str) -> Result<Descriptor> {
    Ok(DescriptorBuilder::default()
        .media_type(media_type)
        .size(size)
        .digest(digest.parse::<Sha256Digest>()?)
        .build()?)
}

/// `etc/passwd` and `etc/group` of a root file system tar.
fn read_accounts(rootfs: &Path) -> Result<(String, String)> {
    let mut archive = tar::Archive::new(BufReader::new(File::open(rootfs)?));
    let (mut passwd, mut group) = (None, None);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = normalise(&entry.path()?.to_string_lossy());
        let slot = match path.as_str() {
            "etc/passwd" => &mut passwd,
            "etc/group" => &mut group,
            _ => continue,
        };
        let mut text = String::new();
        entry.read_to_string(&mut text)?;
        *slot = Some(text);
    }
    Ok((
        passwd.context("the root file system has no etc/passwd")?,
        group.context("the root file system has no etc/group")?,
    ))
}

/// The second layer: the user's passwd and group entries (the base files with a line added),
/// its home, and an empty /dev.
fn user_layer(passwd: &str, group: &str, user: &User) -> Result<Vec<u8>> {
    let taken = |file: &str, name: &str, id: u32| {
        file.lines().any(|l| {
            let fields: Vec<&str> = l.split(':').collect();
            fields.first() == Some(&name) || fields.get(2) == Some(&id.to_string().as_str())
        })
    };
    ensure!(
        !taken(passwd, user.name, user.uid),
        "the base image already has a user {} or uid {}",
        user.name,
        user.uid
    );
    ensure!(
        !taken(group, user.name, user.gid),
        "the base image already has a group {} or gid {}",
        user.name,
        user.gid
    );
    let append = |file: &str, line: String| {
        let mut text = file.to_owned();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text + &line + "\n"
    };

    let mut builder = tar::Builder::new(Vec::new());
    let mut add = |path: &str, kind: tar::EntryType, mode: u32, owner: u32, data: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_uid(owner.into());
        header.set_gid(owner.into());
        header.set_mtime(SOURCE_DATE_EPOCH);
        header.set_size(data.len() as u64);
        builder.append_data(&mut header, path, data)
    };
    add("dev/", tar::EntryType::Directory, 0o755, 0, b"")?;
    add(
        "etc/passwd",
        tar::EntryType::Regular,
        0o644,
        0,
        append(passwd, user.passwd_line()).as_bytes(),
    )?;
    add(
        "etc/group",
        tar::EntryType::Regular,
        0o644,
        0,
        append(group, user.group_line()).as_bytes(),
    )?;
    let home = user.home.trim_start_matches('/');
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Directory);
    header.set_mode(0o755);
    header.set_uid(user.uid.into());
    header.set_gid(user.gid.into());
    header.set_mtime(SOURCE_DATE_EPOCH);
    header.set_size(0);
    builder.append_data(&mut header, format!("{home}/"), io::empty())?;
    Ok(builder.into_inner()?)
}

/// A tar member's path without `./` and trailing `/`.
pub fn normalise(path: &str) -> String {
    path.trim_start_matches("./")
        .trim_start_matches('/')
        .trim_end_matches('/')
        .to_owned()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R> HashingReader<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
        }
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    len: u64,
}

impl<W> HashingWriter<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            len: 0,
        }
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A layout that validated: its manifest, configuration, and each layer's blob with its media
/// type, in order.
pub struct Layout {
    pub index: ImageIndex,
    pub manifest: ImageManifest,
    pub config: ImageConfiguration,
    pub layers: Vec<(PathBuf, MediaType)>,
}

fn blob_path(dir: &Path, d: &Descriptor) -> Result<PathBuf> {
    let digest = d.digest();
    ensure!(
        digest.algorithm().as_ref() == "sha256",
        "{digest}: only sha256 blobs are expected"
    );
    Ok(dir.join("blobs/sha256").join(digest.digest()))
}

/// Reads a blob and checks its size and digest against `d`.
fn read_blob(dir: &Path, d: &Descriptor) -> Result<Vec<u8>> {
    let path = blob_path(dir, d)?;
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    ensure!(
        bytes.len() as u64 == d.size(),
        "{}: {} bytes, the descriptor says {}",
        d.digest(),
        bytes.len(),
        d.size()
    );
    let actual = hex(&Sha256::digest(&bytes));
    ensure!(
        actual == d.digest().digest(),
        "{}: the blob's sha256 is {actual}",
        d.digest()
    );
    Ok(bytes)
}

/// Validates an OCI image layout directory: `oci-layout` and `index.json` parse (oci-spec), the
/// index and the manifest have the right media types, every blob's size and sha256 match its
/// descriptor, the configuration's diff_ids are the sha256 of the uncompressed layers, one
/// per layer.
pub fn validate(dir: &Path) -> Result<Layout> {
    let layout = OciLayout::from_file(dir.join("oci-layout")).context("oci-layout")?;
    ensure!(
        layout.image_layout_version() == "1.0.0",
        "oci-layout: imageLayoutVersion {}",
        layout.image_layout_version()
    );
    let index = ImageIndex::from_file(dir.join("index.json")).context("index.json")?;
    ensure!(
        index.schema_version() == 2,
        "index.json: schemaVersion {}",
        index.schema_version()
    );
    ensure!(
        index.media_type() == &Some(MediaType::ImageIndex),
        "index.json: mediaType {:?}, not {}",
        index.media_type(),
        MediaType::ImageIndex
    );
    let [entry] = index.manifests().as_slice() else {
        bail!(
            "index.json: {} manifests, expected one",
            index.manifests().len()
        );
    };
    ensure!(
        entry.media_type() == &MediaType::ImageManifest,
        "index.json: the manifest's mediaType is {}",
        entry.media_type()
    );
    let manifest: ImageManifest =
        serde_json::from_slice(&read_blob(dir, entry)?).context("the manifest")?;
    ensure!(
        manifest.schema_version() == 2,
        "manifest: schemaVersion {}",
        manifest.schema_version()
    );
    ensure!(
        manifest.media_type() == &Some(MediaType::ImageManifest),
        "manifest: mediaType {:?}",
        manifest.media_type()
    );
    ensure!(
        manifest.config().media_type() == &MediaType::ImageConfig,
        "manifest: the config's mediaType is {}",
        manifest.config().media_type()
    );
    let config: ImageConfiguration =
        serde_json::from_slice(&read_blob(dir, manifest.config())?).context("the config")?;
    ensure!(
        config.rootfs().typ() == "layers",
        "config: rootfs.type {}",
        config.rootfs().typ()
    );
    let diff_ids = config.rootfs().diff_ids();
    ensure!(
        diff_ids.len() == manifest.layers().len(),
        "config: {} diff_ids for {} layers",
        diff_ids.len(),
        manifest.layers().len()
    );
    ensure!(!manifest.layers().is_empty(), "manifest: no layers");

    let mut layers = Vec::new();
    for (i, (layer, diff_id)) in manifest.layers().iter().zip(diff_ids).enumerate() {
        let path = blob_path(dir, layer)?;
        let media = layer.media_type().clone();
        let (blob, uncompressed) =
            hash_layer(&path, &media).with_context(|| format!("layer {i} ({})", layer.digest()))?;
        ensure!(
            blob.1 == layer.size(),
            "layer {i}: {} bytes, the descriptor says {}",
            blob.1,
            layer.size()
        );
        ensure!(
            blob.0 == layer.digest().digest(),
            "layer {i}: the blob's sha256 is {}, the descriptor says {}",
            blob.0,
            layer.digest()
        );
        ensure!(
            format!("sha256:{uncompressed}") == *diff_id,
            "layer {i}: the uncompressed tar's sha256 is {uncompressed}, the config's diff_id is {diff_id}"
        );
        layers.push((path, media));
    }
    Ok(Layout {
        index,
        manifest,
        config,
        layers,
    })
}

/// (sha256, size) of the blob and sha256 of the tar inside it, in one pass.
fn hash_layer(path: &Path, media: &MediaType) -> Result<((String, u64), String)> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut blob = HashingReader::new(BufReader::new(file));
    let mut sink = HashingWriter::new(io::sink());
    match media {
        MediaType::ImageLayerGzip => {
            io::copy(&mut GzDecoder::new(&mut blob), &mut sink)?;
        }
        MediaType::ImageLayer => {
            io::copy(&mut blob, &mut sink)?;
        }
        other => bail!("mediaType {other} is not a layer type this checks"),
    }
    // Whatever follows the gzip stream still counts towards the blob's digest and size.
    let mut rest = Vec::new();
    blob.read_to_end(&mut rest)?;
    let size = std::fs::metadata(path)?.len();
    Ok((
        (hex(&blob.hasher.finalize()), size),
        hex(&sink.hasher.finalize()),
    ))
}

/// One file of the merged root file system.
#[derive(Clone, Debug)]
pub struct Node {
    pub kind: tar::EntryType,
    pub mode: u32,
    pub uid: u64,
    pub link: Option<String>,
    /// The content of regular files under `etc/` (the rest is not kept).
    pub data: Option<Vec<u8>>,
}

impl Layout {
    /// The layers' tars, decompressed, in order.
    pub fn layer_readers(&self) -> Result<Vec<Box<dyn Read>>> {
        self.layers
            .iter()
            .map(|(path, media)| -> Result<Box<dyn Read>> {
                let file = BufReader::new(File::open(path)?);
                Ok(match media {
                    MediaType::ImageLayerGzip => Box::new(GzDecoder::new(file)),
                    _ => Box::new(file),
                })
            })
            .collect()
    }

    /// The root file system the layers make, path → node, with whiteouts applied.
    pub fn merged(&self) -> Result<BTreeMap<String, Node>> {
        let mut files = BTreeMap::new();
        for reader in self.layer_readers()? {
            let mut archive = tar::Archive::new(reader);
            for entry in archive.entries()? {
                let mut entry = entry?;
                let path = normalise(&entry.path()?.to_string_lossy());
                let (parent, name) = path.rsplit_once('/').unwrap_or(("", &path));
                if name == ".wh..wh..opq" {
                    let prefix = format!("{parent}/");
                    files.retain(|p: &String, _| !p.starts_with(&prefix));
                    continue;
                }
                if let Some(hidden) = name.strip_prefix(".wh.") {
                    let gone = if parent.is_empty() {
                        hidden.to_owned()
                    } else {
                        format!("{parent}/{hidden}")
                    };
                    let prefix = format!("{gone}/");
                    files.retain(|p: &String, _| *p != gone && !p.starts_with(&prefix));
                    continue;
                }
                let header = entry.header();
                let kind = header.entry_type();
                let node = Node {
                    kind,
                    mode: header.mode()?,
                    uid: header.uid()?,
                    link: entry.link_name()?.map(|l| l.to_string_lossy().into_owned()),
                    data: None,
                };
                let keep = kind == tar::EntryType::Regular && path.starts_with("etc/");
                let data = if keep {
                    let mut data = Vec::new();
                    entry.read_to_end(&mut data)?;
                    Some(data)
                } else {
                    None
                };
                files.insert(path, Node { data, ..node });
            }
        }
        Ok(files)
    }

    /// Unpacks the layers, in order, into `dest` (ownership kept when running as root).
    #[cfg(test)]
    pub fn unpack(&self, dest: &Path) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        let root = std::fs::metadata("/proc/self")
            .map(|m| m.uid() == 0)
            .unwrap_or(false);
        for reader in self.layer_readers()? {
            let mut archive = tar::Archive::new(reader);
            archive.set_preserve_permissions(true);
            archive.set_preserve_ownerships(root);
            archive.set_overwrite(true);
            archive.set_unpack_xattrs(false);
            archive.unpack(dest)?;
        }
        Ok(())
    }
}

/// The programs a box needs, by path in the image.
pub const PROGRAMS: &[&str] = &[
    "bin/sh",
    "bin/bash",
    "usr/bin/git",
    "usr/bin/python3",
    "bin/sleep",
    "usr/bin/env",
];

/// What the image must hold beyond a valid layout: the programs (executable, through their
/// symlinks), the user's passwd and group entries, the user's home owned by it, and the
/// default command.
pub fn check_contents(layout: &Layout) -> Result<()> {
    let files = layout.merged()?;
    for program in PROGRAMS {
        let (at, node) =
            resolve(&files, program).with_context(|| format!("/{program} is missing"))?;
        ensure!(
            node.kind == tar::EntryType::Regular && node.mode & 0o111 != 0,
            "/{program} (at /{at}) is not an executable file"
        );
    }
    let text = |path: &str| -> Result<String> {
        let (_, node) = resolve(&files, path).with_context(|| format!("/{path} is missing"))?;
        Ok(String::from_utf8_lossy(node.data.as_deref().unwrap_or_default()).into_owned())
    };
    let passwd = text("etc/passwd")?;
    ensure!(
        passwd.lines().any(|l| l == USER.passwd_line()),
        "/etc/passwd has no line {:?}",
        USER.passwd_line()
    );
    ensure!(
        text("etc/group")?.lines().any(|l| l == USER.group_line()),
        "/etc/group has no line {:?}",
        USER.group_line()
    );
    let (_, home) = resolve(&files, USER.home).context("the user's home is missing")?;
    ensure!(
        home.kind == tar::EntryType::Directory && home.uid == u64::from(USER.uid),
        "{} is not a directory owned by uid {}",
        USER.home,
        USER.uid
    );
    let cmd = layout
        .config
        .config()
        .as_ref()
        .and_then(|c| c.cmd().clone());
    ensure!(
        cmd.as_deref()
            == Some(
                &DEFAULT_COMMAND
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()[..]
            ),
        "the default command is {cmd:?}, not {DEFAULT_COMMAND:?}"
    );
    Ok(())
}

/// Follows `path` through the merged tree's symlinks (relative and absolute) to the node it
/// names, as the kernel would.
pub fn resolve<'a>(files: &'a BTreeMap<String, Node>, path: &str) -> Option<(String, &'a Node)> {
    let mut pending: Vec<String> = normalise(path)
        .split('/')
        .rev()
        .map(str::to_owned)
        .collect();
    let mut current: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(part) = pending.pop() {
        match part.as_str() {
            "" | "." => continue,
            ".." => {
                current.pop();
                continue;
            }
            _ => {}
        }
        current.push(part);
        let joined = current.join("/");
        let node = files.get(&joined)?;
        if node.kind == tar::EntryType::Symlink {
            hops += 1;
            if hops > 40 {
                return None;
            }
            let target = node.link.clone()?;
            current.pop();
            if target.starts_with('/') {
                current.clear();
            }
            pending.extend(target.split('/').rev().map(str::to_owned));
        }
    }
    let joined = current.join("/");
    let node = files.get(&joined)?;
    if node.kind == tar::EntryType::Link {
        // A hard link names the member it shares its content with.
        let target = normalise(node.link.as_deref()?);
        return files.get(&target).map(|n| (target, n));
    }
    Some((joined, node))
}

#[cfg(test)]
mod tests;
