//! The box image: the layout writer and validator on a small root file system made here (always
//! run), and the image `cargo xtask box-image` built (skipped with a reason when it is absent,
//! a failure under `CI=true`).

use super::*;

use serde_json::Value;
use std::process::Stdio;

// --- A root file system made here -------------------------------------------------------------

/// A tar of a root file system the way mmdebstrap writes one (`./` paths, merged /usr), with
/// `programs` as executables under usr/bin.
fn rootfs_tar(dir: &Path, programs: &[&str], passwd: &str) -> PathBuf {
    let path = dir.join("rootfs.tar");
    let mut b = tar::Builder::new(File::create(&path).unwrap());
    let mut entry =
        |path: &str, kind: tar::EntryType, mode: u32, data: &[u8], link: Option<&str>| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_size(data.len() as u64);
            h.set_mtime(SOURCE_DATE_EPOCH);
            h.set_uid(0);
            h.set_gid(0);
            if let Some(link) = link {
                b.append_link(&mut h, path, link).unwrap();
            } else {
                b.append_data(&mut h, path, data).unwrap();
            }
        };
    use tar::EntryType::{Directory, Regular, Symlink};
    for d in ["./", "./etc/", "./home/", "./usr/", "./usr/bin/", "./tmp/"] {
        entry(d, Directory, 0o755, b"", None);
    }
    entry("./bin", Symlink, 0o777, b"", Some("usr/bin"));
    entry("./etc/passwd", Regular, 0o644, passwd.as_bytes(), None);
    entry("./etc/group", Regular, 0o644, b"root:x:0:\n", None);
    for p in programs {
        entry(&format!("./usr/bin/{p}"), Regular, 0o755, b"\x7fELF", None);
    }
    // As in Debian: sh is a relative symlink to dash.
    entry("./usr/bin/sh", Symlink, 0o777, b"", Some("dash"));
    b.into_inner().unwrap().sync_all().unwrap();
    path
}

const ALL_PROGRAMS: &[&str] = &["dash", "bash", "git", "python3", "sleep", "env"];
const ROOT_ONLY: &str = "root:x:0:0:root:/root:/bin/bash\n";

fn small_layout(dir: &Path) -> PathBuf {
    let tar = rootfs_tar(dir, ALL_PROGRAMS, ROOT_ONLY);
    let out = dir.join("layout");
    write_layout(&out, &tar, &USER).unwrap();
    out
}

fn sha256_file(path: &Path) -> String {
    let mut hasher = Sha256::new();
    io::copy(&mut File::open(path).unwrap(), &mut hasher).unwrap();
    hex(&hasher.finalize())
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn blob(dir: &Path, digest: &Value) -> PathBuf {
    let digest = digest.as_str().unwrap().strip_prefix("sha256:").unwrap();
    dir.join("blobs/sha256").join(digest)
}

#[test]
fn a_layout_written_from_a_root_file_system_is_a_valid_oci_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let out = small_layout(tmp.path());

    // Checked here by hand, from the JSON, not through the validator.
    assert_eq!(
        read_json(&out.join("oci-layout")),
        json!({ "imageLayoutVersion": "1.0.0" })
    );
    let index = read_json(&out.join("index.json"));
    assert_eq!(index["schemaVersion"], 2);
    assert_eq!(
        index["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let entry = &index["manifests"][0];
    assert_eq!(
        entry["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(
        entry["annotations"]["org.opencontainers.image.ref.name"],
        "latest"
    );
    // Every blob is named by its own sha256.
    for file in std::fs::read_dir(out.join("blobs/sha256")).unwrap() {
        let path = file.unwrap().path();
        assert_eq!(
            sha256_file(&path),
            path.file_name().unwrap().to_str().unwrap()
        );
    }
    let manifest_path = blob(&out, &entry["digest"]);
    assert_eq!(
        std::fs::metadata(&manifest_path).unwrap().len(),
        entry["size"].as_u64().unwrap()
    );
    let manifest = read_json(&manifest_path);
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.oci.image.config.v1+json"
    );
    let config = read_json(&blob(&out, &manifest["config"]["digest"]));
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 2, "the base and the user layer");
    let diff_ids = config["rootfs"]["diff_ids"].as_array().unwrap();
    assert_eq!(diff_ids.len(), layers.len());
    for (layer, diff_id) in layers.iter().zip(diff_ids) {
        assert_eq!(
            layer["mediaType"],
            "application/vnd.oci.image.layer.v1.tar+gzip"
        );
        let path = blob(&out, &layer["digest"]);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            layer["size"].as_u64().unwrap()
        );
        let mut hasher = Sha256::new();
        io::copy(&mut GzDecoder::new(File::open(&path).unwrap()), &mut hasher).unwrap();
        assert_eq!(
            diff_id.as_str().unwrap(),
            format!("sha256:{}", hex(&hasher.finalize()))
        );
    }
    assert_eq!(config["config"]["Cmd"], json!(["/bin/sleep", "infinity"]));
    assert_eq!(config["config"]["Labels"][LABEL_USER], "sandbox");
    assert_eq!(config["config"]["Labels"][LABEL_UID], "1000");
    assert_eq!(config["os"], "linux");

    // oci-spec parses it, and the validator and the content check accept it.
    let layout = validate(&out).unwrap();
    check_contents(&layout).unwrap();
    let files = layout.merged().unwrap();
    let passwd = String::from_utf8(files["etc/passwd"].data.clone().unwrap()).unwrap();
    assert_eq!(
        passwd,
        format!("{ROOT_ONLY}sandbox:x:1000:1000:sandbox box user:/home/sandbox:/bin/bash\n")
    );
    assert_eq!(resolve(&files, "/bin/sh").unwrap().0, "usr/bin/dash");
}

