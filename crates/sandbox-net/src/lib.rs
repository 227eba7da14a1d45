//! The host-side network proxy behind `--allow-domain` (issue 26): the only way out of a
//! sandbox whose network namespace holds nothing but loopback.
//!
//! * [`AllowList`]: which host names a run may reach — exact names, `*.example.com`
//!   wildcards, built-in [`groups`] (`@github`, `@npm`, `@agents`, …) and explicit IP
//!   addresses. Pure: no I/O.
//! * [`Resolver`]: how the proxy resolves a name itself (the system's resolver, or a DNS
//!   server it is given); the sandbox's own answer never counts.
//! * [`Proxy`]: an HTTP `CONNECT`, plain-HTTP and SOCKS5 `CONNECT` proxy (Tokio; one
//!   listener, told apart by the first byte) that checks the name **before**
//!   resolving it, refuses answers that are not public addresses (DNS rebinding) and IP
//!   literals unless the list names that address, answers every refusal with a body a program
//!   can show (which rule refused, and `--allow-domain NAME` to allow it), and keeps a
//!   [`Connection`] log (host, port, rule, bytes each way) as serde data.
//!
//! * [`Credentials`] (`--credential NAME`): the proxy serves `/cred/NAME/...` as a reverse
//!   proxy to the credential's real host over TLS, adding the real secret; the sandbox only
//!   ever holds a placeholder, which is refused anywhere else.
//!
//! What it does not do (yet): the network namespace, the loopback listener inside it and the
//! proxy variables are the native backend's part (`docs/security.md`); TLS is never
//! intercepted — `CONNECT` relays the encrypted bytes as they are.

mod addr;
pub mod allow;
pub mod credentials;
mod error;
pub mod groups;
mod log;
mod proxy;
mod resolve;
mod routes;
pub mod upstream;

pub use addr::is_public;
pub use allow::{AllowList, Refusal, Target};
pub use credentials::{CredentialError, Credentials, Definition, Secret, Source};
pub use error::NetError;
pub use log::{Connection, Kind};
pub use proxy::{relay_tcp, Proxy};
pub use resolve::Resolver;
pub use upstream::Upstream;
