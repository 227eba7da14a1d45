//! Policy → a seccomp program description: which syscalls (with which arguments) fail with
//! which errno. Constants are Linux's (identical on x86_64 and aarch64); syscall *numbers* are
//! resolved per architecture by `sandbox-host`.

use serde::Serialize;

use crate::model::{NetPolicy, Policy};

/// Linux constants used in argument checks.
pub mod consts {
    pub const AF_UNIX: u64 = 1;
    pub const AF_INET: u64 = 2;
    pub const AF_INET6: u64 = 10;
    pub const AF_NETLINK: u64 = 16;
    pub const SOCK_STREAM: u64 = 1;
    /// Socket types other than stream: dgram, raw, rdm, seqpacket, dccp, packet.
    pub const NON_STREAM_TYPES: &[u64] = &[2, 3, 4, 5, 6, 10];
    /// `type` also carries SOCK_NONBLOCK/SOCK_CLOEXEC; the type proper is the low bits.
    pub const SOCK_TYPE_MASK: u64 = 0xf;
    pub const IPPROTO_TCP: u64 = 6;
    pub const TIOCSTI: u64 = 0x5412;
    pub const TIOCLINUX: u64 = 0x541C;
    /// Sets a terminal's line discipline (`tty_set_ldisc`): allowed on any terminal a process
    /// holds a descriptor of but its controlling one, and no capability is asked for.
    pub const TIOCSETD: u64 = 0x5423;
    pub const AF_VSOCK: u64 = 40;
    /// `sendto`/`sendmsg` flag: connect and send in one call (TCP fast open).
    pub const MSG_FASTOPEN: u64 = 0x2000_0000;
    pub const CLONE_NEWTIME: u64 = 0x0000_0080;
    pub const CLONE_NEWNS: u64 = 0x0002_0000;
    pub const CLONE_NEWCGROUP: u64 = 0x0200_0000;
    pub const CLONE_NEWUTS: u64 = 0x0400_0000;
    pub const CLONE_NEWIPC: u64 = 0x0800_0000;
    pub const CLONE_NEWUSER: u64 = 0x1000_0000;
    pub const CLONE_NEWPID: u64 = 0x2000_0000;
    pub const CLONE_NEWNET: u64 = 0x4000_0000;
    /// Every `clone` flag that creates a namespace.
    pub const CLONE_NAMESPACE_FLAGS: &[u64] = &[
        CLONE_NEWNS,
        CLONE_NEWCGROUP,
        CLONE_NEWUTS,
        CLONE_NEWIPC,
        CLONE_NEWUSER,
        CLONE_NEWPID,
        CLONE_NEWNET,
        CLONE_NEWTIME,
    ];
    pub const S_ISUID: u64 = 0o4000;
    pub const S_ISGID: u64 = 0o2000;
    pub const O_CREAT: u64 = 0o100;
    /// `__O_TMPFILE` (O_TMPFILE without O_DIRECTORY): an unnamed file that `linkat` can name.
    pub const O_TMPFILE_BIT: u64 = 0o2000_0000;
    /// `(uid_t)-1`: "leave the owner as it is" for the chown family.
    pub const NO_CHANGE: u64 = 0xffff_ffff;
    pub const EPERM: i32 = 1;
    pub const EACCES: i32 = 13;
    pub const ENOSYS: i32 = 38;
}

/// A comparison on one syscall argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "op")]
pub enum ArgCheck {
    /// `arg == value` (compared as 32-bit when `dword`).
    Eq {
        arg: u8,
        value: u64,
        dword: bool,
    },
    Ne {
        arg: u8,
        value: u64,
        dword: bool,
    },
    /// `arg & mask == value`.
    MaskedEq {
        arg: u8,
        mask: u64,
        value: u64,
        dword: bool,
    },
}

/// Deny `syscall` with `errno` when every check holds (no checks: always).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SyscallRule {
    pub syscall: &'static str,
    pub when: Vec<ArgCheck>,
    pub errno: i32,
    pub why: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SeccompPlan {
    pub rules: Vec<SyscallRule>,
}

