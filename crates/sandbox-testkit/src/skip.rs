//! Skips, and the one list of the skips a CI machine is allowed.
//!
//! A test that cannot run on a machine says so (`skipped: <reason>`), never passes silently.
//! On CI (`CI=true`, as `.ci/run` sets it) a skip is a failure unless its id is on
//! [`ALLOWED_IN_CI`]: a CI machine installs every tool the tests compare against (bwrap, nono,
//! python3, setpriv, keyutils — `.ci/run`), so a skip for want of one means the machine lost
//! it, and the run turns red instead of proving less than it claims.

/// A skip a CI machine is allowed, and why no CI machine can run that check.
#[derive(Debug, Clone, Copy)]
pub struct AllowedSkip {
    pub id: &'static str,
    pub reason: &'static str,
}

/// The skips a CI machine (a fresh Debian VM, root, no nested virtualisation) is allowed.
/// Every other skip fails under `CI=true`.
pub const ALLOWED_IN_CI: &[AllowedSkip] = &[
    AllowedSkip {
        id: "limits-unprivileged-cgroup",
        reason: "the CI machine (root, cgroup v1 controllers, an empty v2 hierarchy) delegates \
                 no cgroup to an unprivileged user: as nobody the refusal (125) is tested, the \
                 enforcement only as root",
    },
    AllowedSkip {
        id: "guest-boot",
        reason: "no guest can boot through KVM on the bare CI machine (no /dev/kvm, or no \
                 hardware virtualisation behind it): the tests judge that first and check the \
                 failed boot names its logs; inside `cargo xtask guest-boxlite`'s TCG guest \
                 with nested KVM they run, and a skip there fails the run",
    },
    AllowedSkip {
        id: "limactl",
        reason: "the test suite runs as root in CI, and limactl refuses root: the real limactl \
                 (built by cargo xtask lima-install) runs in cargo xtask lima-test, as a user of \
                 its own, against a booted VM",
    },
    AllowedSkip {
        id: "lima-boot",
        reason:
            "booting a Lima VM takes minutes: CI boots one for the whole Lima suite in \
                 cargo xtask lima-test (under TCG here); opt-in here with SANDBOX_LIMA_BOOT_TESTS=1",
    },
    AllowedSkip {
        id: "x32-abi",
        reason: "Debian's kernels build the x32 ABI but leave it off (syscall.x32=y at boot), so \
                 the x32 bypass of per-number seccomp rules cannot be tried",
    },
    AllowedSkip {
        id: "net-inbound-daemon",
        reason: "by design, not by machine: the escape suite's inbound rows connect to a port \
                 the run prints while it runs, and the daemon's box.exec gives its output only \
                 at the end (its commands get the same network namespace through Run::arm)",
    },
    AllowedSkip {
        id: "box-exec-no-terminal",
        reason: "by design, not by machine: box.exec gives a command no terminal, so there is \
                 none to push keystrokes into or set a line discipline on",
    },
    AllowedSkip {
        id: "backend-without-quarantine",
        reason: "by design, not by machine: nono and the native backend without user \
                 namespaces have no private view, so no git store quarantine, and the normal \
                 work that needs one (deleting a ref) is not theirs to do",
    },
    AllowedSkip {
        id: "daemon-is-not-killed",
        reason:
            "by design, not by machine: an attack that SIGKILLs `sandbox run` before its \
                 after-run check has no counterpart through the daemon, which outlives its commands",
    },
    AllowedSkip {
        id: "userns-own-keyring",
        reason: "by design, not by machine: the no-user-namespace column's harness is a user \
                 namespace of its own, with its own user keyring",
    },
];

/// True under CI (`CI=true`, or `CI=1`).
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| v == "true" || v == "1")
}

/// Reports a check that cannot run here: prints `skipped: <reason>` past libtest's capture.
/// Under `CI=true`, panics unless `id` is on [`ALLOWED_IN_CI`].
pub fn skip(id: &str, reason: impl std::fmt::Display) {
    crate::report(format_args!("skipped: {reason}"));
    if let Some(refusal) = refusal(id, &reason, in_ci()) {
        panic!("{refusal}");
    }
}

/// Why the skip `id` fails the run, if it does.
fn refusal(id: &str, reason: &dyn std::fmt::Display, ci: bool) -> Option<String> {
    (ci && !ALLOWED_IN_CI.iter().any(|a| a.id == id)).then(|| {
        format!(
            "a skip CI does not allow ({id}): {reason}. A CI machine installs what this check \
             needs (.ci/run); if no CI machine can run it, add it to \
             sandbox_testkit::ALLOWED_IN_CI with the reason"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_reasons_given() {
        for (i, a) in ALLOWED_IN_CI.iter().enumerate() {
            assert!(!a.reason.is_empty(), "{}", a.id);
            assert!(
                ALLOWED_IN_CI[i + 1..].iter().all(|b| b.id != a.id),
                "{} twice",
                a.id
            );
        }
    }

    #[test]
    fn under_ci_only_the_listed_skips_pass() {
        assert!(refusal("guest-boot", &"no KVM", true).is_none());
        let refused = refusal("nono", &"nono not installed", true).expect("refused");
        assert!(refused.contains("(nono): nono not installed"), "{refused}");
        assert!(refusal("nono", &"nono not installed", false).is_none());
    }
}
