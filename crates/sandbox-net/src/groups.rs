//! Built-in groups of hosts, named `@NAME` on the allow-list, so that users need not list a
//! toolchain's registry hosts by hand. Data only: [`crate::AllowList`] expands them.
//!
//! Each entry is a host pattern as the allow-list takes it (an exact name or `*.suffix`).
//! Keep them to what the tool needs to fetch packages or call its API; a host that serves
//! arbitrary user content (a pastebin, an object store bucket) widens every run that names
//! the group.

/// One group: `@name` on the allow-list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    pub name: &'static str,
    /// What it is for (shown by `policy show` and in refusals).
    pub about: &'static str,
    pub hosts: &'static [&'static str],
    /// Other groups it contains.
    pub includes: &'static [&'static str],
}

/// Every built-in group.
pub const GROUPS: &[Group] = &[
    Group {
        name: "github",
        about: "GitHub: the web and git over HTTPS, the API, release and raw downloads, ghcr.io",
        hosts: &[
            "github.com",
            "api.github.com",
            "codeload.github.com",
            "uploads.github.com",
            "objects.githubusercontent.com",
            "raw.githubusercontent.com",
            "release-assets.githubusercontent.com",
            "ghcr.io",
            "pkg-containers.githubusercontent.com",
        ],
        includes: &[],
    },
    Group {
        name: "cargo",
        about: "Rust: crates.io (index and downloads) and rustup's distribution server",
        hosts: &[
            "crates.io",
            "index.crates.io",
            "static.crates.io",
            "static.rust-lang.org",
        ],
        includes: &[],
    },
    Group {
        name: "npm",
        about: "JavaScript: the npm and Yarn registries",
        hosts: &["registry.npmjs.org", "registry.yarnpkg.com"],
        includes: &[],
    },
    Group {
        name: "pypi",
        about: "Python: PyPI (the index and its file host)",
        hosts: &["pypi.org", "files.pythonhosted.org"],
        includes: &[],
    },
    Group {
        name: "go",
        about: "Go: the module proxy and checksum database",
        hosts: &["proxy.golang.org", "sum.golang.org"],
        includes: &[],
    },
    Group {
        name: "maven",
        about: "Java: Maven Central and the Gradle plugin portal",
        hosts: &[
            "repo.maven.apache.org",
            "repo1.maven.org",
            "plugins.gradle.org",
            // The plugin portal redirects its artifact downloads here.
            "plugins-artifacts.gradle.org",
        ],
        includes: &[],
    },
    Group {
        name: "rubygems",
        about: "Ruby: rubygems.org",
        hosts: &["rubygems.org", "index.rubygems.org"],
        includes: &[],
    },
    Group {
        name: "registries",
        about: "every toolchain's package registry above",
        hosts: &[],
        includes: &["cargo", "npm", "pypi", "go", "maven", "rubygems"],
    },
    Group {
        name: "anthropic",
        about: "Anthropic's API (Claude Code)",
        hosts: &["api.anthropic.com"],
        includes: &[],
    },
    Group {
        name: "openai",
        about: "OpenAI's API (Codex)",
        hosts: &["api.openai.com"],
        includes: &[],
    },
    Group {
        name: "google-ai",
        about: "Google's Gemini API (Gemini CLI)",
        hosts: &["generativelanguage.googleapis.com"],
        includes: &[],
    },
    Group {
        name: "agents",
        about: "the agents' own API hosts",
        hosts: &[],
        includes: &["anthropic", "openai", "google-ai"],
    },
];

/// The group called `name` (without the `@`).
pub fn find(name: &str) -> Option<&'static Group> {
    GROUPS.iter().find(|g| g.name == name)
}

/// Every host pattern of `group`, its included groups' too, in order, each once.
pub fn hosts(group: &Group) -> Vec<&'static str> {
    let mut out = Vec::new();
    collect(group, &mut out, 0);
    out
}

fn collect(group: &Group, out: &mut Vec<&'static str>, depth: usize) {
    // The table is ours and flat; the bound only keeps a mistaken cycle from recursing.
    if depth > GROUPS.len() {
        return;
    }
    for host in group.hosts {
        if !out.contains(host) {
            out.push(host);
        }
    }
    for name in group.includes {
        if let Some(inner) = find(name) {
            collect(inner, out, depth + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_included_group_exists_and_every_host_is_a_pattern() {
        for group in GROUPS {
            for name in group.includes {
                assert!(
                    find(name).is_some(),
                    "@{} includes unknown @{name}",
                    group.name
                );
            }
            for host in hosts(group) {
                crate::AllowList::parse([host])
                    .unwrap_or_else(|e| panic!("@{}: {host}: {e}", group.name));
            }
            assert!(!hosts(group).is_empty(), "@{} is empty", group.name);
        }
    }

    #[test]
    fn aggregate_groups_hold_their_members() {
        let registries = hosts(find("registries").unwrap());
        assert!(registries.contains(&"index.crates.io"));
        assert!(registries.contains(&"registry.npmjs.org"));
        assert!(registries.contains(&"files.pythonhosted.org"));
        let agents = hosts(find("agents").unwrap());
        assert_eq!(
            agents,
            [
                "api.anthropic.com",
                "api.openai.com",
                "generativelanguage.googleapis.com"
            ]
        );
    }
}
