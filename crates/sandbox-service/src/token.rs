//! Bearer tokens and their scopes.
//!
//! * The **host** token is the user's: it authenticates control connections and everything
//!   under `/api/`. It lives only in the daemon's memory and a 0600 file in the runtime
//!   directory, and never enters a sandbox.
//! * A **sandbox** token is given to every process of one box (or one `sandbox run` task) as
//!   `SANDBOX_API_TOKEN`. It can post status hooks for that box or task and nothing else.
//!
//! Tokens are 256 random bits; comparison is constant-time so a timing side channel does not
//! leak a valid token byte by byte.

use crate::locks::Locked as _;
use std::sync::Mutex;

use subtle::ConstantTimeEq;

/// What a token may do.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    Host,
    /// Status hooks for this box only.
    Box(String),
    /// Status hooks for this `sandbox run` task only.
    Task(String),
}

impl Scope {
    /// `box:NAME` / `task:NAME`, as the status API shows it.
    pub fn key(&self) -> String {
        match self {
            Scope::Host => "host".into(),
            Scope::Box(name) => format!("box:{name}"),
            Scope::Task(name) => format!("task:{name}"),
        }
    }
}

/// A fresh token: `prefix` + 64 hex digits from the OS's CSPRNG.
pub fn generate(prefix: &str) -> Result<String, std::io::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut out = String::with_capacity(prefix.len() + 64);
    out.push_str(prefix);
    for b in bytes {
        out.push_str(&format!("{b:02x}"));
    }
    Ok(out)
}

/// Constant-time equality (the length is not secret: every token has the same length).
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// What a leased token holds on to: the token is valid only while the lease lasts.
pub trait Lease: Send + Sync {
    /// True once the lease is over (checked every time the token is used).
    fn ended(&self) -> bool;
}

struct Scoped {
    token: String,
    scope: Scope,
    lease: Option<Box<dyn Lease>>,
}

/// The daemon's tokens.
pub struct TokenStore {
    host: String,
    scoped: Mutex<Vec<Scoped>>,
}

impl TokenStore {
    pub fn new() -> Result<Self, std::io::Error> {
        Ok(TokenStore {
            host: generate("sbx-host-")?,
            scoped: Mutex::new(Vec::new()),
        })
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    /// Issues a token for `scope` (never `Host`).
    pub fn issue(&self, scope: Scope) -> Result<String, std::io::Error> {
        self.issue_with(scope, None)
    }

    /// Issues a token for `scope` that stops working when `lease` ends, even before it is
    /// revoked.
    pub fn issue_leased(
        &self,
        scope: Scope,
        lease: Box<dyn Lease>,
    ) -> Result<String, std::io::Error> {
        self.issue_with(scope, Some(lease))
    }

    fn issue_with(
        &self,
        scope: Scope,
        lease: Option<Box<dyn Lease>>,
    ) -> Result<String, std::io::Error> {
        debug_assert!(scope != Scope::Host);
        let token = generate("sbx-sandbox-")?;
        self.scoped.locked().push(Scoped {
            token: token.clone(),
            scope,
            lease,
        });
        Ok(token)
    }

    /// Forgets every token of `scope` (a removed box).
    pub fn revoke(&self, scope: &Scope) {
        self.scoped.locked().retain(|t| t.scope != *scope);
    }

    /// Forgets one token (a task whose lease ended).
    pub fn revoke_token(&self, token: &str) {
        self.scoped.locked().retain(|t| !same(&t.token, token));
    }

    /// The scope of `token`, if it is one of ours and its lease (if any) lasts. Every stored
    /// token is compared, so the time taken does not depend on which one matched.
    pub fn scope_of(&self, token: &str) -> Option<Scope> {
        let mut found = None;
        if same(token, &self.host) {
            found = Some(Scope::Host);
        }
        let mut matched = None;
        let scoped = self.scoped.locked();
        for t in scoped.iter() {
            if same(token, &t.token) && found.is_none() && matched.is_none() {
                matched = Some(t);
            }
        }
        match matched {
            Some(t) if t.lease.as_ref().is_some_and(|l| l.ended()) => None,
            Some(t) => Some(t.scope.clone()),
            None => found,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_are_kept_apart() {
        let store = TokenStore::new().unwrap();
        let a = store.issue(Scope::Box("a".into())).unwrap();
        let b = store.issue(Scope::Box("b".into())).unwrap();
        assert_ne!(a, b);
        assert_eq!(store.scope_of(store.host()), Some(Scope::Host));
        assert_eq!(store.scope_of(&a), Some(Scope::Box("a".into())));
        assert_eq!(store.scope_of(&b), Some(Scope::Box("b".into())));
        // A forged token of the right shape, and a prefix of a real one.
        let forged = format!("sbx-sandbox-{}", "0".repeat(64));
        assert_eq!(store.scope_of(&forged), None);
        assert_eq!(store.scope_of(&a[..a.len() - 1]), None);
        assert_eq!(store.scope_of(""), None);
        store.revoke(&Scope::Box("a".into()));
        assert_eq!(store.scope_of(&a), None);
        assert_eq!(store.scope_of(&b), Some(Scope::Box("b".into())));
        // Two runs of one task hold separate leases: ending one keeps the other.
        let t1 = store.issue(Scope::Task("t".into())).unwrap();
        let t2 = store.issue(Scope::Task("t".into())).unwrap();
        store.revoke_token(&t1);
        assert_eq!(store.scope_of(&t1), None);
        assert_eq!(store.scope_of(&t2), Some(Scope::Task("t".into())));
    }

    #[test]
    fn a_leased_token_ends_with_its_lease() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        struct Flag(Arc<AtomicBool>);
        impl Lease for Flag {
            fn ended(&self) -> bool {
                self.0.load(Ordering::SeqCst)
            }
        }
        let store = TokenStore::new().unwrap();
        let over = Arc::new(AtomicBool::new(false));
        let t = store
            .issue_leased(Scope::Task("t".into()), Box::new(Flag(over.clone())))
            .unwrap();
        assert_eq!(store.scope_of(&t), Some(Scope::Task("t".into())));
        over.store(true, Ordering::SeqCst);
        assert_eq!(store.scope_of(&t), None, "the lease ended, not yet revoked");
        store.revoke_token(&t);
        assert_eq!(store.scope_of(&t), None);
    }

    #[test]
    fn tokens_are_random_and_long() {
        let x = generate("p-").unwrap();
        let y = generate("p-").unwrap();
        assert_ne!(x, y);
        assert_eq!(x.len(), 2 + 64);
        assert!(x[2..].bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
