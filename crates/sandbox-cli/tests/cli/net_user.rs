//! The network from the user's side: what a developer runs under `--allow-domain` works
//! through the supervisor's proxy, with real tools against loopback servers — `curl` and
//! `git clone` over HTTPS, `pip`, `npm` and `cargo` against static-file registries, and a
//! `--credential` exchanged for the real key only toward its own host. Everything is on
//! loopback: HTTPS file servers on 127.0.0.2 with a test CA, names from a DNS answerer the
//! test runs (`SANDBOX_DNS_SERVER`); the CA reaches each tool inside through the working
//! directory and its own option or variable.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use base64::Engine as _;
use sandbox_testkit::net::{Answerer, HttpsFiles, TestCa};
use sha2::{Digest, Sha256, Sha512};

use crate::common::{self, text, Env};
use crate::net::{unavailable, SERVED};

/// The names the test CA's certificate holds (every server here presents it).
const NAMES: &[&str] = &[
    "git.test",
    "other.test",
    "pypi.test",
    "npm.test",
    "crates.test",
    "api.anthropic.test",
];

/// One test's network: its environment, the CA (in the working directory, which the run
/// sees), a DNS answerer that sends every name to [`SERVED`], and an HTTPS server of the
/// files under `root`.
struct Net {
    env: Env,
    ca: TestCa,
    dns: Answerer,
    root: PathBuf,
}

impl Net {
    /// `None` (after reporting the skip) where the native backend has no network namespace.
    fn new() -> Option<Net> {
        let env = Env::new();
        if let Some(why) = unavailable(&env) {
            common::skip("net-namespace", why);
            return None;
        }
        let ca = TestCa::new(&env.work(), NAMES);
        let zone: Vec<(&str, Ipv4Addr)> = NAMES.iter().map(|n| (*n, SERVED)).collect();
        let dns = Answerer::start(&zone);
        let root = env.path().join("served");
        std::fs::create_dir_all(&root).unwrap();
        // The names' answers are a loopback address, which the proxy refuses unless listed.
        env.write_config(&format!("network:\n  allow_domains: ['{SERVED}']\n"));
        Some(Net { env, ca, dns, root })
    }

    fn serve(&self) -> HttpsFiles {
        HttpsFiles::start(SERVED, &self.ca, &self.root)
    }

    fn report(&self) -> PathBuf {
        self.env.path().join("report.json")
    }

    /// `sandbox run --backend native FLAGS --report-json … -- sh -c SCRIPT` in the working
    /// directory, with the test's resolver and `host_env` on the host's side.
    fn run(&self, flags: &[&str], host_env: &[(&str, &str)], script: &str) -> Output {
        let mut cmd = self.env.cmd();
        cmd.args(["run", "--backend", "native", "--report-json"])
            .arg(self.report())
            .args(flags)
            .args(["--", "sh", "-c", script])
            .env("SANDBOX_DNS_SERVER", self.dns.addr())
            .stdin(Stdio::null());
        for (k, v) in host_env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }

    /// A run's output and its report, for failure messages.
    fn text(&self, out: &Output) -> String {
        let report = std::fs::read_to_string(self.report()).unwrap_or_default();
        format!("{}\nreport: {report}", text(out))
    }

    /// The run's connection log, `(host, allowed, rule)` of each entry.
    fn log(&self) -> Vec<(String, bool, String)> {
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(self.report()).unwrap()).unwrap();
        report["connections"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["host"].as_str().unwrap().to_owned(),
                    c["allowed"].as_bool().unwrap(),
                    c["rule"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }
}

fn write(path: &Path, content: impl AsRef<[u8]>) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {}", text(&out));
}

/// Whether `probe` (a shell command) succeeds inside a native run of `net` (a tool installed
/// under a home the run cannot read is as absent as a missing one); the reason to skip if not.
fn missing_inside(net: &Net, flags: &[&str], probe: &str) -> Option<String> {
    let out = net
        .env
        .cmd()
        .args(["run", "--backend", "native"])
        .args(flags)
        .args(["--", "sh", "-c", probe])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (!out.status.success()).then(|| format!("`{probe}` fails inside a run: {}", text(&out)))
}

