//! The value formats of the configuration that a plain JSON type cannot say: paths, durations,
//! environment-variable names and ports. Each is one regular expression, used twice: the CLI
//! validates with it (below), and `sandbox config schema` publishes it as the JSON Schema
//! `pattern` that the Nix modules turn into `lib.types.strMatching` (nixos-modules/).
//!
//! So the patterns stay in the language both engines read the same way: Rust's `regex` and
//! the POSIX extended expressions of Nix's `builtins.match`. Both match the whole string (the
//! CLI anchors them here, Nix always does); no `\d`, no look-around, no anchors inside.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};

/// A value format: its pattern and what to tell a user whose value does not match.
pub struct Format {
    pub pattern: &'static str,
    pub describe: &'static str,
    regex: LazyLock<Regex>,
}

impl Format {
    pub fn matches(&self, value: &str) -> bool {
        // A NUL cannot reach a Nix string, so the shared pattern need not exclude it.
        !value.contains('\0') && self.regex.is_match(value)
    }
}

macro_rules! format {
    ($name:ident, $pattern:expr, $describe:expr) => {
        pub static $name: Format = Format {
            pattern: $pattern,
            describe: $describe,
            regex: LazyLock::new(|| {
                Regex::new(concat!("^(?:", $pattern, ")$")).expect("a valid pattern")
            }),
        };
    };
}

format!(
    PATH,
    "/.*|~|~/.*", "an absolute path or one that starts with ~/ (your home directory)"
);

// humantime's units, a number of at most nine digits each (so the sum cannot overflow), and
// only spaces between the parts; `parse` still hands the value to humantime.
format!(
    DURATION,
    "( *[0-9]{1,9} *(ns|nsec|nanos|us|usec|ms|msec|millis|s|sec|secs|second|seconds|m|min|mins|minute|minutes|h|hr|hrs|hour|hours|d|day|days|w|wk|wks|week|weeks))+ *",
    "a duration such as 30s, 5m or 1h 30m"
);

// What a process environment can hold: anything but `=` (and NUL).
format!(
    ENV_NAME,
    "[^=]+", "an environment variable name (not empty, no `=`)"
);

format!(
    HOME_SCOPE,
    "per-project|per-task|off", "per-project, per-task or off"
);

format!(
    TOOLCHAIN,
    "[A-Za-z0-9_-]+", "a toolchain name (rust, node, python, ...), auto or none"
);

// The shipped credential definitions (`sandbox_net::credentials`; a test keeps them equal),
// each optionally `=URL` toward another host (`sandbox_net::upstream` checks the URL further:
// plain http:// only to loopback).
format!(
    CREDENTIAL,
    "(anthropic|openai|google|github)(=https?://[^/?#@ ]+/?)?",
    "a credential: anthropic, openai, google or github, optionally =https://HOST[:PORT] or =http://127.0.0.1:PORT (a gateway on this host's loopback)"
);

// `--publish [HOST_ADDR:]HOST_PORT[:INNER_PORT]`: ports 1-65535, an IPv4 address without
// leading zeros, or an IPv6 one in brackets (`sandbox_policy::Publish::parse` checks that one
// further). `[\[]` is the one spelling of a literal `[` both engines take (Rust's regex refuses
// `[[]`, Nix's `\[`); Nix's reads it as `[` or `\`, which the CLI's parse then refuses.
format!(
    PUBLISH,
    "(((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])[.]){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9]):|[\\[][0-9A-Fa-f:.]+[]]:)?([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])(:([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?",
    "a published port: [HOST_ADDR:]HOST_PORT[:INNER_PORT], such as 3000, 8080:3000 or 127.0.0.1:8080:3000"
);

format!(
    SIZE,
    "off|[0-9]{1,13}([.][0-9]{1,3})?([KMGTkmgt](i?B)?|B)?",
    "a size such as 512M, 2G or 1.5GiB (binary units), or off"
);

format!(
    CPUS,
    "off|[0-9]{1,4}([.][0-9]{1,3})?", "a number of CPUs such as 0.5 or 2, or off"
);

/// The JSON Schema of a string in `format`.
fn string_schema(format: &Format, name: &str) -> Schema {
    json_schema!({
        "type": "string",
        "format": name,
        "pattern": format.pattern,
        "description": format.describe,
    })
}

/// Schema-only stand-ins, used through `#[schemars(with = …)]` on the configuration's fields:
/// the fields keep their plain Rust types.
pub struct PathFormat;
pub struct DurationFormat;
pub struct EnvNameFormat;
/// Variable names to values (`env.set`).
pub struct EnvMapFormat;
/// A TCP port other than 0.
pub struct PortFormat;
/// `home:` (per-project, per-task, off).
pub struct HomeScopeFormat;
/// A name in `toolchains:`.
pub struct ToolchainFormat;
/// A name in `credentials:`.
pub struct CredentialFormat;

