//! Flags people reach for that `sandbox` spells another way. clap suggests the closest
//! spelling, which for these is the wrong flag (`--allow-net` is nearest `--allow-unix-sockets`);
//! the table says what the user most likely meant, and why.

/// `(flags people type, what to say)`: each line is one tip under clap's error.
const INTENTS: &[(&[&str], &str)] = &[
    (
        &[
            "--allow-net",
            "--allow-network",
            "--net",
            "--network",
            "--with-net",
        ],
        "the network is open by default; --block-net closes it, --allow-domain HOST opens only \
         HOST (through the supervisor's proxy), --allow-port PORT keeps a host port under \
         --block-net",
    ),
    (
        &[
            "--no-net",
            "--no-network",
            "--offline",
            "--deny-net",
            "--disable-network",
            "--unshare-net",
        ],
        "--block-net gives the run a network namespace of its own with only loopback",
    ),
    (
        &[
            "--allow-host",
            "--allow-hosts",
            "--allow-url",
            "--allow-domains",
            "--domain",
        ],
        "--allow-domain HOST (repeatable; *.example.com and @github-style groups work)",
    ),
    (
        &[
            "--write",
            "--rw",
            "--bind",
            "--writable",
            "--allow-writes",
            "--allow-rw",
        ],
        "--allow-write PATH grants read-write access to PATH",
    ),
    (
        &["--read", "--ro", "--ro-bind", "--allow-reads", "--readonly"],
        "--allow-read PATH grants read access to PATH",
    ),
    (
        &["--setenv", "--pass-env", "--keep-env", "--environment"],
        "--env NAME passes NAME from this terminal; --env NAME=VALUE sets it",
    ),
    (
        &["--mem", "--memory-limit", "--max-memory"],
        "--memory SIZE (e.g. 512M) bounds all the command's processes together",
    ),
    (
        &["--cwd", "--chdir", "--dir", "--workdir-inside"],
        "--cd PATH starts the command in PATH; -C DIR names the task's worktree",
    ),
];

/// What the user most likely meant by `arg` (`--allow-net=x` is looked up as `--allow-net`).
pub fn intended(arg: &str) -> Option<&'static str> {
    let flag = arg.split_once('=').map_or(arg, |(flag, _)| flag);
    INTENTS
        .iter()
        .find(|(flags, _)| flags.contains(&flag))
        .map(|(_, tip)| *tip)
}

/// Replaces clap's nearest-spelling tip with the intended flag's, when the table knows it.
pub fn explain(err: &mut clap::Error) {
    use clap::error::{ContextKind, ContextValue};
    let Some(ContextValue::String(arg)) = err.get(ContextKind::InvalidArg) else {
        return;
    };
    let Some(tip) = intended(arg) else {
        return;
    };
    err.remove(ContextKind::SuggestedArg);
    err.insert(
        ContextKind::Suggested,
        ContextValue::StyledStrs(vec![tip.to_string().into()]),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tip_names_a_flag_the_run_command_has() {
        use clap::CommandFactory;
        let run = crate::cli::Cli::command();
        let run = run.find_subcommand("run").unwrap();
        let longs: Vec<String> = run
            .get_arguments()
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect();
        for (flags, tip) in INTENTS {
            for flag in *flags {
                assert!(!longs.contains(&flag.to_string()), "{flag} is a real flag");
            }
            let named: Vec<&str> = tip
                .split_whitespace()
                .filter(|w| w.starts_with("--"))
                .collect();
            assert!(!named.is_empty(), "{tip}");
            for word in named {
                assert!(longs.iter().any(|l| l == word), "{word} in {tip:?}");
            }
        }
        assert_eq!(intended("--allow-net=x"), intended("--allow-net"));
        assert_eq!(intended("--allow-nett"), None);
    }
}