#[test]
fn curl_and_git_clone_over_https_from_an_allowed_name() {
    let Some(net) = Net::new() else { return };
    if let Some(why) = missing_inside(&net, &[], "git --version && curl --version") {
        common::skip("net-user-git", why);
        return;
    }
    // A bare repository served as static files (git's dumb HTTP protocol).
    let src = net.env.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    sandbox_testkit::git(&src, &["init", "-q", "-b", "main"]);
    write(&src.join("README"), "cloned through the proxy\n");
    sandbox_testkit::git(&src, &["add", "README"]);
    sandbox_testkit::git(&src, &["commit", "-q", "-m", "first"]);
    let bare = net.root.join("repo.git");
    sandbox_testkit::git(
        &src,
        &["clone", "-q", "--bare", ".", bare.to_str().unwrap()],
    );
    sandbox_testkit::git(&bare, &["update-server-info"]);
    write(&net.root.join("hello.txt"), "hello over https\n");
    let server = net.serve();
    let p = server.port;

    let script = format!(
        "echo curl: $(curl -sS --cacert ca.pem https://git.test:{p}/hello.txt 2>&1); \
         git clone -q https://git.test:{p}/repo.git clone 2>&1 \
           && echo readme: $(cat clone/README); \
         echo other: $(curl -sS --cacert ca.pem https://other.test:{p}/hello.txt 2>&1)"
    );
    let cainfo = format!("GIT_SSL_CAINFO={}", net.ca.pem_file.display());
    let flags = ["--allow-domain", "git.test", "--env", cainfo.as_str()];
    let out = net.run(&flags, &[], &script);
    assert!(out.status.success(), "{}", net.text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("curl: hello over https"),
        "{}",
        net.text(&out)
    );
    assert!(
        stdout.contains("readme: cloned through the proxy"),
        "{}",
        net.text(&out)
    );
    // curl shows the refused tunnel's status; the name never reached the server.
    assert!(
        stdout.contains("other: ") && stdout.contains("403"),
        "{}",
        net.text(&out)
    );
    let seen = server.seen();
    assert!(
        seen.iter().any(|s| s.path == "/repo.git/info/refs"),
        "git fetched through the server: {seen:?}"
    );
    assert!(
        seen.iter()
            .all(|s| s.header("host") != Some(&format!("other.test:{p}"))),
        "{seen:?}"
    );
    let log = net.log();
    assert!(
        log.iter()
            .any(|(h, a, r)| h == "git.test" && *a && r == "git.test"),
        "{log:?}"
    );
    assert!(
        log.iter()
            .any(|(h, a, r)| h == "other.test" && !*a && r == "not-listed"),
        "{log:?}"
    );
    assert!(
        !net.dns.asked().iter().any(|n| n == "other.test"),
        "a refused name is never resolved: {:?}",
        net.dns.asked()
    );
}

/// A wheel: a zip with the module, `METADATA`, `WHEEL` and `RECORD`, written by python3.
fn build_wheel(python: &str, dest: &Path) {
    let script = r#"
import sys, zipfile, hashlib, base64
files = {
    "smallpkg/__init__.py": "VALUE = 'installed from the loopback index'\n",
    "smallpkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: smallpkg\nVersion: 1.0\n",
    "smallpkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
for name, text in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(text.encode())}")
record.append("smallpkg-1.0.dist-info/RECORD,,")
files["smallpkg-1.0.dist-info/RECORD"] = "\n".join(record) + "\n"
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for name, text in files.items():
        z.writestr(name, text)
"#;
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    run_ok(Command::new(python).args(["-c", script]).arg(dest));
}