impl JsonSchema for CredentialFormat {
    fn schema_name() -> Cow<'static, str> {
        "Credential".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        string_schema(&CREDENTIAL, "sandbox-credential")
    }
}

/// An entry of `network.publish`.
pub struct PublishFormat;

impl JsonSchema for PublishFormat {
    fn schema_name() -> Cow<'static, str> {
        "Publish".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        string_schema(&PUBLISH, "sandbox-publish")
    }
}

/// `limits.memory`.
pub struct SizeFormat;
/// `limits.cpus`.
pub struct CpusFormat;

impl JsonSchema for SizeFormat {
    fn schema_name() -> Cow<'static, str> {
        "Size".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        string_schema(&SIZE, "sandbox-size")
    }
}

impl JsonSchema for CpusFormat {
    fn schema_name() -> Cow<'static, str> {
        "Cpus".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        string_schema(&CPUS, "sandbox-cpus")
    }
}

impl JsonSchema for HomeScopeFormat {
    fn schema_name() -> Cow<'static, str> {
        "HomeScope".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        string_schema(&HOME_SCOPE, "sandbox-home-scope")
    }
}

impl JsonSchema for ToolchainFormat {
    fn schema_name() -> Cow<'static, str> {
        "Toolchain".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        string_schema(&TOOLCHAIN, "sandbox-toolchain")
    }
}

impl JsonSchema for PathFormat {
    fn schema_name() -> Cow<'static, str> {
        "Path".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        string_schema(&PATH, "sandbox-path")
    }
}

impl JsonSchema for DurationFormat {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        string_schema(&DURATION, "sandbox-duration")
    }
}

impl JsonSchema for EnvNameFormat {
    fn schema_name() -> Cow<'static, str> {
        "EnvName".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        string_schema(&ENV_NAME, "sandbox-env-name")
    }
}

impl JsonSchema for EnvMapFormat {
    fn schema_name() -> Cow<'static, str> {
        "EnvMap".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "object",
            "propertyNames": { "pattern": ENV_NAME.pattern },
            "additionalProperties": { "type": "string" },
        })
    }
}

impl JsonSchema for PortFormat {
    fn schema_name() -> Cow<'static, str> {
        "Port".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "integer", "minimum": 1, "maximum": 65535 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        for ok in ["/srv", "/", "~", "~/cache", "/a b/c"] {
            assert!(PATH.matches(ok), "{ok}");
        }
        for bad in ["", "relative", "./x", "~alice/x", "/a\0b"] {
            assert!(!PATH.matches(bad), "{bad:?}");
        }
    }

    #[test]
    fn every_duration_the_pattern_accepts_humantime_parses() {
        for ok in [
            "30s",
            "5m",
            "1h 30m",
            "1h30m",
            "2 days",
            "999999999w",
            " 1ms ",
        ] {
            assert!(DURATION.matches(ok), "{ok}");
            humantime::parse_duration(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in ["", "soon", "30", "1M", "1.5h", "1y", "1234567890s", "-1s"] {
            assert!(!DURATION.matches(bad), "{bad}");
        }
    }

    #[test]
    fn credentials_are_the_shipped_definitions() {
        let names = CREDENTIAL.pattern[1..].split_once(')').unwrap().0;
        assert_eq!(
            names.split('|').collect::<Vec<_>>().join(", "),
            sandbox_net::credentials::known()
        );
        assert!(!CREDENTIAL.matches("anthropic2"));
        assert!(CREDENTIAL.matches("anthropic=http://127.0.0.1:4000"));
        assert!(CREDENTIAL.matches("openai=https://gateway.example.com/"));
        assert!(!CREDENTIAL.matches("openai=https://gateway.example.com/v1"));
        assert!(!CREDENTIAL.matches("openai=gateway.example.com"));
    }

    #[test]
    fn env_names() {
        assert!(ENV_NAME.matches("CARGO_HOME"));
        assert!(ENV_NAME.matches("weird name"));
        for bad in ["", "A=B", "A\0"] {
            assert!(!ENV_NAME.matches(bad), "{bad:?}");
        }
    }
}

#[cfg(test)]
mod publish_pattern_tests {
    #[test]
    fn the_publish_pattern_takes_what_publish_parses() {
        for ok in [
            "3000",
            "8080:3000",
            "127.0.0.1:8080:3000",
            "[::1]:8080",
            "0.0.0.0:1:65535",
        ] {
            assert!(super::PUBLISH.matches(ok), "{ok}");
            assert!(sandbox_policy::Publish::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["0", "65536", "localhost:3000", "01.2.3.4:80", "1:2:3", ""] {
            assert!(!super::PUBLISH.matches(bad), "{bad}");
        }
    }
}