impl SeccompPlan {
    pub fn syscalls(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.rules.iter().map(|r| r.syscall)
    }
}

fn dword_eq(arg: u8, value: u64) -> ArgCheck {
    ArgCheck::Eq {
        arg,
        value,
        dword: true,
    }
}

/// Syscalls that change the machine rather than the task. Landlock already refuses mounts
/// for a sandboxed process; these are denied again so that a process running as root cannot
/// use its capabilities to leave the boundary by other doors.
const MACHINE_SYSCALLS: &[&str] = &[
    "open_by_handle_at",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "bpf",
];

/// The mount family, old and new API, and `chroot` (the private view enters its root with it;
/// a second `chroot` is how one would leave). Whatever mounts the sandbox itself sets up are
/// done in the child before the seccomp filter loads (it is the last step before exec), so
/// these bind the command only.
const MOUNT_SYSCALLS: &[&str] = &[
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "mount_setattr",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
];

/// Syscalls that exist only on older architectures (x86_64 has them, aarch64 and riscv64
/// only have the `*at` forms): a plan names them, a filter for an architecture without them
/// leaves them out.
pub const LEGACY_SYSCALLS: &[&str] = &["chmod", "chown", "lchown", "open", "creat", "mknod"];

/// Where each call that sets a file's mode takes it: `(syscall, mode arg, flags arg)`; the
/// flags argument (for the open family) says whether the mode is used at all.
const MODE_ARGS: &[(&str, u8, Option<u8>)] = &[
    ("chmod", 1, None),
    ("fchmod", 1, None),
    ("fchmodat", 2, None),
    ("fchmodat2", 2, None),
    ("creat", 1, None),
    ("mknod", 1, None),
    ("mknodat", 2, None),
    ("open", 2, Some(1)),
    ("openat", 3, Some(2)),
];

const SETID_WHY: &str = "no setuid/setgid files: one left behind would run as its owner";

/// Setting S_ISUID or S_ISGID, by chmod or by creating a file with it: a run as root could
/// otherwise leave a setuid-root binary in the worktree for any local user to run. The
/// `open` family uses the mode only with O_CREAT or O_TMPFILE (its mode argument is garbage
/// otherwise), so the rule looks at the flags too. `openat2` passes its mode in a struct
/// seccomp cannot read: ENOSYS, as on a kernel before 5.6, and libc falls back to `openat`.
fn setid_rules() -> Vec<SyscallRule> {
    use consts::*;
    let masked = |arg: u8, bit: u64| ArgCheck::MaskedEq {
        arg,
        mask: bit,
        value: bit,
        dword: true,
    };
    let mut rules = Vec::new();
    for &(syscall, mode, flags) in MODE_ARGS {
        for bit in [S_ISUID, S_ISGID] {
            match flags {
                None => rules.push(SyscallRule {
                    syscall,
                    when: vec![masked(mode, bit)],
                    errno: EPERM,
                    why: SETID_WHY,
                }),
                Some(flags) => {
                    for creates in [O_CREAT, O_TMPFILE_BIT] {
                        rules.push(SyscallRule {
                            syscall,
                            when: vec![masked(flags, creates), masked(mode, bit)],
                            errno: EPERM,
                            why: SETID_WHY,
                        });
                    }
                }
            }
        }
    }
    rules.push(SyscallRule {
        syscall: "openat2",
        when: vec![],
        errno: ENOSYS,
        why: "openat2 hides its mode from seccomp: ENOSYS, so libc uses openat",
    });
    rules
}

/// The chown family may not give a file to another owner than `uid` (the one the command
/// runs as): `(uid_t)-1` (no change) and `uid` itself pass. Group changes are left to the
/// kernel (only to a group the caller is in, without CAP_CHOWN).
pub fn chown_rules(uid: u32) -> Vec<SyscallRule> {
    use consts::*;
    [("chown", 1), ("lchown", 1), ("fchown", 1), ("fchownat", 2)]
        .into_iter()
        .map(|(syscall, arg)| SyscallRule {
            syscall,
            when: vec![
                ArgCheck::Ne {
                    arg,
                    value: NO_CHANGE,
                    dword: true,
                },
                ArgCheck::Ne {
                    arg,
                    value: u64::from(uid),
                    dword: true,
                },
            ],
            errno: EPERM,
            why: "no chown to another owner",
        })
        .collect()
}

