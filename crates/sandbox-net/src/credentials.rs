//! Credentials that never enter the sandbox (`--credential NAME`, `credentials:` in the
//! configuration).
//!
//! The host reads the secret (an environment variable of the host, a file outside every
//! grant, or the Linux kernel keyring); the sandbox gets a base URL pointing at the proxy
//! (`ANTHROPIC_BASE_URL=http://127.0.0.1:PORT/cred/anthropic`) and a placeholder in the key
//! variable. The proxy serves `/cred/NAME/...` as a reverse proxy: it forwards the request to
//! the credential's real host over TLS (verified against the web PKI's roots), with the
//! credential's header set to the real secret whatever the program sent in it. A request
//! that carries a placeholder anywhere else — a plain-HTTP request to another host, or the
//! path of another credential — is refused (`403`, rule `credential-placeholder`). The
//! program speaks plain HTTP to the proxy on loopback and the proxy speaks TLS to the real
//! host, so no TLS is intercepted and no certificate is installed inside.
//!
//! The definitions are data ([`builtin`]): where the secret is read from, the real host, the
//! header it goes in, and the variables the sandbox gets.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ClientConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use thiserror::Error;
use zeroize::Zeroize;

pub use crate::routes::{GitRemote, Route};

/// Where the host reads a credential's secret; the first source that has it wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// An environment variable of the host (the sandbox gets the placeholder in it instead).
    Env(String),
    /// A file, relative to the credentials directory
    /// (`$XDG_CONFIG_HOME/sandbox/credentials`, a trusted place no grant may cover) unless
    /// absolute. Its content, without trailing white space, is the secret.
    File(PathBuf),
    /// A `user` key of this description in the kernel keyring (`keyctl add user
    /// sandbox:anthropic SECRET @u`), read with `keyctl pipe` where keyutils is installed.
    Keyring(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Env(name) => write!(f, "the host's ${name}"),
            Source::File(path) => write!(f, "the file {}", path.display()),
            Source::Keyring(desc) => write!(f, "the kernel keyring's user key {desc}"),
        }
    }
}

/// One credential: how it is read, where it goes, and what the sandbox sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definition {
    /// The name (`--credential NAME`, the proxy path `/cred/NAME`).
    pub name: String,
    /// What it is for (`policy show`, `--help`).
    pub about: String,
    /// The real host, reached over TLS (unless `tls` is off: a loopback gateway).
    pub host: String,
    pub port: u16,
    /// Whether the proxy speaks TLS to the host; off only toward the host's loopback
    /// (`--credential NAME=http://127.0.0.1:PORT`, [`crate::upstream`]).
    pub tls: bool,
    /// The request header the secret goes in (lower case).
    pub header: String,
    /// The header's value, `{secret}` standing for the secret (`Bearer {secret}`).
    pub value: String,
    /// Where the host reads the secret, in order.
    pub sources: Vec<Source>,
    /// The variables the sandbox gets: `{proxy}` stands for the proxy's `127.0.0.1:PORT`,
    /// `{placeholder}` for this run's placeholder.
    pub env: Vec<(String, String)>,
    /// The placeholder's start (the name follows), so that a program that checks a key's
    /// shape accepts it. Not a secret: only recognisable.
    pub placeholder_prefix: String,
    /// Other hosts that take the same secret, each on a path of its own
    /// (`/cred/github-git`: GitHub's git host, beside its API at `/cred/github`).
    pub routes: Vec<Route>,
}

struct Builtin {
    name: &'static str,
    about: &'static str,
    host: &'static str,
    header: &'static str,
    value: &'static str,
    env_sources: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
    placeholder_prefix: &'static str,
    routes: &'static [BuiltinRoute],
}

/// Another host of a shipped definition ([`Route`]), on port 443 over TLS.
struct BuiltinRoute {
    name: &'static str,
    host: &'static str,
    header: &'static str,
    value: &'static str,
    /// The git remotes' prefix and the user git's credential helper answers.
    git: Option<(&'static str, &'static str)>,
}

