//! The hosts a credential serves, each on a path of the proxy's own (`/cred/ROUTE/...`): its
//! definition's host at `/cred/NAME`, and others that take the same secret in their own form
//! — GitHub's git host (`github.com`, HTTP Basic) beside its REST API (`api.github.com`,
//! bearer). A route's name is never another credential's, so a path names one host.
//!
//! A route git uses also gives git, through the run's environment, what sends that host's
//! HTTPS remotes to the route and answers git's credential question with the placeholder
//! ([`Route::git_config`]): the real token only ever exists in the proxy.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use zeroize::Zeroize;

/// One host of a credential and how the secret goes to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The path's name (`/cred/NAME`): the credential's own for its definition's host,
    /// another (`github-git`) for the others.
    pub name: String,
    /// The real host, reached over TLS (unless `tls` is off: a loopback gateway).
    pub host: String,
    pub port: u16,
    pub tls: bool,
    /// The request header the secret goes in (lower case).
    pub header: String,
    /// The header's value: `{secret}` stands for the secret, `{basic:USER}` for the base64
    /// of `USER:SECRET` (HTTP Basic credentials).
    pub value: String,
    /// The git remotes sent to this route, if git uses it.
    pub git: Option<GitRemote>,
}

/// The git remotes a route serves, and how git is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitRemote {
    /// The remote URLs' prefix (`https://github.com/`): git rewrites it to the route's path
    /// (`url.<route>.insteadOf`).
    pub url: String,
    /// The user name git's credential helper answers, with the placeholder as the password
    /// (GitHub takes a token as the password of `x-access-token`).
    pub user: String,
}

impl Route {
    /// The route on the proxy, `{proxy}` standing for its `127.0.0.1:PORT`.
    pub fn proxy_url(&self) -> String {
        format!("http://{{proxy}}/cred/{}", self.name)
    }

    /// How a program reaches it, for messages: `git's https://github.com/ remotes (the
    /// proxy's /cred/github-git)`.
    pub fn reached_by(&self) -> String {
        match &self.git {
            Some(git) => format!(
                "git's {} remotes (the proxy's /cred/{}, by the run's url.insteadOf)",
                git.url, self.name
            ),
            None => format!("the proxy's /cred/{}", self.name),
        }
    }

    /// `https://host:port` or `http://host:port`, for messages.
    pub fn upstream_url(&self) -> String {
        crate::upstream::Upstream {
            host: self.host.clone(),
            port: self.port,
            tls: self.tls,
        }
        .url()
    }

    /// git's configuration for this route, as `(key, value)` pairs for `GIT_CONFIG_KEY_n` /
    /// `GIT_CONFIG_VALUE_n` (`{proxy}` standing for the proxy's `127.0.0.1:PORT`); empty for a
    /// route git does not use:
    ///
    /// * `url.<route>/.insteadOf=<remote prefix>`: `https://github.com/o/r.git` goes to
    ///   `http://127.0.0.1:PORT/cred/github-git/o/r.git` (plain HTTP on the run's loopback;
    ///   the proxy speaks TLS to the host).
    /// * `credential.<route>.helper=` (empty), then a helper that answers `get` with the user
    ///   and the placeholder. git collects the helpers of every matching `credential.*`
    ///   entry in configuration order, the environment's last, and an empty value clears the
    ///   list so far: no helper of the user's (`~/.gitconfig`, `/etc/gitconfig`, the
    ///   repository's config) is asked for this route, so none can hand git a real token, and
    ///   git never prompts.
    pub fn git_config(&self, placeholder: &str) -> Vec<(String, String)> {
        let Some(git) = &self.git else {
            return Vec::new();
        };
        let route = self.proxy_url();
        let helper = format!("credential.{route}.helper");
        vec![
            (format!("url.{route}/.insteadOf"), git.url.clone()),
            (helper.clone(), String::new()),
            (
                helper,
                format!(
                    "!f() {{ test \"$1\" = get || return 0; echo username={}; echo \
                     password={placeholder}; }}; f",
                    git.user
                ),
            ),
        ]
    }
}

/// `template` with the secret in it: `{secret}` is the secret, `{basic:USER}` the base64 of
/// `USER:SECRET`. Anything else is kept as written.
pub(crate) fn fill(template: &str, secret: &str) -> String {
    // Room for all of it at once: a reallocation would leave a copy of the secret behind.
    let mut out = String::with_capacity(template.len() + 2 * secret.len() + 64);
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let at = &rest[start..];
        if let Some(tail) = at.strip_prefix("{secret}") {
            out.push_str(secret);
            rest = tail;
        } else if let Some((user, tail)) = at
            .strip_prefix("{basic:")
            .and_then(|after| after.split_once('}'))
        {
            let mut pair = String::with_capacity(user.len() + 1 + secret.len());
            pair.push_str(user);
            pair.push(':');
            pair.push_str(secret);
            BASE64.encode_string(pair.as_bytes(), &mut out);
            pair.zeroize();
            rest = tail;
        } else {
            out.push('{');
            rest = &at[1..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_takes_the_secret_plain_or_as_basic_credentials() {
        assert_eq!(fill("Bearer {secret}", "tok"), "Bearer tok");
        assert_eq!(fill("{secret}", "tok"), "tok");
        assert_eq!(
            fill("Basic {basic:x-access-token}", "tok"),
            format!("Basic {}", BASE64.encode("x-access-token:tok"))
        );
        assert_eq!(fill("a {b} {", "tok"), "a {b} {");
    }

    #[test]
    fn a_git_route_sends_its_remotes_to_the_proxy_and_answers_with_the_placeholder() {
        let route = Route {
            name: "github-git".into(),
            host: "github.com".into(),
            port: 443,
            tls: true,
            header: "authorization".into(),
            value: "Basic {basic:x-access-token}".into(),
            git: Some(GitRemote {
                url: "https://github.com/".into(),
                user: "x-access-token".into(),
            }),
        };
        let config = route.git_config("ghp_placeholder");
        assert_eq!(
            config[0],
            (
                "url.http://{proxy}/cred/github-git/.insteadOf".into(),
                "https://github.com/".into()
            )
        );
        assert_eq!(
            config[1],
            (
                "credential.http://{proxy}/cred/github-git.helper".into(),
                String::new()
            )
        );
        assert_eq!(config[2].0, config[1].0);
        assert!(
            config[2].1.contains("password=ghp_placeholder"),
            "{config:?}"
        );
        let plain = Route { git: None, ..route };
        assert!(plain.git_config("x").is_empty());
    }
}