/// Denied for every run, whatever the policy: `(syscalls, errno, why)`.
const ALWAYS_DENIED: &[(&[&str], i32, &str)] = &[
    (
        MOUNT_SYSCALLS,
        consts::EPERM,
        "mounts: the mount table is set before the command runs",
    ),
    (
        &["keyctl", "add_key", "request_key"],
        consts::EPERM,
        "the kernel keyrings hold the user's secrets",
    ),
    (
        &["io_uring_setup", "io_uring_enter", "io_uring_register"],
        consts::EPERM,
        "io_uring bypasses syscall filtering",
    ),
    (
        &["userfaultfd"],
        consts::EPERM,
        "userfaultfd stalls the kernel at will (exploit aid)",
    ),
    (
        &["perf_event_open"],
        consts::EPERM,
        "perf_event_open observes the whole machine",
    ),
    (
        &["unshare", "setns"],
        consts::EPERM,
        "no new or foreign namespaces",
    ),
    (
        &["ptrace", "process_vm_readv", "process_vm_writev"],
        consts::EPERM,
        "no tracing or reading other processes' memory",
    ),
];

/// The rule a native run adds where it has no private view (no user namespaces): creating a
/// unix socket is denied, since a pathname socket outside the policy (a tmux server, the D-Bus
/// session bus, `docker.sock`) would be a command channel to the host. `socketpair(2)` is a
/// different system call and keeps working. `--allow-unix-sockets` leaves this rule out.
pub fn unix_socket_rule() -> SyscallRule {
    SyscallRule {
        syscall: "socket",
        when: vec![dword_eq(0, consts::AF_UNIX)],
        errno: consts::EACCES,
        why: "no private view: a unix socket could reach host services by path \
              (--allow-unix-sockets allows them)",
    }
}

/// The rules a blocked network adds where the run has no network namespace of its own:
/// TCP fast open (`sendto`/`sendmsg`/`sendmmsg` with `MSG_FASTOPEN`) connects without
/// `connect(2)`, so Landlock's TCP rules never see it. (`listen(2)` on an unbound socket binds
/// an ephemeral port without `bind(2)` too, but whether a socket is bound is nothing seccomp
/// can read: only the namespace closes that.)
pub fn fast_open_rules() -> Vec<SyscallRule> {
    [("sendto", 3), ("sendmsg", 2), ("sendmmsg", 3)]
        .into_iter()
        .map(|(syscall, arg)| SyscallRule {
            syscall,
            when: vec![ArgCheck::MaskedEq {
                arg,
                mask: consts::MSG_FASTOPEN,
                value: consts::MSG_FASTOPEN,
                dword: true,
            }],
            errno: consts::EACCES,
            why: "network blocked, no network namespace: TCP fast open connects without \
                  connect(2)",
        })
        .collect()
}

/// The ioctls that act on a terminal beyond the run: the user's terminal is often the run's
/// stdin, and a new session does not stop them (TIOCSTI as root, TIOCSETD for anyone on a
/// terminal that is not the caller's controlling one). Every native run gets them, and so does
/// nono's child before nono starts (the one seccomp rule set both backends share).
pub fn terminal_rules() -> Vec<SyscallRule> {
    use consts::*;
    vec![
        SyscallRule {
            syscall: "ioctl",
            when: vec![dword_eq(1, TIOCSTI)],
            errno: EPERM,
            why: "TIOCSTI would push keystrokes into a terminal",
        },
        SyscallRule {
            syscall: "ioctl",
            when: vec![dword_eq(1, TIOCLINUX)],
            errno: EPERM,
            why: "TIOCLINUX can inject console input",
        },
        SyscallRule {
            syscall: "ioctl",
            when: vec![dword_eq(1, TIOCSETD)],
            errno: EPERM,
            // The user's terminal, left dead after the run; and line-discipline code the
            // kernel may load on demand.
            why: "TIOCSETD would change the line discipline of the user's terminal",
        },
    ]
}