/// The shipped definitions. The variable names are the ones each tool reads: Claude Code
/// (`ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY` in `x-api-key`), Codex and the OpenAI SDKs
/// (`OPENAI_BASE_URL`, which includes `/v1`, and `OPENAI_API_KEY` as a bearer token), Gemini
/// CLI (`GOOGLE_GEMINI_BASE_URL`, `GEMINI_API_KEY` in `x-goog-api-key`), and GitHub's REST
/// API clients that take `GITHUB_API_URL` (Octokit, Actions tooling) with `GITHUB_TOKEN`
/// (`gh` only speaks HTTPS to its host, so it cannot use this form); and git over HTTPS to
/// `github.com`, which takes the token as the password of HTTP Basic credentials (the route
/// `github-git`: git inside is configured to use it, [`Route::git_config`]).
const BUILTIN: &[Builtin] = &[
    Builtin {
        name: "anthropic",
        about: "Anthropic's API (Claude Code): ANTHROPIC_API_KEY as x-api-key",
        host: "api.anthropic.com",
        header: "x-api-key",
        value: "{secret}",
        env_sources: &["ANTHROPIC_API_KEY"],
        env: &[
            ("ANTHROPIC_BASE_URL", "http://{proxy}/cred/anthropic"),
            ("ANTHROPIC_API_KEY", "{placeholder}"),
        ],
        placeholder_prefix: "sk-ant-sandbox-placeholder-",
        routes: &[],
    },
    Builtin {
        name: "openai",
        about: "OpenAI's API (Codex): OPENAI_API_KEY as a bearer token",
        host: "api.openai.com",
        header: "authorization",
        value: "Bearer {secret}",
        env_sources: &["OPENAI_API_KEY"],
        env: &[
            ("OPENAI_BASE_URL", "http://{proxy}/cred/openai/v1"),
            ("OPENAI_API_KEY", "{placeholder}"),
        ],
        placeholder_prefix: "sk-sandbox-placeholder-",
        routes: &[],
    },
    Builtin {
        name: "google",
        about: "Google's Gemini API (Gemini CLI): GEMINI_API_KEY as x-goog-api-key",
        host: "generativelanguage.googleapis.com",
        header: "x-goog-api-key",
        value: "{secret}",
        env_sources: &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
        env: &[
            ("GOOGLE_GEMINI_BASE_URL", "http://{proxy}/cred/google"),
            ("GEMINI_API_KEY", "{placeholder}"),
        ],
        placeholder_prefix: "sandbox-placeholder-",
        routes: &[],
    },
    Builtin {
        name: "github",
        about: "GitHub's REST API, and git over HTTPS to github.com: GITHUB_TOKEN (or \
                GH_TOKEN) as a bearer token, and as git's password",
        host: "api.github.com",
        header: "authorization",
        value: "Bearer {secret}",
        env_sources: &["GITHUB_TOKEN", "GH_TOKEN"],
        env: &[
            ("GITHUB_API_URL", "http://{proxy}/cred/github"),
            ("GITHUB_TOKEN", "{placeholder}"),
        ],
        placeholder_prefix: "ghp_sandboxplaceholder",
        routes: &[BuiltinRoute {
            name: "github-git",
            host: "github.com",
            header: "authorization",
            value: "Basic {basic:x-access-token}",
            git: Some(("https://github.com/", "x-access-token")),
        }],
    },
];

/// Every shipped definition.
pub fn builtin() -> Vec<Definition> {
    BUILTIN
        .iter()
        .map(|b| Definition {
            name: b.name.to_owned(),
            about: b.about.to_owned(),
            host: b.host.to_owned(),
            port: 443,
            tls: true,
            header: b.header.to_owned(),
            value: b.value.to_owned(),
            sources: b
                .env_sources
                .iter()
                .map(|v| Source::Env((*v).to_owned()))
                .chain([
                    Source::File(PathBuf::from(b.name)),
                    Source::Keyring(format!("sandbox:{}", b.name)),
                ])
                .collect(),
            env: b
                .env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            placeholder_prefix: b.placeholder_prefix.to_owned(),
            routes: b
                .routes
                .iter()
                .map(|r| Route {
                    name: r.name.to_owned(),
                    host: r.host.to_owned(),
                    port: 443,
                    tls: true,
                    header: r.header.to_owned(),
                    value: r.value.to_owned(),
                    git: r.git.map(|(url, user)| GitRemote {
                        url: url.to_owned(),
                        user: user.to_owned(),
                    }),
                })
                .collect(),
        })
        .collect()
}

/// The shipped definition called `name`.
pub fn find(name: &str) -> Option<Definition> {
    builtin().into_iter().find(|d| d.name == name)
}

