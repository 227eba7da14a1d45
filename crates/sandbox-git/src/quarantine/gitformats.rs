//! The exact forms git writes the state files of a worktree's own git dir in, as strict
//! grammars: a file the run leaves there is kept only when it parses completely, whole, in
//! one of these forms — never the first line, the first word or the first MiB of it. Each
//! rule below names the git source that reads the file (git's `sequencer.c`, `refs.c`,
//! `setup.c`), so that the check reads the bytes as git will.
//!
//! Config-format files are not parsed here: [`config_entries`] hands the bytes to git's own
//! parser (`git config --file - --null --list`, no include followed, no other config read).

use std::io::Write;
use std::process::{Command, Stdio};

/// More than any state file git writes for a real rebase (a todo line is about 60 bytes: a
/// million commits); a larger file is set aside whole, never read in part.
pub const MAX_STATE_FILE: u64 = 64 << 20;

/// git's own merge strategies. Any other name — and any string that is not exactly one of
/// these — is run by the sequencer as the program `git-merge-<string>`: `ort /../evil` runs
/// `./git-merge-ort /../evil`, a path, so `./evil` in the worktree (`sequencer.c`,
/// `do_pick_commit` → `try_merge_command`).
pub const STRATEGIES: &[&str] = &["ort", "recursive", "resolve", "octopus", "ours", "subtree"];

/// The todo commands of `sequencer.c` (`todo_command_info`): the name and the one-letter
/// abbreviation. `exec`/`x` is the one that runs a command.
const VERBS: &[(&str, Option<char>)] = &[
    ("pick", Some('p')),
    ("revert", None),
    ("edit", Some('e')),
    ("reword", Some('r')),
    ("fixup", Some('f')),
    ("squash", Some('s')),
    ("exec", Some('x')),
    ("break", Some('b')),
    ("label", Some('l')),
    ("reset", Some('t')),
    ("merge", Some('m')),
    ("update-ref", Some('u')),
    ("noop", None),
    ("drop", Some('d')),
];

/// A full object id (SHA-1 or SHA-256) in the lower-case hex git writes.
pub fn is_hex_oid(text: &[u8]) -> bool {
    matches!(text.len(), 40 | 64) && text.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The lines of `bytes`, each without its `\n`; `None` unless the text is UTF-8 and ends
/// with a newline (git writes every state file so, and reads a last line without one the
/// same: refusing it costs nothing).
fn lines(bytes: &[u8]) -> Option<Vec<&str>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let body = text.strip_suffix('\n')?;
    Some(body.split('\n').collect())
}

/// A pseudoref or per-worktree ref (`ORIG_HEAD`, `REBASE_HEAD`, `refs/bisect/bad`, …) as git
/// writes it: one object id and a newline. Never `ref: …`: git's next `reset`, `merge` or
/// `pull` writes `ORIG_HEAD` *through* a symbolic ref (`refs.c`, no `REF_NO_DEREF`), so
/// `ORIG_HEAD: ref: refs/heads/main` moves `main`.
pub fn object_id_file(bytes: &[u8]) -> bool {
    bytes.strip_suffix(b"\n").is_some_and(is_hex_oid)
}

/// `MERGE_HEAD`: one object id per line, at least one (`builtin/merge.c`, `write_merge_heads`).
pub fn object_id_lines(bytes: &[u8]) -> bool {
    lines(bytes).is_some_and(|ls| ls.iter().all(|l| is_hex_oid(l.as_bytes())))
}

/// `FETCH_HEAD`: `<oid>\t[not-for-merge]\t<description>` per line (`builtin/fetch.c`,
/// `append_fetch_head`).
pub fn fetch_head(bytes: &[u8]) -> bool {
    lines(bytes).is_some_and(|ls| {
        ls.iter().all(|l| {
            let mut parts = l.splitn(3, '\t');
            let (Some(oid), Some(flag), Some(_)) = (parts.next(), parts.next(), parts.next())
            else {
                return false;
            };
            is_hex_oid(oid.as_bytes()) && matches!(flag, "" | "not-for-merge")
        })
    })
}