pub fn compile(policy: &Policy) -> SeccompPlan {
    use consts::*;
    let mut rules = terminal_rules();
    for &syscall in MACHINE_SYSCALLS {
        rules.push(SyscallRule {
            syscall,
            when: vec![],
            errno: EPERM,
            why: "changes the machine, not the task",
        });
    }
    for &(syscalls, errno, why) in ALWAYS_DENIED {
        for &syscall in syscalls {
            rules.push(SyscallRule {
                syscall,
                when: vec![],
                errno,
                why,
            });
        }
    }
    rules.extend(setid_rules());
    // clone(2) takes its flags in arg 0 on x86_64, aarch64 and riscv64, the architectures
    // `sandbox-host` builds filters for (s390 swaps the first two arguments).
    // "Any namespace flag set" is one rule per flag: `flags & bit == bit`, on the low 32 bits,
    // the only ones clone(2) reads. Its low byte is the exit signal, so 0x80 (CLONE_NEWTIME)
    // there is no valid signal and no flag either (CLONE_NEWTIME is reachable only through
    // clone3 and unshare, both denied): the rule costs nothing and keeps the list whole.
    for &flag in CLONE_NAMESPACE_FLAGS {
        rules.push(SyscallRule {
            syscall: "clone",
            when: vec![ArgCheck::MaskedEq {
                arg: 0,
                mask: flag,
                value: flag,
                dword: true,
            }],
            errno: EPERM,
            why: "no new or foreign namespaces",
        });
    }
    // clone3 passes its flags in a struct seccomp cannot read. ENOSYS, as on a kernel without
    // clone3: glibc then falls back to clone(2), whose flags the rules above check.
    rules.push(SyscallRule {
        syscall: "clone3",
        when: vec![],
        errno: ENOSYS,
        why: "clone3 hides its flags from seccomp: ENOSYS, so libc uses clone",
    });
    // vsock reaches the hypervisor and sibling VMs, past any network rule.
    rules.push(SyscallRule {
        syscall: "socket",
        when: vec![dword_eq(0, AF_VSOCK)],
        errno: EACCES,
        why: "vsock reaches the hypervisor, past the network rules",
    });
    if let NetPolicy::Block { .. } = policy.net {
        // Only TCP is port-filtered (by Landlock); every other way out is closed here.
        rules.push(SyscallRule {
            syscall: "socket",
            when: [AF_UNIX, AF_INET, AF_INET6, AF_NETLINK]
                .iter()
                .map(|&d| ArgCheck::Ne {
                    arg: 0,
                    value: d,
                    dword: true,
                })
                .collect(),
            errno: EACCES,
            why: "network blocked: only unix, netlink and TCP sockets",
        });
        for domain in [AF_INET, AF_INET6] {
            for &ty in NON_STREAM_TYPES {
                rules.push(SyscallRule {
                    syscall: "socket",
                    when: vec![
                        dword_eq(0, domain),
                        ArgCheck::MaskedEq {
                            arg: 1,
                            mask: SOCK_TYPE_MASK,
                            value: ty,
                            dword: true,
                        },
                    ],
                    errno: EACCES,
                    why: "network blocked: UDP, raw and packet sockets",
                });
            }
            // A stream socket with a protocol other than TCP (SCTP, MPTCP) is not covered by
            // Landlock's TCP port rules.
            rules.push(SyscallRule {
                syscall: "socket",
                when: vec![
                    dword_eq(0, domain),
                    ArgCheck::MaskedEq {
                        arg: 1,
                        mask: SOCK_TYPE_MASK,
                        value: SOCK_STREAM,
                        dword: true,
                    },
                    ArgCheck::Ne {
                        arg: 2,
                        value: 0,
                        dword: true,
                    },
                    ArgCheck::Ne {
                        arg: 2,
                        value: IPPROTO_TCP,
                        dword: true,
                    },
                ],
                errno: EACCES,
                why: "network blocked: stream protocols other than TCP",
            });
        }
    }
    SeccompPlan { rules }
}

