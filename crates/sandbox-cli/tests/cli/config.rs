//! `sandbox config`: the user file is the only file it writes; every change is validated with
//! the schema before it lands; other keys survive.

use crate::common;

use std::process::Output;

use common::{text, Env};

fn config(env: &Env, args: &[&str]) -> Output {
    env.cmd().arg("config").args(args).output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn set_get_unset_round_trip_keeping_other_keys() {
    let env = Env::new();
    env.write_config("backend: host\nnetwork:\n  allow_ports: [80]\n");
    let out = config(&env, &["path"]);
    assert_eq!(stdout(&out).trim(), env.config_file().to_str().unwrap());

    let cmd = "/opt/launchers/strict --profile 'team a'";
    let out = config(&env, &["set", "backends.custom.command", cmd]);
    assert!(out.status.success(), "{}", text(&out));
    let out = config(&env, &["set", "network.block", "true"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = config(
        &env,
        &["set", "network.allow_domains", "[crates.io, github.com]"],
    );
    assert!(out.status.success(), "{}", text(&out));
    // A key that wants text takes the value as typed, even when it looks like YAML.
    let out = config(&env, &["set", "timeout", "30m"]);
    assert!(out.status.success(), "{}", text(&out));

    assert_eq!(
        stdout(&config(&env, &["get", "backends.custom.command"])).trim(),
        cmd
    );
    assert_eq!(
        stdout(&config(&env, &["get", "network.block"])).trim(),
        "true"
    );
    assert_eq!(stdout(&config(&env, &["get", "backend"])).trim(), "host");
    let ports = config(&env, &["get", "network.allow_ports", "--json"]);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&ports.stdout).unwrap(),
        serde_json::json!([80])
    );
    let domains = config(&env, &["get", "network.allow_domains", "--json"]);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&domains.stdout).unwrap(),
        serde_json::json!(["crates.io", "github.com"])
    );

    let out = config(&env, &["unset", "backends.custom.command"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = config(&env, &["get", "backends.custom.command"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not set"));
    let file = std::fs::read_to_string(env.config_file()).unwrap();
    assert!(
        !file.contains("backends"),
        "empty sections are pruned: {file}"
    );
    assert!(file.contains("backend: host"), "{file}");
}

#[test]
fn invalid_changes_are_refused_and_leave_the_file_alone() {
    let env = Env::new();
    env.write_config("backend: native\n");
    let before = std::fs::read_to_string(env.config_file()).unwrap();
    for (key, value, why) in [
        ("backends.custom.comand", "/x", "comand"),
        ("timeout", "soon", "not a duration"),
        ("network.allow_ports", "[http]", "network.allow_ports"),
        ("backend.sub", "x", "not a section"),
        ("additional_folders", "[relative/dir]", "absolute path"),
    ] {
        let out = config(&env, &["set", key, value]);
        assert_eq!(out.status.code(), Some(1), "{key}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{key}: expected {why:?} in {err}");
        assert_eq!(std::fs::read_to_string(env.config_file()).unwrap(), before);
    }
    let out = config(&env, &["get", "no.such.key"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a configuration key"));
}

#[test]
fn unset_repairs_a_file_that_no_longer_parses() {
    let env = Env::new();
    env.write_config("backend: host\nbakends: {}\n");
    // Every command that loads the configuration refuses it…
    let out = env.cmd().args(["run", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    // …but `config` still works, and removing the bad key fixes it.
    let out = config(&env, &["show"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("ERROR"), "{}", text(&out));
    let out = config(&env, &["unset", "bakends"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = config(&env, &["show", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["merged"]["backend"], "host");
    assert_eq!(v["files"][1]["scope"], "user");
    assert_eq!(v["files"][1]["keys"], serde_json::json!(["backend"]));
}

#[test]
fn never_writes_into_a_worktree() {
    let env = Env::new();
    let repo = env.path().join("proj");
    std::fs::create_dir_all(&repo).unwrap();
    common::escape::git(&repo, &["init", "-q"]);
    let out = env
        .cmd()
        .current_dir(&repo)
        .env("XDG_CONFIG_HOME", repo.join("cfg"))
        .args(["config", "set", "backends.custom.command", "/x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("inside the worktree"),
        "{}",
        text(&out)
    );
    assert!(!repo.join("cfg").exists());
}

#[test]
fn rewriting_a_commented_file_keeps_the_original_beside_it() {
    let env = Env::new();
    let file = env.config_file();
    let original =
        "# my notes: keep the network open for the package mirror\nnetwork:\n  block: false\n";
    env.write_config(original);
    let out = config(&env, &["set", "timeout", "30m"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let backup = file.with_file_name("config.yaml~");
    assert_eq!(std::fs::read_to_string(&backup).unwrap(), original);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("config.yaml~"),
        "the note names the backup: {}",
        text(&out)
    );
    let now = std::fs::read_to_string(&file).unwrap();
    assert!(
        now.contains("timeout: 30m") && now.contains("block: false"),
        "{now}"
    );
    // A file with nothing but our own header is rewritten without a backup.
    std::fs::remove_file(&backup).unwrap();
    let out = config(&env, &["set", "timeout", "1h"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!backup.exists(), "no comments, no backup");
}