/// A strategy file (`rebase-merge/strategy`): exactly one of git's own, and a newline
/// (`write_file`; `read_oneliner` takes the whole rest as the name).
pub fn strategy_file(bytes: &[u8]) -> Result<(), String> {
    let name = std::str::from_utf8(bytes)
        .ok()
        .and_then(|t| t.strip_suffix('\n'))
        .unwrap_or_default();
    strategy_name(name)
}

/// A strategy name, read as git reads it: the whole string.
pub fn strategy_name(name: &str) -> Result<(), String> {
    if STRATEGIES.contains(&name) {
        Ok(())
    } else {
        Err(format!(
            "names the merge strategy {name:?}, which is not exactly one of git's own: git \
             would run the program `git-merge-{name}` on the host"
        ))
    }
}

/// One todo line's command, as `sequencer.c`'s `is_command` reads it: the name or its letter,
/// followed by a blank or the end of the line. `None` for a comment or an empty line.
fn verb(line: &str) -> Result<Option<(&'static str, &str)>, String> {
    // git left-trims spaces and tabs only; a `\r` before the newline is dropped.
    let line = line.strip_suffix('\r').unwrap_or(line);
    let line = line.trim_start_matches([' ', '\t']);
    // A comment: git's comment character (`#`, or the user's `core.commentChar`) first. No
    // command starts with anything but a letter.
    if line.is_empty() || line.starts_with(|c: char| c.is_ascii_punctuation()) {
        return Ok(None);
    }
    let end = line.find([' ', '\t']).unwrap_or(line.len());
    let (word, rest) = line.split_at(end);
    for (name, letter) in VERBS {
        let abbreviated = letter.is_some_and(|c| word.len() == 1 && word.starts_with(c));
        if word == *name || abbreviated {
            return Ok(Some((name, rest)));
        }
    }
    Err(format!(
        "a line git does not read as a todo command: {line:?}"
    ))
}

/// A todo list (`rebase-merge/git-rebase-todo`, `done`, `sequencer/todo`): every line a
/// comment, empty, or one of git's commands with the arguments git writes — no `exec`
/// (`runs_nothing`: in a list git will run, or whose lines it may put back), and `update-ref`
/// only of a ref `may_own` accepts, by its full name (`refs/heads/…`).
pub fn todo_list(bytes: &[u8], may_own: &dyn Fn(&str) -> bool) -> Result<(), String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_string())?;
    let body = text.strip_suffix('\n').unwrap_or(text);
    if body.is_empty() {
        return Ok(());
    }
    for line in body.split('\n') {
        let Some((name, rest)) = verb(line)? else {
            continue;
        };
        let args = rest.trim_start_matches([' ', '\t']);
        let args = args.strip_suffix('\r').unwrap_or(args);
        match name {
            "exec" => {
                return Err(format!(
                    "has `{}`, which the host's next `--continue` would run",
                    line.trim().chars().take(80).collect::<String>()
                ))
            }
            "break" | "noop" if !args.is_empty() => {
                return Err(format!("{name} takes no arguments: {line:?}"))
            }
            "break" | "noop" => {}
            "update-ref" if !args.starts_with("refs/heads/") || !may_own(args) => {
                return Err(format!(
                    "would move {args:?} at the end of the rebase, which the run may not move"
                ))
            }
            "update-ref" => {}
            _ if args.is_empty() || rest.len() == args.len() => {
                return Err(format!("{name} without its argument: {line:?}"))
            }
            _ => {}
        }
    }
    Ok(())
}

/// `update-refs` (`sequencer.c`, `sequencer_get_update_refs_state`): triplets of a ref name,
/// the old and the new object id, each on its line. git updates every named ref at the end of
/// the rebase *through* symbolic refs, whatever its spelling (`main-worktree/HEAD` moves the
/// main worktree's branch): only full branch names `may_own` accepts are kept.
pub fn update_refs(bytes: &[u8], may_own: &dyn Fn(&str) -> bool) -> Result<(), String> {
    let Some(lines) = lines(bytes) else {
        return (bytes.is_empty())
            .then_some(())
            .ok_or_else(|| "not lines of text".to_string());
    };
    if lines.len() % 3 != 0 {
        return Err("not triplets of a ref and two object ids".into());
    }
    for triplet in lines.chunks(3) {
        let name = triplet[0];
        if !triplet[1..].iter().all(|l| is_hex_oid(l.as_bytes())) {
            return Err(format!("{name:?} without two object ids"));
        }
        if !name.starts_with("refs/heads/") || !may_own(name) {
            return Err(format!(
                "would move {name:?} at the end of the rebase, which the run may not move"
            ));
        }
    }
    Ok(())
}