/// The arguments' names of the calls the rules look into, in order.
fn arg_names(syscall: &str) -> &'static [&'static str] {
    match syscall {
        "ioctl" => &["fd", "request"],
        "socket" => &["domain", "type", "protocol"],
        "clone" => &["flags"],
        "chmod" | "creat" | "mknod" => &["path", "mode"],
        "fchmod" => &["fd", "mode"],
        "fchmodat" | "fchmodat2" | "mknodat" => &["dirfd", "path", "mode"],
        "open" => &["path", "flags", "mode"],
        "openat" => &["dirfd", "path", "flags", "mode"],
        "chown" | "lchown" | "fchown" => &["file", "owner", "group"],
        "fchownat" => &["dirfd", "path", "owner", "group"],
        "sendto" => &["fd", "buf", "len", "flags"],
        "sendmsg" => &["fd", "msg", "flags"],
        "sendmmsg" => &["fd", "msgvec", "vlen", "flags"],
        _ => &[],
    }
}

/// A constant's name where the argument has named values, else the number.
fn value_name(syscall: &str, arg: &str, value: u64) -> String {
    use consts::*;
    let named: &[(u64, &str)] = match (syscall, arg) {
        ("ioctl", "request") => &[
            (TIOCSTI, "TIOCSTI"),
            (TIOCLINUX, "TIOCLINUX"),
            (TIOCSETD, "TIOCSETD"),
        ],
        ("socket", "domain") => &[
            (AF_UNIX, "AF_UNIX"),
            (AF_INET, "AF_INET"),
            (AF_INET6, "AF_INET6"),
            (AF_NETLINK, "AF_NETLINK"),
            (AF_VSOCK, "AF_VSOCK"),
        ],
        ("socket", "type") => &[
            (1, "SOCK_STREAM"),
            (2, "SOCK_DGRAM"),
            (3, "SOCK_RAW"),
            (4, "SOCK_RDM"),
            (5, "SOCK_SEQPACKET"),
            (6, "SOCK_DCCP"),
            (10, "SOCK_PACKET"),
        ],
        ("socket", "protocol") => &[(IPPROTO_TCP, "IPPROTO_TCP")],
        ("clone", "flags") => &[
            (CLONE_NEWTIME, "CLONE_NEWTIME"),
            (CLONE_NEWNS, "CLONE_NEWNS"),
            (CLONE_NEWCGROUP, "CLONE_NEWCGROUP"),
            (CLONE_NEWUTS, "CLONE_NEWUTS"),
            (CLONE_NEWIPC, "CLONE_NEWIPC"),
            (CLONE_NEWUSER, "CLONE_NEWUSER"),
            (CLONE_NEWPID, "CLONE_NEWPID"),
            (CLONE_NEWNET, "CLONE_NEWNET"),
        ],
        ("sendto" | "sendmsg" | "sendmmsg", "flags") => &[(MSG_FASTOPEN, "MSG_FASTOPEN")],
        (_, "mode") => &[(S_ISUID, "S_ISUID"), (S_ISGID, "S_ISGID")],
        (_, "flags") => &[(O_CREAT, "O_CREAT"), (O_TMPFILE_BIT, "O_TMPFILE")],
        (_, "owner") => &[(NO_CHANGE, "-1")],
        _ => &[],
    };
    named
        .iter()
        .find(|(v, _)| *v == value)
        .map(|(_, n)| n.to_string())
        .unwrap_or_else(|| {
            if value > 9 && matches!(arg, "mask" | "flags" | "mode" | "type") {
                format!("{value:#x}")
            } else {
                value.to_string()
            }
        })
}

