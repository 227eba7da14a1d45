//! A tiny OCI image layout, written from files given in memory: for the boot probe (which
//! needs an image but not a userland) and for tests when `cargo xtask box-image`'s layout is
//! not there. It is a real layout — `oci-layout`, `index.json`, a manifest, a config and one
//! gzip layer, all addressed by sha256 — that BoxLite imports like any other.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::runtime_files::sha256_bytes;

/// One file of the layer.
pub struct LayerFile<'a> {
    pub path: &'a str,
    pub mode: u32,
    pub data: &'a [u8],
}

/// Writes a one-layer image layout into `dir` (created) whose default command is `cmd`.
pub fn write_tiny_layout(
    dir: &Path,
    files: &[LayerFile<'_>],
    cmd: &[&str],
) -> std::io::Result<PathBuf> {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;

    let mut tar = tar::Builder::new(Vec::new());
    for f in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(f.data.len() as u64);
        header.set_mode(f.mode);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, f.path, f.data)?;
    }
    let raw = tar.into_inner()?;
    let diff_id = format!("sha256:{}", sha256_bytes(&raw));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&raw)?;
    let layer = gz.finish()?;

    let config = serde_json::to_vec(&json!({
        "architecture": oci_arch(),
        "os": "linux",
        "config": { "Cmd": cmd, "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"] },
        "rootfs": { "type": "layers", "diff_ids": [diff_id] },
    }))?;
    let layer_digest = put(&blobs, &layer)?;
    let config_digest = put(&blobs, &config)?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest, "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": layer_digest, "size": layer.len(),
        }],
    }))?;
    let manifest_digest = put(&blobs, &manifest)?;
    std::fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest, "size": manifest.len(),
                "annotations": { "org.opencontainers.image.ref.name": "latest" },
            }],
        }))?,
    )?;
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(dir.to_path_buf())
}

fn put(blobs: &Path, data: &[u8]) -> std::io::Result<String> {
    let hex = sha256_bytes(data);
    std::fs::write(blobs.join(&hex), data)?;
    Ok(format!("sha256:{hex}"))
}

fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The box image for tests: `SANDBOX_TEST_BOX_IMAGE`, else `cargo xtask box-image`'s default
/// output `<workspace>/target/box-image`, when it is an OCI layout.
pub fn test_box_image() -> Option<PathBuf> {
    let dir = std::env::var_os("SANDBOX_TEST_BOX_IMAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/box-image"));
    crate::spec::check_layout(&dir).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tiny_layout_is_content_addressed_and_complete() {
        let dir = tempfile::tempdir().unwrap();
        let out = write_tiny_layout(
            dir.path(),
            &[LayerFile {
                path: "probe/ok",
                mode: 0o755,
                data: b"#!/bin/sh\necho ok\n",
            }],
            &["/probe/ok"],
        )
        .unwrap();
        crate::spec::check_layout(&out).unwrap();
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("index.json")).unwrap()).unwrap();
        let digest = index["manifests"][0]["digest"].as_str().unwrap();
        let manifest_bytes =
            std::fs::read(out.join("blobs/sha256").join(&digest["sha256:".len()..])).unwrap();
        assert_eq!(format!("sha256:{}", sha256_bytes(&manifest_bytes)), digest);
        let manifest: serde_json::Value = serde_json::from_slice(&manifest_bytes).unwrap();
        for blob in [&manifest["config"], &manifest["layers"][0]] {
            let d = blob["digest"].as_str().unwrap();
            let bytes =
                std::fs::read(out.join("blobs/sha256").join(&d["sha256:".len()..])).unwrap();
            assert_eq!(format!("sha256:{}", sha256_bytes(&bytes)), d);
            assert_eq!(blob["size"].as_u64().unwrap(), bytes.len() as u64);
        }
    }
}
