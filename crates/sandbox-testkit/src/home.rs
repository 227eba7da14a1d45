//! A home as a real user's looks: package caches with entries, shell rc files, a git
//! identity, agent state. A suite whose test homes were empty passed while every real user's
//! second daemon command failed (the caches' overlays are mounted only when a cache exists),
//! so the suites' default fixture starts from this.

use std::path::Path;

/// What [`lived_in`] puts in a home, relative to it: each package cache the product layers
/// (`sandbox-policy`'s `detect_caches`), with a few entries in the layout its tool writes.
pub const CACHE_ENTRIES: &[&str] = &[
    // A crate no test depends on: a real tool reading the cache never takes these bytes for
    // a package it fetches.
    ".cargo/registry/index/index.crates.io-1949cf8c6b5b557f/.cache/sa/nd/sandbox-fixture-crate",
    ".cargo/registry/cache/index.crates.io-1949cf8c6b5b557f/sandbox-fixture-crate-0.1.0.crate",
    ".cargo/registry/src/index.crates.io-1949cf8c6b5b557f/sandbox-fixture-crate-0.1.0/Cargo.toml",
    ".npm/_cacache/index-v5/1f/9c/3a1e0c1d2f4b5a6978e0d1c2b3a4f5e6d7c8b9a0f1e2d3c4b5a6978e0d1c2b3a4",
    ".npm/_cacache/content-v2/sha512/4f/2a/9b0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0",
    ".npm/_logs/2026-12-01T09_12_44_015Z-debug-0.log",
    ".cache/pip/http-v2/a/3/f/0/c/a3f0c9d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4",
    ".cache/pip/wheels/5e/2b/7a/sandbox_fixture-0.1.0-py3-none-any.whl",
];

/// Fills `home` (which exists) as a real user's: see the module comment. Existing files are
/// left as they are.
pub fn lived_in(home: &Path) {
    for (i, entry) in CACHE_ENTRIES.iter().enumerate() {
        write_new(&home.join(entry), &format!("cache entry {i}\n"));
    }
    write_new(
        &home.join(".bashrc"),
        "# ~/.bashrc\nexport EDITOR=vi\nalias ll='ls -l'\n[ -f ~/.cargo/env ] && . ~/.cargo/env\n",
    );
    write_new(
        &home.join(".profile"),
        "# ~/.profile\n[ -d \"$HOME/.local/bin\" ] && PATH=\"$HOME/.local/bin:$PATH\"\n",
    );
    write_new(
        &home.join(".gitconfig"),
        "[user]\n\tname = Test User\n\temail = test@example.com\n[init]\n\tdefaultBranch = main\n",
    );
    write_new(
        &home.join(".claude.json"),
        "{\"numStartups\": 12, \"hasCompletedOnboarding\": true, \"projects\": {}}\n",
    );
    write_new(
        &home.join(".claude/settings.json"),
        "{\"permissions\": {\"allow\": [\"Bash(cargo test:*)\"]}}\n",
    );
    write_new(&home.join(".codex/config.toml"), "model = \"gpt-5\"\n");
    write_new(
        &home.join(".gemini/settings.json"),
        "{\"theme\": \"Default\"}\n",
    );
}

fn write_new(path: &Path, text: &str) {
    if path.symlink_metadata().is_ok() {
        return;
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("creating a test home's directory");
    }
    std::fs::write(path, text).expect("writing a test home's file");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_home_has_caches_with_entries_and_keeps_what_was_there() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join(".bashrc"), "mine\n").unwrap();
        lived_in(t.path());
        for entry in CACHE_ENTRIES {
            assert!(t.path().join(entry).is_file(), "{entry}");
        }
        for cache in [".cargo/registry", ".npm", ".cache/pip"] {
            assert!(t.path().join(cache).is_dir(), "{cache}");
        }
        assert_eq!(
            std::fs::read_to_string(t.path().join(".bashrc")).unwrap(),
            "mine\n"
        );
    }
}