#[test]
fn pip_installs_from_a_loopback_index_through_the_proxy() {
    let Some(net) = Net::new() else { return };
    let python = "/usr/bin/python3";
    if let Some(why) = missing_inside(&net, &[], &format!("{python} -c 'import venv, ensurepip'")) {
        common::skip("net-user-pip", why);
        return;
    }
    let wheel = net.root.join("files/smallpkg-1.0-py3-none-any.whl");
    build_wheel(python, &wheel);
    let sha = hex(&Sha256::digest(std::fs::read(&wheel).unwrap()));
    // PEP 503: /simple/NAME/ lists the files, with their hashes.
    write(
        &net.root.join("simple/smallpkg/index.html"),
        format!(
            "<!DOCTYPE html><html><body>\
             <a href=\"../../files/smallpkg-1.0-py3-none-any.whl#sha256={sha}\">\
             smallpkg-1.0-py3-none-any.whl</a></body></html>\n"
        ),
    );
    let server = net.serve();
    let p = server.port;
    let script = format!(
        "{python} -m venv venv && \
         venv/bin/pip install -q --no-cache-dir --disable-pip-version-check \
           --index-url https://pypi.test:{p}/simple/ --cert ca.pem smallpkg && \
         venv/bin/python -c 'import smallpkg; print(smallpkg.VALUE)'"
    );
    let out = net.run(&["--allow-domain", "pypi.test"], &[], &script);
    assert!(out.status.success(), "{}", net.text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("installed from the loopback index"),
        "{}",
        net.text(&out)
    );
    let seen = server.seen();
    assert!(
        seen.iter()
            .any(|s| s.path == "/files/smallpkg-1.0-py3-none-any.whl"),
        "{seen:?}"
    );
    let log = net.log();
    assert!(
        log.iter().any(|(h, a, _)| h == "pypi.test" && *a),
        "{log:?}"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `tar czf ARCHIVE -C DIR .` of `files` laid out under `dir/top/`.
fn tarball(dir: &Path, top: &str, files: &[(&str, &str)], archive: &Path) {
    for (name, content) in files {
        write(&dir.join(top).join(name), content);
    }
    std::fs::create_dir_all(archive.parent().unwrap()).unwrap();
    run_ok(
        Command::new("tar")
            .args(["czf"])
            .arg(archive)
            .arg("-C")
            .arg(dir)
            .arg(top),
    );
}

#[test]
fn npm_installs_from_a_loopback_registry_through_the_proxy() {
    let Some(net) = Net::new() else { return };
    if let Some(why) = missing_inside(&net, &[], "npm --version && node --version") {
        common::skip("net-user-npm", why);
        return;
    }
    let tgz = net.root.join("smallpkg/-/smallpkg-1.0.0.tgz");
    tarball(
        &net.env.path().join("npm-src"),
        "package",
        &[
            (
                "package.json",
                r#"{"name":"smallpkg","version":"1.0.0","main":"index.js"}"#,
            ),
            (
                "index.js",
                "module.exports = 'installed from the loopback registry';\n",
            ),
        ],
        &tgz,
    );
    let integrity = format!(
        "sha512-{}",
        base64::engine::general_purpose::STANDARD
            .encode(Sha512::digest(std::fs::read(&tgz).unwrap()))
    );
    let server = net.serve();
    let p = server.port;
    // The package document npm asks for at /NAME.
    let meta = serde_json::json!({
        "name": "smallpkg",
        "dist-tags": {"latest": "1.0.0"},
        "versions": {"1.0.0": {
            "name": "smallpkg",
            "version": "1.0.0",
            "main": "index.js",
            "dist": {
                "tarball": format!("https://npm.test:{p}/smallpkg/-/smallpkg-1.0.0.tgz"),
                "integrity": integrity,
            },
        }},
    });
    write(&net.root.join("smallpkg/index.json"), meta.to_string());
    let script = format!(
        "mkdir app && cd app && echo '{{}}' > package.json && \
         npm install --no-audit --no-fund --no-update-notifier --cache ../npm-cache \
           --registry https://npm.test:{p}/ --cafile ../ca.pem smallpkg && \
         node -e 'console.log(require(\"smallpkg\"))'"
    );
    let out = net.run(&["--allow-domain", "npm.test"], &[], &script);
    assert!(out.status.success(), "{}", net.text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("installed from the loopback registry"),
        "{}",
        net.text(&out)
    );
    let seen = server.seen();
    assert!(
        seen.iter()
            .any(|s| s.path == "/smallpkg/-/smallpkg-1.0.0.tgz"),
        "{seen:?}"
    );
    let log = net.log();
    assert!(log.iter().any(|(h, a, _)| h == "npm.test" && *a), "{log:?}");
}

/// The cargo that runs these tests (`$CARGO`: the toolchain's own binary, not rustup's
/// proxy) and its toolchain's directory, which the run is granted to read (a toolchain under
/// a home other than the run's is not in its view).
fn cargo_bin() -> Option<(PathBuf, PathBuf)> {
    let cargo = PathBuf::from(std::env::var_os("CARGO")?);
    let toolchain = cargo.parent()?.parent()?.to_path_buf();
    Some((cargo, toolchain))
}

#[test]
fn cargo_fetches_from_a_loopback_sparse_registry_through_the_proxy() {
    let Some(net) = Net::new() else { return };
    let Some((cargo, toolchain)) = cargo_bin() else {
        common::skip("net-user-cargo", "$CARGO is not set: not run by cargo");
        return;
    };
    let (cargo, toolchain) = (cargo.display().to_string(), toolchain.display().to_string());
    let grant = ["--allow-read", toolchain.as_str()];
    if let Some(why) = missing_inside(&net, &grant, &format!("{cargo} --version")) {
        common::skip("net-user-cargo", why);
        return;
    }
    let krate = net.root.join("dl/smallcrate/0.1.0/download");
    tarball(
        &net.env.path().join("crate-src"),
        "smallcrate-0.1.0",
        &[
            (
                "Cargo.toml",
                "[package]\nname = \"smallcrate\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
            ),
            (
                "src/lib.rs",
                "pub const VALUE: &str = \"fetched from the loopback registry\";\n",
            ),
        ],
        &krate,
    );
    let cksum = hex(&Sha256::digest(std::fs::read(&krate).unwrap()));
    let server = net.serve();
    let p = server.port;
    write(
        &net.root.join("index/config.json"),
        format!(r#"{{"dl":"https://crates.test:{p}/dl/{{crate}}/{{version}}/download"}}"#),
    );
    write(
        &net.root.join("index/sm/al/smallcrate"),
        format!(
            "{}\n",
            serde_json::json!({
                "name": "smallcrate", "vers": "0.1.0", "deps": [], "cksum": cksum,
                "features": {}, "yanked": false,
            })
        ),
    );
    let app = net.env.work().join("app");
    write(
        &app.join("Cargo.toml"),
        "[package]\nname = \"app\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         [dependencies]\nsmallcrate = { version = \"0.1\", registry = \"loopback\" }\n",
    );
    write(&app.join("src/lib.rs"), "pub use smallcrate::VALUE;\n");
    let script = format!(
        "cd app && CARGO_HOME=$PWD/../cargo-home RUSTC={toolchain}/bin/rustc \
         CARGO_REGISTRIES_LOOPBACK_INDEX=sparse+https://crates.test:{p}/index/ \
         CARGO_HTTP_CAINFO=$PWD/../ca.pem {cargo} fetch && \
         cat ../cargo-home/registry/src/*/smallcrate-0.1.0/src/lib.rs"
    );
    let flags = ["--allow-domain", "crates.test", grant[0], grant[1]];
    let out = net.run(&flags, &[], &script);
    assert!(out.status.success(), "{}", net.text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("fetched from the loopback registry"),
        "{}",
        net.text(&out)
    );
    let seen = server.seen();
    assert!(
        seen.iter().any(|s| s.path == "/index/sm/al/smallcrate")
            && seen
                .iter()
                .any(|s| s.path == "/dl/smallcrate/0.1.0/download"),
        "{seen:?}"
    );
    let log = net.log();
    assert!(
        log.iter().any(|(h, a, _)| h == "crates.test" && *a),
        "{log:?}"
    );
}

const SECRET: &str = "sk-ant-api03-the-real-secret-for-the-loopback-api";

#[test]
fn a_credential_is_exchanged_for_the_real_key_only_toward_its_own_host() {
    let Some(net) = Net::new() else { return };
    write(&net.root.join("v1/messages"), "hello from the api\n");
    let api = net.serve();
    // Another allowed host, on plain HTTP (the proxy sees the request it forwards).
    let other = crate::net::Http::start(SERVED, "the other host");
    let upstream = format!("api.anthropic.test:{}", api.port);
    let host_env = [
        ("ANTHROPIC_API_KEY", SECRET),
        ("SANDBOX_CREDENTIAL_ANTHROPIC_HOST", upstream.as_str()),
        ("SANDBOX_CREDENTIAL_CA", net.ca.pem_file.to_str().unwrap()),
    ];
    let script = format!(
        "echo api: $(curl -sS -H \"x-api-key: $ANTHROPIC_API_KEY\" \
           \"$ANTHROPIC_BASE_URL/v1/messages\" 2>&1); \
         echo other: $(curl -sS -H \"x-api-key: $ANTHROPIC_API_KEY\" \
           http://other.test:{}/ 2>&1); \
         {}",
        other.port,
        crate::credentials::LOOK
    );
    let flags = ["--credential", "anthropic", "--allow-domain", "other.test"];
    let out = net.run(&flags, &host_env, &script);
    assert!(out.status.success(), "{}", net.text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("api: hello from the api"),
        "{}",
        net.text(&out)
    );
    // The loopback API saw the real key, and only that request reached it.
    let seen = api.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].path, "/v1/messages", "{seen:?}");
    assert_eq!(seen[0].header("x-api-key"), Some(SECRET), "{seen:?}");
    // The placeholder toward another allowed host: refused, naming the rule; the host saw
    // nothing.
    assert!(
        stdout.contains("other: sandbox: refused") && stdout.contains("credential-placeholder"),
        "{}",
        net.text(&out)
    );
    assert_eq!(other.requests(), 0, "{}", net.text(&out));
    // Nothing inside held the secret: environment, arguments, files under the home.
    assert!(!stdout.contains(SECRET), "{stdout}");
    assert!(
        stdout.contains("ANTHROPIC_API_KEY=sk-ant-sandbox-placeholder-anthropic"),
        "{stdout}"
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains(SECRET));
    let report = std::fs::read_to_string(net.report()).unwrap();
    assert!(!report.contains(SECRET), "{report}");
    let log = net.log();
    assert!(
        log.iter()
            .any(|(h, a, r)| h == "api.anthropic.test" && *a && r == "credential:anthropic"),
        "{log:?}"
    );
    assert!(
        log.iter()
            .any(|(_, a, r)| !*a && r == "credential-placeholder"),
        "{log:?}"
    );
}