/// The definition a run uses for `spec` (`NAME` or `NAME=URL`), with its host as the run's
/// proxy will reach it: the URL's, else `SANDBOX_CREDENTIAL_<NAME>_HOST` of `env` (the
/// host's environment), else the definition's own. Each other route's host likewise, from
/// `SANDBOX_CREDENTIAL_<ROUTE>_HOST` (`SANDBOX_CREDENTIAL_GITHUB_GIT_HOST`). Reads no secret:
/// `why --net`, `policy show` and the run ask the same question here.
pub fn definition(
    spec: &str,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Definition, CredentialError> {
    let name = crate::upstream::spec_name(spec);
    let mut def = find(name).ok_or_else(|| CredentialError::Unknown {
        name: name.to_owned(),
        known: known(),
    })?;
    let (_, url) = crate::upstream::split_spec(spec).map_err(|why| CredentialError::Url {
        spec: spec.to_owned(),
        why,
    })?;
    let upstream = match url {
        Some(url) => Some(url),
        None => upstream_override(name, env)?,
    };
    if let Some(up) = upstream {
        def.host = up.host;
        def.port = up.port;
        def.tls = up.tls;
    }
    for route in &mut def.routes {
        if let Some(up) = upstream_override(&route.name, env)? {
            route.host = up.host;
            route.port = up.port;
            route.tls = up.tls;
        }
    }
    Ok(def)
}

/// `SANDBOX_CREDENTIAL_<NAME>_HOST` of `env`, if set: the HTTPS host route `name` goes to
/// instead of its definition's.
fn upstream_override(
    name: &str,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Option<crate::upstream::Upstream>, CredentialError> {
    let var = upstream_var(name);
    let Some(value) = env(&var).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    let (host, port) = parse_upstream(value.trim()).ok_or_else(|| CredentialError::Upstream {
        var: var.clone(),
        value: value.clone(),
    })?;
    Ok(Some(crate::upstream::Upstream {
        host,
        port,
        tls: true,
    }))
}

/// [`definition`] with the host's own environment.
pub fn definition_for_run(spec: &str) -> Result<Definition, CredentialError> {
    definition(spec, &|name| std::env::var(name).ok())
}

impl Definition {
    /// The variable that points the sandbox at this credential's path of the proxy
    /// (`ANTHROPIC_BASE_URL`).
    pub fn base_url_var(&self) -> Option<&str> {
        self.env
            .iter()
            .find(|(_, v)| v.contains("{proxy}"))
            .map(|(k, _)| k.as_str())
    }

    /// Where the proxy sends it: `https://api.anthropic.com:443`, `http://127.0.0.1:4000`.
    pub fn upstream_url(&self) -> String {
        self.primary().upstream_url()
    }

    /// This run's placeholder for it (the same on every load, so that the policy, which
    /// keeps the key variables from passing in, and the run's proxy agree; not a secret,
    /// only recognisable).
    pub fn placeholder(&self) -> String {
        format!("{}{}", self.placeholder_prefix, self.name)
    }

    /// The definition's own host as a route (`/cred/NAME`).
    fn primary(&self) -> Route {
        Route {
            name: self.name.clone(),
            host: self.host.clone(),
            port: self.port,
            tls: self.tls,
            header: self.header.clone(),
            value: self.value.clone(),
            git: None,
        }
    }

    /// The route at `/cred/NAME`: the definition's own host, or another of its hosts.
    pub fn route(&self, name: &str) -> Option<Route> {
        if name == self.name {
            return Some(self.primary());
        }
        self.routes.iter().find(|r| r.name == name).cloned()
    }

    /// git's configuration for the routes git uses ([`Route::git_config`]), `{proxy}`
    /// standing for the proxy's `127.0.0.1:PORT`.
    pub fn git_config(&self) -> Vec<(String, String)> {
        let placeholder = self.placeholder();
        self.routes
            .iter()
            .flat_map(|r| r.git_config(&placeholder))
            .collect()
    }
}

/// Where credential files are read from: `$XDG_CONFIG_HOME/sandbox/credentials`
/// (`~/.config/sandbox/credentials`), inside the user configuration, a trusted place no grant
/// may cover.
pub fn default_dir() -> PathBuf {
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .unwrap_or_else(|| PathBuf::from("/nonexistent"));
    config.join("sandbox").join("credentials")
}

/// The names of the shipped definitions, for messages.
pub fn known() -> String {
    BUILTIN
        .iter()
        .map(|b| b.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The variable of the host that also trusts a PEM file's CA certificates for the
/// credentials' hosts ([`Credentials::for_run`]).
pub const CA_VAR: &str = "SANDBOX_CREDENTIAL_CA";

/// The pattern of the variables that send a credential to another host
/// (`SANDBOX_CREDENTIAL_ANTHROPIC_HOST=gateway.example.com:8443`).
pub const UPSTREAM_VAR: &str = "SANDBOX_CREDENTIAL_<NAME>_HOST";

/// [`UPSTREAM_VAR`] for credential `name`.
pub fn upstream_var(name: &str) -> String {
    format!(
        "SANDBOX_CREDENTIAL_{}_HOST",
        name.to_ascii_uppercase().replace('-', "_")
    )
}

/// `HOST[:PORT]` (port 443 if none): a DNS name, no scheme, no path.
fn parse_upstream(value: &str) -> Option<(String, u16)> {
    let (host, port) = match value.rsplit_once(':') {
        Some((h, p)) => (h, p.parse::<u16>().ok().filter(|p| *p != 0)?),
        None => (value, 443),
    };
    let name_like = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    name_like.then(|| (host.to_ascii_lowercase(), port))
}

/// A secret in memory: never printed (its `Debug` is redacted), wiped when dropped.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

/// What can go wrong loading credentials.
#[derive(Debug, Error)]
pub enum CredentialError {
    #[error("--credential {name}: no such credential; the credentials are {known}")]
    Unknown { name: String, known: String },

    #[error(
        "--credential {name}: no secret found: {tried}. Set one of them on the host (the \
         sandbox only ever sees a placeholder)"
    )]
    Missing { name: String, tried: String },

    #[error("--credential {name}: reading {source_desc}: {why}")]
    Read {
        name: String,
        source_desc: String,
        why: String,
    },

    #[error("--credential {name}: the secret in {source_desc} is {why}")]
    Invalid {
        name: String,
        source_desc: String,
        why: &'static str,
    },

    #[error(
        "{var}={value}: not HOST or HOST:PORT (a DNS name, optionally a port; no scheme, no \
         path)"
    )]
    Upstream { var: String, value: String },

    #[error(
        "--credential {spec}: {why} (the form is NAME or NAME=URL: https://HOST[:PORT], or \
         http://127.0.0.1:PORT for a gateway on this host's loopback)"
    )]
    Url { spec: String, why: String },

    #[error("the credential proxy's TLS roots: {path}: {why}", path = .path.display())]
    Roots { path: PathBuf, why: String },
}

