//! `sandbox config`: read the merged configuration, and change the user file — the only file
//! this command ever writes (`$XDG_CONFIG_HOME/sandbox/config.yaml`). The system file is
//! read-only here, and nothing is read from or written to a worktree: a boundary the sandbox
//! can configure is one it can turn off.
//!
//! `set` and `unset` edit the YAML document key by key, validate the result with the same
//! schema every command loads, and replace the file atomically; other keys are kept.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use clap::Subcommand;
use serde_json::json;
use serde_yaml::{Mapping, Value};

use crate::config;
use crate::paths::Dirs;

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the path of your configuration file (the one `set` and `unset` change).
    Path {
        /// Print the system file's path instead (/etc/sandbox/config.yaml; read-only here).
        #[arg(long)]
        system: bool,
    },
    /// Print the merged configuration and the files it came from, with the keys each sets.
    Show {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Print one key of the merged configuration (dotted, e.g. `backends.custom.command`).
    Get {
        /// The dotted key.
        key: String,
        /// Print the value as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Set one key in your configuration file. VALUE is read as YAML (`true`, `3000`,
    /// `[a, b]`), falling back to plain text when the key needs text; it is never expanded.
    Set {
        /// The dotted key, e.g. `backends.custom.command`.
        key: String,
        /// The value, e.g. '/home/me/.local/bin/launcher --strict'.
        value: String,
    },
    /// Remove one key from your configuration file.
    Unset {
        /// The dotted key.
        key: String,
    },
    /// Print the configuration's JSON Schema (every key, its type and format). The Nix
    /// modules' `settings` options are generated from it.
    Schema,
}

pub fn run(cmd: ConfigCommand) -> anyhow::Result<i32> {
    let dirs = Dirs::from_env();
    match cmd {
        ConfigCommand::Path { system } => {
            let path = if system {
                dirs.system_config_file()
            } else {
                dirs.user_config_file()
            };
            println!("{}", path.display());
            Ok(0)
        }
        ConfigCommand::Show { json } => show(&dirs, json),
        ConfigCommand::Get { key, json } => get(&dirs, &key, json),
        ConfigCommand::Set { key, value } => set(&dirs, &key, &value),
        ConfigCommand::Unset { key } => unset(&dirs, &key),
        ConfigCommand::Schema => {
            print!(
                "{}",
                config::schema::json().context("serialising the configuration schema")?
            );
            Ok(0)
        }
    }
}

fn split_key(key: &str) -> anyhow::Result<Vec<&str>> {
    let parts: Vec<&str> = key.split('.').collect();
    if key.is_empty() || parts.iter().any(|p| p.is_empty()) {
        bail!("{key:?} is not a key; use dotted names like `backends.custom.command`");
    }
    Ok(parts)
}

/// Reads a file as a YAML document (an empty or comment-only file is an empty mapping).
fn read_document(path: &Path) -> anyhow::Result<(Value, Option<String>)> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok((Value::Mapping(Mapping::new()), None))
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let value: Value = if text
        .lines()
        .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
    {
        Value::Mapping(Mapping::new())
    } else {
        serde_yaml::from_str(&text).with_context(|| {
            format!(
                "{} is not valid YAML; fix it by hand (nothing was changed)",
                path.display()
            )
        })?
    };
    if !value.is_mapping() {
        bail!(
            "{} does not hold a mapping of keys; fix it by hand (nothing was changed)",
            path.display()
        );
    }
    Ok((value, Some(text)))
}

fn lookup<'a>(doc: &'a Value, parts: &[&str]) -> Option<&'a Value> {
    let mut cur = doc;
    for part in parts {
        cur = cur.as_mapping()?.get(Value::String((*part).to_string()))?;
    }
    Some(cur)
}

fn insert(doc: &mut Value, parts: &[&str], value: Value) -> anyhow::Result<()> {
    let mut cur = doc;
    for (i, part) in parts.iter().enumerate() {
        let map = cur.as_mapping_mut().ok_or_else(|| {
            anyhow::anyhow!(
                "`{}` is not a section, so `{}` cannot be set under it",
                parts[..i].join("."),
                parts.join(".")
            )
        })?;
        let k = Value::String((*part).to_string());
        if i + 1 == parts.len() {
            map.insert(k, value);
            return Ok(());
        }
        cur = map
            .entry(k)
            .or_insert_with(|| Value::Mapping(Mapping::new()));
    }
    Ok(())
}