/// `head-name`: `detached HEAD`, or a branch the run may move at the end of the rebase.
pub fn head_name(bytes: &[u8], may_own: &dyn Fn(&str) -> bool) -> Result<(), String> {
    match lines(bytes).as_deref() {
        Some(["detached HEAD"]) => Ok(()),
        Some([name]) if name.starts_with("refs/heads/") && may_own(name) => Ok(()),
        _ => Err(format!(
            "would move {:?} at the end of the rebase, which the run may not move",
            String::from_utf8_lossy(bytes).trim_end()
        )),
    }
}

/// The entries of a config-format file, parsed by git itself: `git config --no-includes
/// --file - --null --list` on `bytes`, in a clean environment (no system or global config,
/// no repository: it runs in `/`). Keys as git has them: section and name lower-case.
pub fn config_entries(bytes: &[u8]) -> Result<Vec<(String, String)>, String> {
    let mut child = Command::new("git")
        .args(["config", "--no-includes", "--file", "-", "--null", "--list"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("HOME", "/nonexistent")
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("git config cannot run: {e}"))?;
    let writer = child.stdin.take().map(|mut stdin| {
        let bytes = bytes.to_vec();
        std::thread::spawn(move || stdin.write_all(&bytes))
    });
    let out = child
        .wait_with_output()
        .map_err(|e| format!("git config: {e}"))?;
    if let Some(writer) = writer {
        let _ = writer.join();
    }
    if !out.status.success() {
        return Err(format!(
            "git does not read it as config: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8(out.stdout).map_err(|_| "config that is not UTF-8".to_string())?;
    Ok(text
        .split_terminator('\0')
        .map(|entry| match entry.split_once('\n') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (entry.to_string(), String::new()),
        })
        .collect())
}

/// `sequencer/opts` (read by `sequencer.c`'s `populate_opts_cb` through git's config parser):
/// parsed by git, and its strategy exactly one of git's own.
pub fn sequencer_opts(bytes: &[u8]) -> Result<(), String> {
    for (key, value) in config_entries(bytes)? {
        if key == "options.strategy" {
            strategy_name(&value)?;
        }
    }
    Ok(())
}

/// Which grammar a top-level state file of the worktree's git dir has: `Some(ok)` for the
/// pseudorefs git reads back as refs.
pub fn pseudoref(name: &str, bytes: &[u8]) -> Option<bool> {
    match name {
        "ORIG_HEAD"
        | "AUTO_MERGE"
        | "CHERRY_PICK_HEAD"
        | "REVERT_HEAD"
        | "REBASE_HEAD"
        | "BISECT_HEAD"
        | "BISECT_EXPECTED_REV" => Some(object_id_file(bytes)),
        "MERGE_HEAD" => Some(object_id_lines(bytes)),
        "FETCH_HEAD" => Some(fetch_head(bytes)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "1111111111111111111111111111111111111111";
    const B: &str = "2222222222222222222222222222222222222222";

    fn own(name: &str) -> bool {
        name == "refs/heads/task"
    }

    #[test]
    fn todo_lines_are_git_commands_and_never_exec() {
        let ok = |t: &str| todo_list(t.as_bytes(), &own);
        assert!(
            ok("pick 1234 a\np 1234 b\n# exec x\n\nbreak\nfixup -C 12 c\nmerge -C 1 l # m\n")
                .is_ok()
        );
        assert!(ok("label onto\nreset onto\nupdate-ref refs/heads/task\nd 12 x\n").is_ok());
        assert!(ok("").is_ok());
        for bad in [
            "exec touch x\n",
            "x make\n",
            "  x\tmake\n",
            "pick 1 a\r\nexec y\r\n",
            "exec\ty\n",
            "update-ref refs/heads/main\n",
            "u main-worktree/HEAD\n",
            "update-ref HEAD\n",
            "pickle 1 a\n",
            "PICK 1 a\n",
            "break now\n",
            "pick\n",
            "evil\n",
        ] {
            assert!(ok(bad).is_err(), "{bad:?}");
        }
        // Past any bound a reader of a prefix would have: the whole list is read.
        let long = format!("{}exec touch x\n", "# padding\n".repeat(200_000));
        assert!(ok(&long).is_err());
    }

    #[test]
    fn a_strategy_is_exactly_one_of_gits_own() {
        assert!(strategy_file(b"ort\n").is_ok());
        assert!(strategy_file(b"recursive\n").is_ok());
        for bad in [
            &b"ort /../evil\n"[..],
            b"ort --exec x\n",
            b"evil\n",
            b"ort",
            b" ort\n",
        ] {
            assert!(strategy_file(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn update_refs_are_triplets_of_owned_branches() {
        let ok = |t: String| update_refs(t.as_bytes(), &own);
        assert!(ok(format!("refs/heads/task\n{A}\n{B}\n")).is_ok());
        assert!(ok(String::new()).is_ok());
        assert!(ok(format!("refs/heads/main\n{A}\n{B}\n")).is_err());
        assert!(ok(format!("main-worktree/HEAD\n{A}\n{B}\n")).is_err());
        assert!(ok(format!("ORIG_HEAD\n{A}\n{B}\n")).is_err());
        assert!(ok(format!("refs/heads/task\n{A}\n")).is_err());
        assert!(ok(format!("refs/heads/task\n{A}\n{B}x\n")).is_err());
    }

    #[test]
    fn pseudorefs_are_object_ids_only() {
        assert_eq!(
            pseudoref("ORIG_HEAD", format!("{A}\n").as_bytes()),
            Some(true)
        );
        assert_eq!(
            pseudoref("ORIG_HEAD", b"ref: refs/heads/main\n"),
            Some(false)
        );
        assert_eq!(pseudoref("ORIG_HEAD", A.as_bytes()), Some(false));
        let upper = A.replace('1', "A");
        assert_eq!(
            pseudoref("REBASE_HEAD", format!("{upper}\n").as_bytes()),
            Some(false)
        );
        assert_eq!(
            pseudoref("MERGE_HEAD", format!("{A}\n{B}\n").as_bytes()),
            Some(true)
        );
        let fetch = format!("{A}\t\tbranch 'main' of x\n{B}\tnot-for-merge\tbranch 'b'\n");
        assert_eq!(pseudoref("FETCH_HEAD", fetch.as_bytes()), Some(true));
        assert_eq!(
            pseudoref("FETCH_HEAD", b"ref: refs/heads/main\n"),
            Some(false)
        );
        assert_eq!(pseudoref("COMMIT_EDITMSG", b"anything"), None);
    }

    #[test]
    fn head_name_is_detached_or_owned() {
        assert!(head_name(b"detached HEAD\n", &own).is_ok());
        assert!(head_name(b"refs/heads/task\n", &own).is_ok());
        assert!(head_name(b"refs/heads/main\n", &own).is_err());
        assert!(head_name(b"refs/heads/task\nrefs/heads/main\n", &own).is_err());
    }

    #[test]
    fn config_is_read_by_git() {
        let entries = config_entries(b"[options]\n\tstrategy = ort\n").unwrap();
        assert_eq!(entries, vec![("options.strategy".into(), "ort".into())]);
        assert!(config_entries(b"[bad\n").is_err());
        assert!(sequencer_opts(b"[options]\n\tstrategy = ort\n\tedit = true\n").is_ok());
        // One line, a key in other case: git reads both as options.strategy.
        assert!(sequencer_opts(b"[options] strategy = ort /../evil\n").is_err());
        assert!(sequencer_opts(b"[Options]\n\tStrategY = evil\n").is_err());
        assert!(sequencer_opts(b"[options]\n\tstrategy = \"ort \\\n/../evil\"\n").is_err());
        // An include is not followed (and is no strategy).
        assert!(sequencer_opts(b"[include]\n\tpath = /etc/passwd\n").is_ok());
    }
}