/// One loaded credential.
#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    pub(crate) def: Definition,
    secret: Secret,
    pub(crate) placeholder: String,
    /// Where the secret came from (`the host's $ANTHROPIC_API_KEY`), for `policy show`.
    pub(crate) from: String,
    /// The file it was read from, if it was.
    file: Option<PathBuf>,
}

impl Loaded {
    /// The header value with the secret in it.
    #[cfg(test)]
    pub(crate) fn header_value(&self) -> String {
        crate::routes::fill(&self.def.value, self.secret.expose())
    }

    /// `route`'s header value with the secret in it.
    pub(crate) fn value_for(&self, route: &Route) -> String {
        crate::routes::fill(&route.value, self.secret.expose())
    }

    /// `sent` (the program's value of the credential's header) with the placeholder
    /// replaced by the secret inside HTTP Basic credentials (`Basic base64(user:PLACEHOLDER)`,
    /// as git sends a token over HTTPS), the user kept; `None` when `sent` is not Basic
    /// credentials holding this placeholder.
    pub(crate) fn basic_value(&self, sent: &[u8]) -> Option<String> {
        let mut user_pass = decode_basic(sent)?;
        if !contains(&user_pass, self.placeholder.as_bytes()) {
            user_pass.zeroize();
            return None;
        }
        let mut text = String::from_utf8(user_pass).ok()?;
        let mut replaced = text.replace(&self.placeholder, self.secret.expose());
        text.zeroize();
        let value = format!("Basic {}", BASE64.encode(&replaced));
        replaced.zeroize();
        Some(value)
    }
}

/// The credentials of one run, their placeholders, and the TLS roots their hosts are
/// verified against.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub(crate) entries: Vec<Loaded>,
    /// `Err`: why TLS cannot be set up (the proxy answers `502` with it).
    pub(crate) tls: Result<Arc<ClientConfig>, String>,
    /// Where a credential's upstream failure is told, once per credential (shared by every
    /// clone: every command's proxy of one run).
    reporter: Reporter,
}

/// Where a failure is told (the run's stderr).
type Sink = Arc<dyn Fn(&str) + Send + Sync>;

/// Tells the user, once per credential, that its host cannot be used ([`Credentials::report_to`]).
#[derive(Clone, Default)]
struct Reporter {
    sink: Option<Sink>,
    told: Arc<std::sync::Mutex<Vec<String>>>,
}

impl fmt::Debug for Reporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reporter")
            .field("sink", &self.sink.is_some())
            .finish()
    }
}

impl Default for Credentials {
    fn default() -> Self {
        Credentials {
            entries: Vec::new(),
            tls: client_config(Vec::new()),
            reporter: Reporter::default(),
        }
    }
}

/// The TLS client configuration: the web PKI's roots and `extra`, with the ring provider
/// (named, not the process default, which another crate could make ambiguous).
fn client_config(extra: Vec<CertificateDer<'static>>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for cert in extra {
        roots
            .add(cert)
            .map_err(|e| format!("a certificate is not usable as a root: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(
        builder.with_root_certificates(roots).with_no_client_auth(),
    ))
}

