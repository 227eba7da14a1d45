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
    pub const EPERM: i32 = 1;
    pub const EACCES: i32 = 13;
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
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fspick",
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

pub fn compile(policy: &Policy) -> SeccompPlan {
    use consts::*;
    let mut rules = vec![
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
    ];
    for &syscall in MACHINE_SYSCALLS {
        rules.push(SyscallRule {
            syscall,
            when: vec![],
            errno: EPERM,
            why: "changes the machine, not the task",
        });
    }
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
        for syscall in ["io_uring_setup", "io_uring_enter", "io_uring_register"] {
            rules.push(SyscallRule {
                syscall,
                when: vec![],
                errno: EPERM,
                why: "network blocked: io_uring bypasses socket filtering",
            });
        }
    }
    SeccompPlan { rules }
}

#[cfg(test)]
mod tests {
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
        assert!(ioctl.iter().any(|r| r.when
            == vec![ArgCheck::Eq {
                arg: 1,
                value: TIOCSTI,
                dword: true
            }]));
        for sys in ["mount", "open_by_handle_at", "init_module", "bpf"] {
            let r = rules_for(&plan, sys);
            assert_eq!(r.len(), 1, "{sys}");
            assert!(r[0].when.is_empty(), "{sys} is denied unconditionally");
        }
        // An open network leaves sockets alone.
        assert!(rules_for(&plan, "socket").is_empty());
        assert!(rules_for(&plan, "io_uring_setup").is_empty());
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
        assert!(plan
            .rules
            .iter()
            .all(|r| r.errno == EPERM || r.errno == EACCES));
    }
}