/// Removes a key, then any section it leaves empty. Returns whether it was there.
fn remove(doc: &mut Value, parts: &[&str]) -> bool {
    let Some(map) = doc.as_mapping_mut() else {
        return false;
    };
    let k = Value::String(parts[0].to_string());
    if parts.len() == 1 {
        return map.remove(&k).is_some();
    }
    let Some(child) = map.get_mut(&k) else {
        return false;
    };
    let removed = remove(child, &parts[1..]);
    if removed && child.as_mapping().is_some_and(Mapping::is_empty) {
        map.remove(&k);
    }
    removed
}

/// Every leaf key a document sets, dotted.
fn leaf_keys(value: &Value, prefix: &str, out: &mut Vec<String>) {
    match value.as_mapping() {
        Some(map) if !map.is_empty() => {
            for (k, v) in map {
                let name = match k.as_str() {
                    Some(s) => s.to_string(),
                    None => serde_yaml::to_string(k)
                        .unwrap_or_default()
                        .trim()
                        .to_string(),
                };
                let key = if prefix.is_empty() {
                    name
                } else {
                    format!("{prefix}.{name}")
                };
                leaf_keys(v, &key, out);
            }
        }
        _ if !prefix.is_empty() => out.push(prefix.to_string()),
        _ => {}
    }
}

/// The user file must not be inside the git worktree of the current directory (unless that
/// "worktree" holds the home directory itself, as a dotfiles repository does).
fn check_not_in_worktree(path: &Path) -> anyhow::Result<()> {
    let Ok(cwd) = std::env::current_dir() else {
        return Ok(());
    };
    let Ok(Some(found)) = sandbox_policy::git::discover(&cwd) else {
        return Ok(());
    };
    let target = path
        .parent()
        .and_then(|p| {
            p.ancestors()
                .find(|a| a.exists())
                .and_then(|a| std::fs::canonicalize(a).ok())
        })
        .unwrap_or_else(|| path.to_path_buf());
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .and_then(|h| std::fs::canonicalize(h).ok());
    let holds_home = home.as_ref().is_some_and(|h| h.starts_with(&found.root));
    if target.starts_with(&found.root) && !holds_home {
        bail!(
            "refusing to write {}: it is inside the worktree {}, which a sandboxed command can \
             write. Point XDG_CONFIG_HOME outside every worktree",
            path.display(),
            found.root.display()
        );
    }
    Ok(())
}