#[test]
fn the_same_root_file_system_gives_the_same_digests() {
    let tmp = tempfile::tempdir().unwrap();
    let tar = rootfs_tar(tmp.path(), ALL_PROGRAMS, ROOT_ONLY);
    write_layout(&tmp.path().join("a"), &tar, &USER).unwrap();
    write_layout(&tmp.path().join("b"), &tar, &USER).unwrap();
    let blobs = |d: &str| {
        let mut names: Vec<String> = std::fs::read_dir(tmp.path().join(d).join("blobs/sha256"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    assert_eq!(blobs("a"), blobs("b"));
    let a = std::fs::read_to_string(tmp.path().join("a/index.json")).unwrap();
    assert_eq!(
        a,
        std::fs::read_to_string(tmp.path().join("b/index.json")).unwrap()
    );
}

/// Rewrites the layout's configuration with `edit`, then re-hashes it and every descriptor up
/// to index.json, so that only the edit is wrong.
fn edit_config(out: &Path, edit: impl FnOnce(&mut Value)) {
    let mut index = read_json(&out.join("index.json"));
    let manifest_path = blob(out, &index["manifests"][0]["digest"]);
    let mut manifest = read_json(&manifest_path);
    let mut config = read_json(&blob(out, &manifest["config"]["digest"]));
    edit(&mut config);
    let store = |value: &Value| {
        let bytes = serde_json::to_vec(value).unwrap();
        let digest = hex(&Sha256::digest(&bytes));
        std::fs::write(out.join("blobs/sha256").join(&digest), &bytes).unwrap();
        (format!("sha256:{digest}"), bytes.len())
    };
    let (digest, size) = store(&config);
    manifest["config"]["digest"] = json!(digest);
    manifest["config"]["size"] = json!(size);
    let (digest, size) = store(&manifest);
    index["manifests"][0]["digest"] = json!(digest);
    index["manifests"][0]["size"] = json!(size);
    std::fs::write(out.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
}

#[test]
fn the_validator_fails_on_each_kind_of_damage() {
    type Damage = fn(&Path);
    let cases: &[(&str, Damage, &str)] = &[
        (
            "a byte of the big layer changed, size kept",
            |out| {
                let manifest = read_json(&blob(
                    out,
                    &read_json(&out.join("index.json"))["manifests"][0]["digest"],
                ));
                let path = blob(out, &manifest["layers"][0]["digest"]);
                let mut bytes = std::fs::read(&path).unwrap();
                let last = bytes.len() - 1;
                bytes[last] ^= 0xff;
                std::fs::write(&path, bytes).unwrap();
            },
            "layer 0",
        ),
        (
            "the config blob grew",
            |out| {
                let manifest = read_json(&blob(
                    out,
                    &read_json(&out.join("index.json"))["manifests"][0]["digest"],
                ));
                let path = blob(out, &manifest["config"]["digest"]);
                let mut bytes = std::fs::read(&path).unwrap();
                bytes.push(b' ');
                std::fs::write(&path, bytes).unwrap();
            },
            "the descriptor says",
        ),
        (
            "a diff_id that is not the uncompressed layer's",
            |out| {
                edit_config(out, |c| {
                    c["rootfs"]["diff_ids"][1] = json!(format!("sha256:{}", "0".repeat(64)))
                })
            },
            "diff_id",
        ),
        (
            "one diff_id for two layers",
            |out| {
                edit_config(out, |c| {
                    c["rootfs"]["diff_ids"].as_array_mut().unwrap().pop();
                })
            },
            "1 diff_ids for 2 layers",
        ),
        (
            "the index names its manifest with a Docker media type",
            |out| {
                let mut index = read_json(&out.join("index.json"));
                index["manifests"][0]["mediaType"] =
                    json!("application/vnd.docker.distribution.manifest.v2+json");
                std::fs::write(out.join("index.json"), serde_json::to_vec(&index).unwrap())
                    .unwrap();
            },
            "the manifest's mediaType",
        ),
        (
            "index.json without a media type",
            |out| {
                let mut index = read_json(&out.join("index.json"));
                index.as_object_mut().unwrap().remove("mediaType");
                std::fs::write(out.join("index.json"), serde_json::to_vec(&index).unwrap())
                    .unwrap();
            },
            "index.json: mediaType",
        ),
        (
            "a missing layer blob",
            |out| {
                let manifest = read_json(&blob(
                    out,
                    &read_json(&out.join("index.json"))["manifests"][0]["digest"],
                ));
                std::fs::remove_file(blob(out, &manifest["layers"][1]["digest"])).unwrap();
            },
            "layer 1",
        ),
        (
            "no oci-layout file",
            |out| std::fs::remove_file(out.join("oci-layout")).unwrap(),
            "oci-layout",
        ),
    ];
    for (what, damage, expect) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let out = small_layout(tmp.path());
        validate(&out).unwrap_or_else(|e| panic!("{what}: the undamaged layout fails: {e:#}"));
        damage(&out);
        match validate(&out) {
            Ok(_) => panic!("{what}: the damaged layout validates"),
            Err(err) => {
                let err = format!("{err:#}");
                assert!(
                    err.contains(expect),
                    "{what}: failed, but not with {expect:?}: {err}"
                );
            }
        }
    }
}

#[test]
fn the_content_check_names_what_the_image_lacks() {
    let tmp = tempfile::tempdir().unwrap();
    let no_git: Vec<&str> = ALL_PROGRAMS
        .iter()
        .copied()
        .filter(|p| *p != "git")
        .collect();
    let tar = rootfs_tar(tmp.path(), &no_git, ROOT_ONLY);
    let out = tmp.path().join("layout");
    write_layout(&out, &tar, &USER).unwrap();
    let err = check_contents(&validate(&out).unwrap()).unwrap_err();
    assert!(
        format!("{err:#}").contains("/usr/bin/git is missing"),
        "{err:#}"
    );

    // Complete, then with a default command that exits at once.
    let tar = rootfs_tar(tmp.path(), ALL_PROGRAMS, ROOT_ONLY);
    std::fs::remove_dir_all(&out).unwrap();
    write_layout(&out, &tar, &USER).unwrap();
    check_contents(&validate(&out).unwrap()).unwrap();
    edit_config(&out, |c| c["config"]["Cmd"] = json!(["/bin/sh"]));
    let err = check_contents(&validate(&out).unwrap()).unwrap_err();
    assert!(
        format!("{err:#}").contains("the default command"),
        "{err:#}"
    );
}

#[test]
fn a_base_that_already_has_the_uid_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let tar = rootfs_tar(
        tmp.path(),
        ALL_PROGRAMS,
        &format!("{ROOT_ONLY}debian:x:1000:1000::/home/debian:/bin/sh\n"),
    );
    let err = write_layout(&tmp.path().join("layout"), &tar, &USER).unwrap_err();
    assert!(format!("{err:#}").contains("uid 1000"), "{err:#}");
}

// --- The image `cargo xtask box-image` built ----------------------------------------------------

/// The built image at its default place, or None after printing why the test is skipped
/// (under CI its absence is a failure: `.ci/run` builds it first).
fn built_image(test: &str) -> Option<PathBuf> {
    // Not nix_check::workspace_root(): the flake's checks build from a source without
    // flake.nix. (A build output, not a source file the crane source must hold.)
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dir = workspace.join("target/box-image");
    if dir.join("index.json").is_file() {
        return Some(dir);
    }
    let reason = format!(
        "{test}: no box image at {} (build it: cargo xtask box-image)",
        dir.display()
    );
    // Under CI its absence fails: `.ci/run` builds it first.
    sandbox_testkit::skip("box-image", reason);
    None
}

#[test]
fn the_built_image_is_valid_and_holds_the_userland() {
    let Some(dir) = built_image("the_built_image_is_valid_and_holds_the_userland") else {
        return;
    };
    let layout = validate(&dir).unwrap();
    check_contents(&layout).unwrap();
    assert!(layout
        .layers
        .iter()
        .all(|(_, m)| *m == MediaType::ImageLayerGzip));
    let files = layout.merged().unwrap();

    // Debian's: /bin/sh is dash through the merged-/usr symlink, git and python3 are real files.
    assert_eq!(resolve(&files, "/bin/sh").unwrap().0, "usr/bin/dash");
    assert!(resolve(&files, "/usr/bin/python3")
        .unwrap()
        .0
        .starts_with("usr/bin/python3."));
    assert_eq!(
        resolve(&files, "/usr/bin/git").unwrap().1.kind,
        tar::EntryType::Regular
    );
    assert!(
        files.contains_key("etc/ssl/certs/ca-certificates.crt"),
        "no CA bundle"
    );
    assert!(
        files.contains_key("usr/bin/apt-get"),
        "no apt to provision with"
    );
    // The guest brings its own devices.
    assert_eq!(files["dev"].kind, tar::EntryType::Directory);
    assert!(
        !files.keys().any(|p| p.starts_with("dev/")),
        "device nodes in the image"
    );
    let passwd = String::from_utf8(files["etc/passwd"].data.clone().unwrap()).unwrap();
    assert!(passwd.starts_with("root:x:0:0:"), "{passwd}");
    assert!(passwd.lines().any(|l| l == USER.passwd_line()), "{passwd}");
    let config = layout.config.config().clone().unwrap();
    assert_eq!(config.cmd().clone().unwrap(), ["/bin/sleep", "infinity"]);
    assert_eq!(config.labels().clone().unwrap()[LABEL_UID], "1000");
    // The stamp that makes the second run instant names the recipe.
    let stamp = std::fs::read_to_string(stamp_path(&dir)).unwrap();
    assert!(stamp.contains("\"recipeSha256\""), "{stamp}");
}

/// The image's userland, unpacked, runs: the shell, coreutils, git and python3 work together as
/// the box's user, and the default command stays up.
#[test]
fn the_built_userland_runs_as_the_box_user() {
    let Some(dir) = built_image("the_built_userland_runs_as_the_box_user") else {
        return;
    };
    let Some(bwrap) = ["/usr/bin/bwrap", "/bin/bwrap"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file())
    else {
        sandbox_testkit::skip(
            "bwrap",
            "the_built_userland_runs_as_the_box_user: bwrap not found (apt-get install bubblewrap)",
        );
        return;
    };
    let layout = validate(&dir).unwrap();
    let root = tempfile::tempdir().unwrap();
    layout.unpack(root.path()).unwrap();
    let config = layout.config.config().clone().unwrap();
    let path = config
        .env()
        .clone()
        .unwrap()
        .into_iter()
        .find(|e| e.starts_with("PATH="))
        .unwrap();
    let cmd = config.cmd().clone().unwrap();

    let script = r#"
        set -eu
        echo "user=$(id -un) uid=$(id -u) home=$(getent passwd "$(id -un)" | cut -d: -f6)"
        git --version
        git init -q /tmp/repo && cd /tmp/repo
        printf 'hello\n' > file
        git add file
        git -c user.name=Box -c user.email=box@example.test commit -qm 'made in the box'
        echo "log=$(git log --format=%s)"
        python3 -c 'import json, ssl, subprocess, sys; print("python=" + json.dumps([sys.version_info[0], ssl.OPENSSL_VERSION.split()[0], subprocess.check_output(["git", "rev-parse", "--is-inside-work-tree"], text=True).strip()]))'
        # The default command keeps running (timeout kills it: 124) rather than exiting.
        status=0; timeout 1 "$@" || status=$?
        echo "default-command=$status"
    "#;
    let out = Command::new(bwrap)
        .arg("--bind")
        .arg(root.path())
        .args(["/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"])
        .args([
            "--unshare-all",
            "--unshare-user",
            "--uid",
            "1000",
            "--gid",
            "1000",
        ])
        .args(["--die-with-parent", "--clearenv", "--setenv"])
        .args(path.split_once('=').map(|(k, v)| [k, v]).unwrap())
        .args([
            "--setenv", "HOME", "/tmp", "--chdir", "/tmp", "/bin/sh", "-c", script, "sh",
        ])
        .args(&cmd)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0], "user=sandbox uid=1000 home=/home/sandbox",
        "{stdout}"
    );
    assert!(lines[1].starts_with("git version 2."), "{stdout}");
    assert_eq!(lines[2], "log=made in the box", "{stdout}");
    assert_eq!(lines[3], r#"python=[3, "OpenSSL", "true"]"#, "{stdout}");
    assert_eq!(lines[4], "default-command=124", "{stdout}");
}