/// One rule as a call pattern a person reads: `ioctl(TIOCSTI)`, `chmod(mode & S_ISUID)`,
/// `socket(AF_INET, type SOCK_DGRAM)`, `chown(owner != -1, owner != 1000)`; a rule without
/// conditions is the bare name.
pub fn describe_call(rule: &SyscallRule) -> String {
    if rule.when.is_empty() {
        return rule.syscall.to_string();
    }
    let names = arg_names(rule.syscall);
    let name = |arg: u8| {
        names.get(usize::from(arg)).copied().unwrap_or(match arg {
            0 => "arg0",
            1 => "arg1",
            2 => "arg2",
            3 => "arg3",
            4 => "arg4",
            _ => "arg5",
        })
    };
    let conditions: Vec<String> = rule
        .when
        .iter()
        .map(|check| match *check {
            // Equality with a named constant reads as the argument itself.
            ArgCheck::Eq { arg, value, .. } => value_name(rule.syscall, name(arg), value),
            ArgCheck::Ne { arg, value, .. } => format!(
                "{} != {}",
                name(arg),
                value_name(rule.syscall, name(arg), value)
            ),
            ArgCheck::MaskedEq {
                arg, mask, value, ..
            } if mask == value => format!(
                "{} & {}",
                name(arg),
                value_name(rule.syscall, name(arg), value)
            ),
            ArgCheck::MaskedEq {
                arg, mask, value, ..
            } => format!(
                "{} {}",
                name(arg),
                value_name(rule.syscall, name(arg), value & mask)
            ),
        })
        .collect();
    format!("{}({})", rule.syscall, conditions.join(", "))
}