/// Validates `doc` with the schema and writes it atomically, keeping the file's mode.
fn write_document(path: &Path, doc: &Value, had_comments: bool) -> anyhow::Result<()> {
    let body = if doc.as_mapping().is_some_and(Mapping::is_empty) {
        String::new()
    } else {
        serde_yaml::to_string(doc)?
    };
    let text =
        format!("# sandbox configuration; edit with `sandbox config set|unset` or by hand\n{body}");
    config::parse(&text, path)?;
    check_not_in_worktree(path)?;
    let dir = path
        .parent()
        .ok_or_else(|| anyhow::anyhow!("{} has no parent directory", path.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mode = std::fs::metadata(path).ok().map(|m| m.permissions());
    let mut tmp = tempfile::Builder::new()
        .prefix(".config.yaml.")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    tmp.write_all(text.as_bytes())?;
    tmp.as_file().sync_all()?;
    if let Some(mode) = mode {
        tmp.as_file().set_permissions(mode)?;
    } else {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    }
    // The file is rewritten from its keys, so its comments would be gone: keep the previous
    // file next to it first, so nothing the user wrote is lost.
    let backup = had_comments.then(|| {
        let mut name = path.as_os_str().to_owned();
        name.push("~");
        PathBuf::from(name)
    });
    if let Some(backup) = &backup {
        std::fs::copy(path, backup).with_context(|| {
            format!(
                "keeping the commented {} as {} before rewriting it",
                path.display(),
                backup.display()
            )
        })?;
    }
    tmp.persist(path)
        .with_context(|| format!("replacing {}", path.display()))?;
    if let Some(backup) = backup {
        eprintln!(
            "sandbox: note: {} is rewritten from its keys, so its comments are not in it any \
             more; the previous file, comments and all, is {}",
            path.display(),
            backup.display()
        );
    }
    Ok(())
}

fn has_comments(text: Option<&str>) -> bool {
    text.is_some_and(|t| {
        t.lines().any(|l| {
            let l = l.trim_start();
            l.starts_with('#') && !l.starts_with("# sandbox configuration; edit with")
        })
    })
}

fn set(dirs: &Dirs, key: &str, raw: &str) -> anyhow::Result<i32> {
    let parts = split_key(key)?;
    let path = dirs.user_config_file();
    let (doc, text) = read_document(&path)?;
    let parsed: Value = match serde_yaml::from_str::<Value>(raw) {
        Ok(Value::Null) | Err(_) => Value::String(raw.to_string()),
        Ok(v) => v,
    };
    // Try the value as YAML; if the schema wants text, as the text it was typed as.
    let mut candidates = vec![parsed.clone()];
    if !matches!(parsed, Value::String(_)) {
        candidates.push(Value::String(raw.to_string()));
    }
    let mut errors = Vec::new();
    for candidate in candidates {
        let mut doc = doc.clone();
        insert(&mut doc, &parts, candidate)?;
        match write_document(&path, &doc, has_comments(text.as_deref())) {
            Ok(()) => {
                println!("{key} set in {}", path.display());
                return Ok(0);
            }
            Err(e) if e.downcast_ref::<config::ConfigError>().is_some() => errors.push(e),
            Err(e) => return Err(e),
        }
    }
    // The value as YAML explains best, unless the key simply wanted text.
    let first_wanted_text = errors
        .first()
        .is_some_and(|e| e.to_string().contains("expected a string"));
    let err = if first_wanted_text {
        errors.pop()
    } else {
        errors.into_iter().next()
    }
    // Every candidate returned or left an error, and there is at least one.
    .unwrap_or_else(|| anyhow::anyhow!("no value was tried"));
    Err(err.context(format!(
        "{key} was not set; {} is unchanged",
        path.display()
    )))
}

fn unset(dirs: &Dirs, key: &str) -> anyhow::Result<i32> {
    let parts = split_key(key)?;
    let path = dirs.user_config_file();
    let (mut doc, text) = read_document(&path)?;
    if !remove(&mut doc, &parts) {
        println!("{key} is not set in {}", path.display());
        return Ok(0);
    }
    write_document(&path, &doc, has_comments(text.as_deref()))?;
    println!("{key} removed from {}", path.display());
    Ok(0)
}

/// Whether `key` names something in the schema: a document setting it to null is rejected
/// as an *unknown field* only when it does not exist.
fn is_known_key(parts: &[&str]) -> bool {
    let mut doc = Value::Mapping(Mapping::new());
    if insert(&mut doc, parts, Value::Null).is_err() {
        return false;
    }
    let text = serde_yaml::to_string(&doc).unwrap_or_default();
    match config::parse(&text, Path::new("key")) {
        Ok(_) => true,
        Err(e) => !e.to_string().contains("unknown field"),
    }
}

fn merged(dirs: &Dirs) -> anyhow::Result<(config::LoadedConfig, Value)> {
    let loaded = config::load(&dirs.system_config_file(), &dirs.user_config_file())?;
    let value = serde_yaml::to_value(&loaded.config)?;
    Ok((loaded, value))
}

fn print_value(value: &Value, as_json: bool) -> anyhow::Result<()> {
    if as_json {
        println!("{}", serde_json::to_string_pretty(value)?);
        return Ok(());
    }
    match value {
        Value::String(s) => println!("{s}"),
        Value::Bool(b) => println!("{b}"),
        Value::Number(n) => println!("{n}"),
        other => print!("{}", serde_yaml::to_string(other)?),
    }
    Ok(())
}

fn get(dirs: &Dirs, key: &str, as_json: bool) -> anyhow::Result<i32> {
    let parts = split_key(key)?;
    let (_, value) = merged(dirs)?;
    match lookup(&value, &parts) {
        Some(v) => {
            print_value(v, as_json)?;
            Ok(0)
        }
        None if is_known_key(&parts) => {
            eprintln!("sandbox: {key} is not set");
            Ok(1)
        }
        None => bail!("{key} is not a configuration key (see `sandbox config show`)"),
    }
}

fn show(dirs: &Dirs, as_json: bool) -> anyhow::Result<i32> {
    let mut files = Vec::new();
    let mut ok = true;
    for (scope, path) in [
        ("system", dirs.system_config_file()),
        ("user", dirs.user_config_file()),
    ] {
        let mut entry = json!({"scope": scope, "path": path, "exists": path.exists()});
        if path.exists() {
            match std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|t| {
                    config::parse(&t, &path)
                        .map(|_| t)
                        .map_err(|e| e.to_string())
                }) {
                Ok(text) => {
                    let doc: Value = serde_yaml::from_str(&text).unwrap_or(Value::Null);
                    let mut keys = Vec::new();
                    leaf_keys(&doc, "", &mut keys);
                    entry["keys"] = json!(keys);
                }
                Err(e) => {
                    ok = false;
                    entry["error"] = json!(e);
                }
            }
        }
        files.push(entry);
    }
    let merged = if ok { Some(merged(dirs)?.1) } else { None };
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"files": files, "merged": merged}))?
        );
        return Ok(if ok { 0 } else { 1 });
    }
    println!("files (later ones win; lists are concatenated):");
    for f in &files {
        let path = f["path"].as_str().unwrap_or("?");
        let scope = f["scope"].as_str().unwrap_or("?");
        if let Some(e) = f["error"].as_str() {
            println!("  {scope:<6} {path}: ERROR: {e}");
        } else if f["exists"].as_bool() == Some(true) {
            let keys: Vec<&str> = f["keys"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| k.as_str())
                .collect();
            println!(
                "  {scope:<6} {path}: {}",
                if keys.is_empty() {
                    "(empty)".to_string()
                } else {
                    keys.join(", ")
                }
            );
        } else {
            println!("  {scope:<6} {path}: (missing)");
        }
    }
    match merged {
        Some(v) if v.as_mapping().is_some_and(|m| !m.is_empty()) => {
            println!("\nmerged:");
            for line in serde_yaml::to_string(&v)?.lines() {
                println!("  {line}");
            }
        }
        Some(_) => println!("\nmerged: (nothing set; every key has its default)"),
        None => println!("\nmerged: unavailable until the file above is fixed"),
    }
    Ok(if ok { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(text: &str) -> Value {
        serde_yaml::from_str(text).unwrap()
    }

    #[test]
    fn insert_creates_sections_and_keeps_other_keys() {
        let mut d = doc("backend: native\nnetwork: {block: true}\n");
        insert(
            &mut d,
            &["backends", "custom", "command"],
            Value::String("/x y".into()),
        )
        .unwrap();
        insert(&mut d, &["network", "allow_ports"], doc("[3000]")).unwrap();
        assert_eq!(lookup(&d, &["backend"]).unwrap(), "native");
        assert_eq!(
            lookup(&d, &["network", "block"]).unwrap(),
            &Value::Bool(true)
        );
        assert_eq!(
            lookup(&d, &["backends", "custom", "command"]).unwrap(),
            "/x y"
        );
        assert!(insert(&mut d, &["backend", "x"], Value::Null).is_err());
    }

    #[test]
    fn remove_prunes_empty_sections() {
        let mut d = doc("backends: {custom: {command: /x}}\nbackend: host\n");
        assert!(remove(&mut d, &["backends", "custom", "command"]));
        assert!(lookup(&d, &["backends"]).is_none());
        assert!(!remove(&mut d, &["backends", "custom", "command"]));
        assert!(lookup(&d, &["backend"]).is_some());
    }

    #[test]
    fn known_keys_come_from_the_schema() {
        assert!(is_known_key(&["backends", "custom", "command"]));
        assert!(is_known_key(&["network", "allow_domains"]));
        assert!(is_known_key(&["timeout"]));
        assert!(!is_known_key(&["backends", "custom", "comand"]));
        assert!(!is_known_key(&["nope"]));
    }

    #[test]
    fn leaf_keys_are_dotted() {
        let mut keys = Vec::new();
        leaf_keys(
            &doc("backend: host\nbackends: {custom: {command: /x}}\nnetwork: {allow_ports: [1]}\n"),
            "",
            &mut keys,
        );
        assert_eq!(
            keys,
            vec!["backend", "backends.custom.command", "network.allow_ports"]
        );
    }
}