impl Credentials {
    /// Loads the named shipped credentials, reading each secret from the host's
    /// environment, `credentials_dir` or the kernel keyring.
    pub fn load<S: AsRef<str>>(
        names: &[S],
        credentials_dir: &Path,
    ) -> Result<Credentials, CredentialError> {
        Self::load_with(names, credentials_dir, |name| std::env::var(name).ok())
    }

    /// The credentials a run's policy names (`Policy::credentials`), from the host's
    /// environment, [`default_dir`] or the kernel keyring.
    ///
    /// Two variables of the host redirect them (an API gateway of one's company, a test's
    /// loopback server): `SANDBOX_CREDENTIAL_<NAME>_HOST=HOST[:PORT]` sends credential NAME
    /// to that host instead of its definition's ([`UPSTREAM_VAR`]), and
    /// `SANDBOX_CREDENTIAL_CA=FILE.pem` also trusts that file's CA certificates for every
    /// credential's host ([`CA_VAR`]). Both are read on the host only; nothing inside the
    /// sandbox can set them.
    pub fn for_run<S: AsRef<str>>(names: &[S]) -> Result<Credentials, CredentialError> {
        let out = Self::load(names, &default_dir())?;
        match std::env::var_os(CA_VAR).filter(|v| !v.is_empty()) {
            Some(pem) => out.with_extra_roots(Path::new(&pem)),
            None => Ok(out),
        }
    }