/// The plan as lines a person reads: the calls of consecutive rules with one reason joined,
/// then the reason (`chmod(mode & S_ISUID), chmod(mode & S_ISGID), …: no setuid/setgid
/// files`), and the errno where it is not EPERM.
pub fn describe(plan: &SeccompPlan) -> Vec<String> {
    let mut groups: Vec<(Vec<String>, &'static str, i32)> = Vec::new();
    for rule in &plan.rules {
        let call = describe_call(rule);
        match groups.last_mut() {
            Some((calls, why, errno)) if *why == rule.why && *errno == rule.errno => {
                if !calls.contains(&call) {
                    calls.push(call);
                }
            }
            _ => groups.push((vec![call], rule.why, rule.errno)),
        }
    }
    groups
        .into_iter()
        .map(|(calls, why, errno)| {
            let errno = match errno {
                consts::EPERM => String::new(),
                consts::EACCES => " (EACCES)".to_string(),
                consts::ENOSYS => " (ENOSYS)".to_string(),
                other => format!(" (errno {other})"),
            };
            format!("{}{errno}: {why}", calls.join(", "))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn rules_read_as_calls_with_named_constants() {
        let plan = compile(&crate::testutil::linked_policy(true));
        let lines = describe(&plan);
        let all = lines.join("\n");
        for want in [
            "ioctl(TIOCSTI): TIOCSTI would push keystrokes",
            "ioctl(TIOCSETD): TIOCSETD would change the line discipline",
            "chmod(mode & S_ISUID), chmod(mode & S_ISGID),",
            "openat(flags & O_CREAT, mode & S_ISUID)",
            "openat(flags & O_TMPFILE, mode & S_ISGID)",
            "clone(flags & CLONE_NEWUSER)",
            "clone3 (ENOSYS): clone3 hides its flags",
            "socket(AF_VSOCK) (EACCES)",
            "socket(domain != AF_UNIX, domain != AF_INET, domain != AF_INET6, domain != AF_NETLINK)",
            "socket(AF_INET, type SOCK_DGRAM)",
            "socket(AF_INET6, type SOCK_STREAM, protocol != 0, protocol != IPPROTO_TCP)",
            "mount, umount2, pivot_root",
        ] {
            assert!(all.contains(want), "{want:?} not in:\n{all}");
        }
        assert!(!all.contains("MaskedEq") && !all.contains("dword"), "{all}");
        let chown = describe_call(&chown_rules(1000)[0]);
        assert_eq!(chown, "chown(owner != -1, owner != 1000)");
    }

    use super::consts::*;
    use super::*;
    use crate::testutil::linked_policy;

    fn rules_for<'a>(plan: &'a SeccompPlan, syscall: &str) -> Vec<&'a SyscallRule> {
        plan.rules.iter().filter(|r| r.syscall == syscall).collect()
    }

    #[test]
    fn always_denies_terminal_injection_and_machine_changes() {
        let plan = compile(&linked_policy(false));
        let ioctl = rules_for(&plan, "ioctl");
        for request in [TIOCSTI, TIOCLINUX, TIOCSETD] {
            assert!(
                ioctl.iter().any(|r| r.when
                    == vec![ArgCheck::Eq {
                        arg: 1,
                        value: request,
                        dword: true
                    }]),
                "{request:#x}"
            );
        }
        for sys in ["mount", "open_by_handle_at", "init_module", "bpf"] {
            let r = rules_for(&plan, sys);
            assert_eq!(r.len(), 1, "{sys}");
            assert!(r[0].when.is_empty(), "{sys} is denied unconditionally");
        }
        // An open network leaves sockets alone, but for vsock.
        let socket = rules_for(&plan, "socket");
        assert_eq!(socket.len(), 1);
        assert_eq!(
            socket[0].when,
            vec![ArgCheck::Eq {
                arg: 0,
                value: AF_VSOCK,
                dword: true
            }]
        );
        assert_eq!(socket[0].errno, EACCES);
    }

    #[test]
    fn always_denies_keyrings_io_uring_namespaces_and_tracing() {
        for block in [false, true] {
            let plan = compile(&linked_policy(block));
            for sys in [
                "keyctl",
                "add_key",
                "request_key",
                "io_uring_setup",
                "io_uring_enter",
                "io_uring_register",
                "userfaultfd",
                "perf_event_open",
                "mount",
                "umount2",
                "pivot_root",
                "chroot",
                "mount_setattr",
                "open_tree",
                "move_mount",
                "fsopen",
                "fsmount",
                "fsconfig",
                "fspick",
                "unshare",
                "setns",
                "ptrace",
                "process_vm_readv",
                "process_vm_writev",
            ] {
                let r = rules_for(&plan, sys);
                assert_eq!(r.len(), 1, "{sys} (block: {block})");
                assert!(r[0].when.is_empty(), "{sys} is denied unconditionally");
                assert_eq!(r[0].errno, EPERM, "{sys}");
            }
            let clone = rules_for(&plan, "clone");
            assert_eq!(clone.len(), CLONE_NAMESPACE_FLAGS.len());
            for &flag in CLONE_NAMESPACE_FLAGS {
                assert!(clone.iter().any(|r| r.errno == EPERM
                    && r.when
                        == vec![ArgCheck::MaskedEq {
                            arg: 0,
                            mask: flag,
                            value: flag,
                            dword: true
                        }]));
            }
            let clone3 = rules_for(&plan, "clone3");
            assert_eq!(clone3.len(), 1);
            assert!(clone3[0].when.is_empty());
            assert_eq!(clone3[0].errno, ENOSYS);
            assert!(plan
                .rules
                .iter()
                .all(|r| !r.why.is_empty() && r.why.len() <= 70));
        }
    }

    #[test]
    fn blocked_network_denies_udp_raw_packet_and_io_uring() {
        let plan = compile(&linked_policy(true));
        let socket = rules_for(&plan, "socket");
        // Every non-stream type, for both address families.
        for domain in [AF_INET, AF_INET6] {
            for &ty in NON_STREAM_TYPES {
                assert!(
                    socket.iter().any(|r| r.when.contains(&ArgCheck::Eq {
                        arg: 0,
                        value: domain,
                        dword: true
                    }) && r.when.contains(&ArgCheck::MaskedEq {
                        arg: 1,
                        mask: SOCK_TYPE_MASK,
                        value: ty,
                        dword: true
                    })),
                    "domain {domain} type {ty}"
                );
            }
        }
        // Families other than unix, inet, inet6 and netlink (packet, vsock, …).
        let other = socket
            .iter()
            .find(|r| {
                r.when
                    .iter()
                    .all(|c| matches!(c, ArgCheck::Ne { arg: 0, .. }))
            })
            .expect("a rule for other families");
        assert_eq!(other.when.len(), 4);
        for sys in ["io_uring_setup", "io_uring_enter", "io_uring_register"] {
            assert_eq!(rules_for(&plan, sys).len(), 1, "{sys}");
        }
        assert!(plan.rules.iter().all(|r| r.errno == EPERM
            || r.errno == EACCES
            || r.syscall == "clone3"
            || r.syscall == "openat2"));
    }
}