    /// [`Credentials::load`] with the environment given (tests, the daemon's client env).
    pub fn load_with<S: AsRef<str>>(
        names: &[S],
        credentials_dir: &Path,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Credentials, CredentialError> {
        let mut out = Credentials::default();
        for spec in names {
            let spec = spec.as_ref();
            if out
                .entries
                .iter()
                .any(|l| l.def.name == crate::upstream::spec_name(spec))
            {
                continue;
            }
            let def = definition(spec, &env)?;
            let (secret, source) = read_secret(&def, credentials_dir, &env)?;
            let file = match &source {
                Source::File(path) => Some(path.clone()),
                _ => None,
            };
            out = out.with(def, secret, source.to_string());
            if let Some(last) = out.entries.last_mut() {
                last.file = file;
            }
        }
        Ok(out)
    }

    /// Adds a credential with its secret already read (tests; custom definitions).
    pub fn with_secret(self, def: Definition, secret: Secret) -> Credentials {
        self.with(def, secret, "given".to_owned())
    }

    fn with(mut self, def: Definition, secret: Secret, from: String) -> Credentials {
        // The same on every load, so that the policy (which keeps the key variables from
        // passing in) and the run's proxy agree; it is not a secret, only recognisable.
        let placeholder = def.placeholder();
        self.entries.retain(|l| l.def.name != def.name);
        self.entries.push(Loaded {
            def,
            secret,
            placeholder,
            from,
            file: None,
        });
        self
    }

    /// Also trusts the CA certificates in this PEM file for the real hosts (a test's CA, a
    /// company's TLS-inspecting proxy on the host's side).
    pub fn with_extra_roots(mut self, pem: &Path) -> Result<Credentials, CredentialError> {
        let fail = |why: String| CredentialError::Roots {
            path: pem.to_path_buf(),
            why,
        };
        let certs = CertificateDer::pem_file_iter(pem)
            .map_err(|e| fail(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| fail(e.to_string()))?;
        if certs.is_empty() {
            return Err(fail("no certificate in it".into()));
        }
        self.tls = Ok(client_config(certs).map_err(fail)?);
        Ok(self)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Tells `sink` (the run's stderr) when a credential's host cannot be used — not
    /// reached, TLS refused — once per credential for the life of these credentials and
    /// their clones: a program that retries does not repeat it, and the user learns why
    /// its requests fail without reading the report.
    pub fn report_to(mut self, sink: impl Fn(&str) + Send + Sync + 'static) -> Credentials {
        self.reporter.sink = Some(Arc::new(sink));
        self
    }

    /// Reports `message` about credential `name`, unless it was reported already.
    pub(crate) fn report_once(&self, name: &str, message: &str) {
        let Some(sink) = &self.reporter.sink else {
            return;
        };
        {
            let mut told = self
                .reporter
                .told
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if told.iter().any(|n| n == name) {
                return;
            }
            told.push(name.to_owned());
        }
        sink(message);
    }

    /// The credentials' names, in order.
    pub fn names(&self) -> Vec<String> {
        self.entries.iter().map(|l| l.def.name.clone()).collect()
    }

    /// The files the secrets were read from (each must lie outside every grant).
    pub fn files(&self) -> Vec<(String, PathBuf)> {
        self.entries
            .iter()
            .filter_map(|l| l.file.clone().map(|f| (l.def.name.clone(), f)))
            .collect()
    }

    /// Each credential's name and where its secret came from (never the secret).
    pub fn sources(&self) -> Vec<(String, String)> {
        self.entries
            .iter()
            .map(|l| (l.def.name.clone(), l.from.clone()))
            .collect()
    }

    /// The variables the sandbox gets, `{proxy}` standing for the proxy's
    /// `127.0.0.1:PORT` (the caller substitutes it); placeholders already filled in. Every
    /// variable the host reads a secret from is among them (holding the placeholder), so
    /// none passes into the sandbox. Never holds a secret.
    pub fn env_templates(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for l in &self.entries {
            let sources = l.def.sources.iter().filter_map(|s| match s {
                Source::Env(var) => Some((var.clone(), "{placeholder}".to_owned())),
                _ => None,
            });
            for (name, value) in l.def.env.iter().cloned().chain(sources) {
                if out.iter().any(|(n, _)| *n == name) {
                    continue;
                }
                out.push((name, value.replace("{placeholder}", &l.placeholder)));
            }
        }
        out
    }

    /// The templates that do not depend on the proxy's port: the key variables with their
    /// placeholders, which the policy sets (over anything passed) before the run starts.
    pub fn policy_env(&self) -> Vec<(String, String)> {
        self.env_templates()
            .into_iter()
            .filter(|(_, v)| !v.contains("{proxy}"))
            .collect()
    }

    /// The variables with `{proxy}` replaced by `proxy` (`127.0.0.1:PORT`).
    pub fn env_for(&self, proxy: &str) -> Vec<(String, String)> {
        self.env_templates()
            .into_iter()
            .map(|(n, v)| (n, v.replace("{proxy}", proxy)))
            .collect()
    }

    #[cfg(test)]
    pub(crate) fn get(&self, name: &str) -> Option<&Loaded> {
        self.entries.iter().find(|l| l.def.name == name)
    }

    /// The credential served at `/cred/NAME` and that route.
    pub(crate) fn route(&self, name: &str) -> Option<(&Loaded, Route)> {
        self.entries
            .iter()
            .find_map(|l| l.def.route(name).map(|r| (l, r)))
    }

    /// Every path's name (`/cred/NAME`), in order.
    pub fn route_names(&self) -> Vec<String> {
        self.entries
            .iter()
            .flat_map(|l| {
                std::iter::once(l.def.name.clone())
                    .chain(l.def.routes.iter().map(|r| r.name.clone()))
            })
            .collect()
    }

    /// The first credential (other than `except`) whose placeholder occurs in `bytes`.
    pub(crate) fn placeholder_in(&self, bytes: &[u8], except: Option<&str>) -> Option<&Loaded> {
        self.entries.iter().find(|l| {
            Some(l.def.name.as_str()) != except
                && !l.placeholder.is_empty()
                && contains(bytes, l.placeholder.as_bytes())
        })
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;

/// The decoded `user:password` of an HTTP Basic header value (`Basic dXNlcjpwYXNz`).
pub(crate) fn decode_basic(value: &[u8]) -> Option<Vec<u8>> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    BASE64.decode(encoded.trim()).ok()
}

fn read_secret(
    def: &Definition,
    dir: &Path,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<(Secret, Source), CredentialError> {
    let mut tried = Vec::new();
    for source in &def.sources {
        let source = match source {
            Source::File(p) if p.is_relative() => Source::File(dir.join(p)),
            other => other.clone(),
        };
        let desc = source.to_string();
        let value = match &source {
            Source::Env(var) => env(var).filter(|v| !v.is_empty()),
            Source::File(path) => match std::fs::read_to_string(path) {
                Ok(text) => Some(text),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => {
                    return Err(CredentialError::Read {
                        name: def.name.clone(),
                        source_desc: desc,
                        why: e.to_string(),
                    })
                }
            },
            Source::Keyring(desc) => keyring(desc),
        };
        let Some(mut value) = value else {
            tried.push(match &source {
                Source::Env(_) => format!("{desc} is not set"),
                Source::File(_) => format!("{desc} does not exist"),
                Source::Keyring(_) => format!("{desc} is not there (or keyctl is missing)"),
            });
            continue;
        };
        let trimmed = value.trim().to_owned();
        value.zeroize();
        let invalid = |why| CredentialError::Invalid {
            name: def.name.clone(),
            source_desc: desc.clone(),
            why,
        };
        if trimmed.is_empty() {
            return Err(invalid("empty"));
        }
        // It goes into an HTTP header: a line break would start another one.
        if trimmed.bytes().any(|b| b.is_ascii_control()) {
            return Err(invalid("not one line of text"));
        }
        return Ok((Secret(trimmed), source));
    }
    Err(CredentialError::Missing {
        name: def.name.clone(),
        tried: tried.join(", "),
    })
}

/// The kernel keyring's `user` key `desc`, through keyutils' `keyctl` (searching the
/// session, user and process keyrings); `None` if there is none or no `keyctl`.
fn keyring(desc: &str) -> Option<String> {
    #[cfg(target_os = "linux")]
    {
        let out = std::process::Command::new("keyctl")
            .args(["pipe", &format!("%user:{desc}")])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        String::from_utf8(out.stdout).ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = desc;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn an_upstream_override_is_a_host_and_a_port() {
        assert_eq!(
            upstream_var("anthropic"),
            "SANDBOX_CREDENTIAL_ANTHROPIC_HOST"
        );
        assert_eq!(
            parse_upstream("Gateway.example.com:8443"),
            Some(("gateway.example.com".into(), 8443))
        );
        assert_eq!(parse_upstream("api.test"), Some(("api.test".into(), 443)));
        for bad in [
            "https://api.test",
            "api.test/v1",
            "api.test:0",
            ":443",
            "a b",
            "",
        ] {
            assert_eq!(parse_upstream(bad), None, "{bad}");
        }
    }

    #[test]
    fn every_builtin_has_a_base_url_a_placeholder_and_a_source() {
        for def in builtin() {
            assert!(
                def.env
                    .iter()
                    .any(|(_, v)| v.starts_with(&format!("http://{{proxy}}/cred/{}", def.name))),
                "{def:?}"
            );
            assert!(def.env.iter().any(|(_, v)| v == "{placeholder}"), "{def:?}");
            assert!(def.value.contains("{secret}"), "{def:?}");
            assert!(matches!(def.sources[0], Source::Env(_)), "{def:?}");
            assert_eq!(def.header, def.header.to_ascii_lowercase());
        }
        assert_eq!(known(), "anthropic, openai, google, github");
    }

    #[test]
    fn the_sandbox_gets_the_base_url_and_a_placeholder_never_the_secret() {
        let dir = Path::new("/nonexistent");
        let creds = Credentials::load_with(
            &["anthropic", "github"],
            dir,
            env_of(&[
                ("ANTHROPIC_API_KEY", "sk-ant-real"),
                ("GH_TOKEN", "ghp_real"),
            ]),
        )
        .unwrap();
        let env = creds.env_templates();
        let get = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        assert_eq!(
            get("ANTHROPIC_BASE_URL").as_deref(),
            Some("http://{proxy}/cred/anthropic")
        );
        let placeholder = get("ANTHROPIC_API_KEY").unwrap();
        assert_eq!(placeholder, "sk-ant-sandbox-placeholder-anthropic");
        let all = format!("{env:?}{creds:?}");
        assert!(!all.contains("sk-ant-real"), "{all}");
        assert!(!all.contains("ghp_real"), "{all}");
        assert_eq!(
            creds.sources(),
            [
                ("anthropic".into(), "the host's $ANTHROPIC_API_KEY".into()),
                ("github".into(), "the host's $GH_TOKEN".into())
            ]
        );
        // The variable the host read GitHub's token from holds the placeholder inside too.
        assert_eq!(
            get("GH_TOKEN").as_deref(),
            Some("ghp_sandboxplaceholdergithub")
        );
        assert!(creds
            .policy_env()
            .iter()
            .all(|(_, v)| !v.contains("{proxy}") && !v.contains("real")));
        let with_port = creds.env_for("127.0.0.1:4567");
        assert!(with_port.contains(&(
            "GITHUB_API_URL".into(),
            "http://127.0.0.1:4567/cred/github".into()
        )));
    }

    #[test]
    fn githubs_git_host_is_a_route_of_its_own_with_its_own_override() {
        let def = definition("github", &env_of(&[])).unwrap();
        assert_eq!(def.host, "api.github.com");
        let git = def.route("github-git").unwrap();
        assert_eq!(
            (git.host.as_str(), git.port, git.tls),
            ("github.com", 443, true)
        );
        assert_eq!(
            crate::routes::fill(&git.value, "tok"),
            format!("Basic {}", BASE64.encode("x-access-token:tok"))
        );
        assert_eq!(def.route("github").unwrap().host, "api.github.com");
        assert!(def.route("anthropic").is_none());
        // No route's name is a credential's: a path names one host.
        let names: Vec<String> = builtin().into_iter().map(|d| d.name).collect();
        assert!(builtin()
            .iter()
            .flat_map(|d| &d.routes)
            .all(|r| !names.contains(&r.name)));
        // git is sent there, and its credential helper answers with the placeholder.
        let config = def.git_config();
        assert!(config.contains(&(
            "url.http://{proxy}/cred/github-git/.insteadOf".into(),
            "https://github.com/".into()
        )));
        assert!(config
            .iter()
            .any(|(_, v)| v.contains("password=ghp_sandboxplaceholdergithub")));
        // Each host is redirected by its own variable (a test's stand-in); a malformed one
        // stops the run.
        let env = env_of(&[
            ("SANDBOX_CREDENTIAL_GITHUB_GIT_HOST", "git.test:8443"),
            ("SANDBOX_CREDENTIAL_GITHUB_HOST", "api.test"),
        ]);
        let def = definition("github", &env).unwrap();
        assert_eq!((def.host.as_str(), def.port), ("api.test", 443));
        let git = def.route("github-git").unwrap();
        assert_eq!((git.host.as_str(), git.port), ("git.test", 8443));
        let err = definition(
            "github",
            &env_of(&[("SANDBOX_CREDENTIAL_GITHUB_GIT_HOST", "https://x/")]),
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("SANDBOX_CREDENTIAL_GITHUB_GIT_HOST"),
            "{err}"
        );
        let creds = Credentials::load_with(
            &["github"],
            Path::new("/nonexistent"),
            env_of(&[("GITHUB_TOKEN", "t")]),
        )
        .unwrap();
        assert_eq!(creds.route_names(), ["github", "github-git"]);
        assert_eq!(creds.route("github-git").unwrap().0.def.name, "github");
    }

    #[test]
    fn secrets_come_from_a_file_when_the_variable_is_unset() {
        let dir = std::env::temp_dir().join(format!("sandbox-net-cred-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("openai"), "sk-from-file\n").unwrap();
        let creds = Credentials::load_with(&["openai"], &dir, env_of(&[])).unwrap();
        let l = creds.get("openai").unwrap();
        assert_eq!(l.header_value(), "Bearer sk-from-file");
        assert_eq!(l.from, format!("the file {}", dir.join("openai").display()));
        std::fs::write(dir.join("openai"), "a\nb\n").unwrap();
        let err = Credentials::load_with(&["openai"], &dir, env_of(&[])).unwrap_err();
        assert!(err.to_string().contains("not one line"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn secrets_come_from_the_kernel_keyring() {
        use std::process::Command;
        let desc = format!("sandbox-test-credential-{}", std::process::id());
        let added = Command::new("keyctl")
            .args(["add", "user", &desc, "sk-from-the-keyring", "@u"])
            .output();
        let id = match added {
            Ok(out) if out.status.success() => String::from_utf8(out.stdout).unwrap(),
            Ok(out) => {
                sandbox_testkit::skip(
                    "keyctl-add",
                    format!(
                        "keyctl add failed: {}",
                        String::from_utf8_lossy(&out.stderr)
                    ),
                );
                return;
            }
            Err(e) => {
                sandbox_testkit::skip("keyctl", format!("no keyctl (keyutils): {e}"));
                return;
            }
        };
        let mut def = find("anthropic").unwrap();
        def.sources = vec![Source::Keyring(desc.clone())];
        let read = read_secret(&def, Path::new("/nonexistent"), &env_of(&[]));
        let _ = Command::new("keyctl")
            .args(["unlink", id.trim(), "@u"])
            .output();
        let (secret, source) = read.unwrap();
        assert_eq!(secret.expose(), "sk-from-the-keyring");
        assert_eq!(source, Source::Keyring(desc.clone()));
        // Gone: the next read says where it looked.
        let err = read_secret(&def, Path::new("/nonexistent"), &env_of(&[])).unwrap_err();
        assert!(err.to_string().contains(&desc), "{err}");
    }

    #[test]
    fn a_missing_secret_says_every_place_it_looked() {
        let err = Credentials::load_with(&["google"], Path::new("/nonexistent/creds"), env_of(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--credential google"), "{err}");
        assert!(err.contains("$GEMINI_API_KEY is not set"), "{err}");
        assert!(err.contains("$GOOGLE_API_KEY is not set"), "{err}");
        assert!(
            err.contains("/nonexistent/creds/google does not exist"),
            "{err}"
        );
        assert!(err.contains("sandbox:google"), "{err}");
        let err = Credentials::load_with(&["nope"], Path::new("/x"), env_of(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("anthropic, openai, google, github"), "{err}");
    }
}
