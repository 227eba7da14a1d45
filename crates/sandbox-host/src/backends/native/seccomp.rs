//! A [`SeccompPlan`] compiled to BPF with `seccompiler`, in the parent. The child only
//! installs the finished programs.

use std::collections::BTreeMap;

use sandbox_policy::compile::seccomp::{ArgCheck, SeccompPlan, LEGACY_SYSCALLS};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::error::HostError;

/// The syscall number of `name` on the architecture this binary was built for.
pub fn syscall_number(name: &str) -> Option<i64> {
    use libc::*;
    let nr = match name {
        "ioctl" => SYS_ioctl,
        "socket" => SYS_socket,
        "sendto" => SYS_sendto,
        "sendmsg" => SYS_sendmsg,
        "sendmmsg" => SYS_sendmmsg,
        "mount" => SYS_mount,
        "umount2" => SYS_umount2,
        "pivot_root" => SYS_pivot_root,
        "chroot" => SYS_chroot,
        "mount_setattr" => SYS_mount_setattr,
        "move_mount" => SYS_move_mount,
        "open_tree" => SYS_open_tree,
        "fsopen" => SYS_fsopen,
        "fsmount" => SYS_fsmount,
        "fsconfig" => SYS_fsconfig,
        "fspick" => SYS_fspick,
        "open_by_handle_at" => SYS_open_by_handle_at,
        "kexec_load" => SYS_kexec_load,
        "kexec_file_load" => SYS_kexec_file_load,
        "init_module" => SYS_init_module,
        "finit_module" => SYS_finit_module,
        "delete_module" => SYS_delete_module,
        "reboot" => SYS_reboot,
        "swapon" => SYS_swapon,
        "swapoff" => SYS_swapoff,
        "bpf" => SYS_bpf,
        "io_uring_setup" => SYS_io_uring_setup,
        "io_uring_enter" => SYS_io_uring_enter,
        "io_uring_register" => SYS_io_uring_register,
        "keyctl" => SYS_keyctl,
        "add_key" => SYS_add_key,
        "request_key" => SYS_request_key,
        "userfaultfd" => SYS_userfaultfd,
        "perf_event_open" => SYS_perf_event_open,
        "unshare" => SYS_unshare,
        "setns" => SYS_setns,
        "clone" => SYS_clone,
        "clone3" => SYS_clone3,
        "ptrace" => SYS_ptrace,
        "process_vm_readv" => SYS_process_vm_readv,
        "process_vm_writev" => SYS_process_vm_writev,
        "fchmod" => SYS_fchmod,
        "fchmodat" => SYS_fchmodat,
        "fchmodat2" => SYS_fchmodat2,
        "mknodat" => SYS_mknodat,
        "openat" => SYS_openat,
        "openat2" => SYS_openat2,
        "fchown" => SYS_fchown,
        "fchownat" => SYS_fchownat,
        _ => return legacy_syscall_number(name),
    };
    Some(nr)
}

/// The syscalls only older architectures have ([`LEGACY_SYSCALLS`]).
#[cfg(target_arch = "x86_64")]
fn legacy_syscall_number(name: &str) -> Option<i64> {
    use libc::*;
    Some(match name {
        "chmod" => SYS_chmod,
        "chown" => SYS_chown,
        "lchown" => SYS_lchown,
        "open" => SYS_open,
        "creat" => SYS_creat,
        "mknod" => SYS_mknod,
        _ => return None,
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn legacy_syscall_number(_name: &str) -> Option<i64> {
    None
}

fn target_arch() -> Result<TargetArch, HostError> {
    std::env::consts::ARCH.try_into().map_err(|_| {
        HostError::SeccompCompile(format!("no seccomp support for {}", std::env::consts::ARCH))
    })
}

fn condition(check: &ArgCheck) -> Result<SeccompCondition, HostError> {
    let (arg, dword, op, value) = match *check {
        ArgCheck::Eq { arg, value, dword } => (arg, dword, SeccompCmpOp::Eq, value),
        ArgCheck::Ne { arg, value, dword } => (arg, dword, SeccompCmpOp::Ne, value),
        ArgCheck::MaskedEq {
            arg,
            mask,
            value,
            dword,
        } => (arg, dword, SeccompCmpOp::MaskedEq(mask), value),
    };
    let len = if dword {
        SeccompCmpArgLen::Dword
    } else {
        SeccompCmpArgLen::Qword
    };
    SeccompCondition::new(arg, len, op, value).map_err(|e| HostError::SeccompCompile(e.to_string()))
}

/// Compiles the plan to the programs to install: one, where the merged programs fit.
pub fn compile(plan: &SeccompPlan) -> Result<Vec<BpfProgram>, HostError> {
    Ok(merge(compile_programs(plan)?))
}

/// Compiles the plan to one BPF program per errno (a seccomp filter has one match action;
/// the kernel runs every installed filter and the most restrictive answer wins), and the x32
/// guard.
fn compile_programs(plan: &SeccompPlan) -> Result<Vec<BpfProgram>, HostError> {
    let arch = target_arch()?;
    let mut by_errno: BTreeMap<i32, BTreeMap<i64, Vec<SeccompRule>>> = BTreeMap::new();
    let mut unconditional: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for rule in &plan.rules {
        if LEGACY_SYSCALLS.contains(&rule.syscall) && syscall_number(rule.syscall).is_none() {
            // This architecture has only the `*at` form, which has a rule of its own.
            continue;
        }
        let nr = syscall_number(rule.syscall).ok_or_else(|| {
            HostError::SeccompCompile(format!("unknown syscall {} in the plan", rule.syscall))
        })?;
        if rule.when.is_empty() {
            unconditional.entry(rule.errno).or_default().push(nr);
            continue;
        }
        let conditions = rule
            .when
            .iter()
            .map(condition)
            .collect::<Result<Vec<_>, _>>()?;
        let seccomp_rule =
            SeccompRule::new(conditions).map_err(|e| HostError::SeccompCompile(e.to_string()))?;
        by_errno
            .entry(rule.errno)
            .or_default()
            .entry(nr)
            .or_default()
            .push(seccomp_rule);
    }
    // An empty rule list means "always"; a syscall denied unconditionally drops its
    // conditional rules (they would only narrow what is already denied).
    for (errno, nrs) in unconditional {
        let map = by_errno.entry(errno).or_default();
        for nr in nrs {
            map.insert(nr, Vec::new());
        }
    }
    let mut programs = Vec::new();
    for (errno, rules) in by_errno {
        let filter = SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(errno as u32),
            arch,
        )
        .map_err(|e| HostError::SeccompCompile(e.to_string()))?;
        let program: BpfProgram = filter
            .try_into()
            .map_err(|e: seccompiler::BackendError| HostError::SeccompCompile(e.to_string()))?;
        programs.push(program);
    }
    #[cfg(target_arch = "x86_64")]
    programs.push(x32_guard());
    Ok(programs)
}

/// The native backend's terminal rules ([`sandbox_policy::compile::seccomp::terminal_rules`])
/// for a backend whose own enforcer does not have them (nono): installed in the child right
/// before it executes that enforcer, so the enforcer and everything it starts inherit them.
#[derive(Debug)]
pub struct TerminalFilter {
    filters: Vec<BpfProgram>,
}

impl TerminalFilter {
    pub fn new() -> Result<Self, HostError> {
        let plan = SeccompPlan {
            rules: sandbox_policy::compile::seccomp::terminal_rules(),
        };
        Ok(TerminalFilter {
            filters: compile(&plan)?,
        })
    }
}

impl sandbox_exec::ChildSetup for TerminalFilter {
    /// no_new_privs (seccomp requires it of a caller without `CAP_SYS_ADMIN`; the enforcer
    /// sets it anyway for Landlock), then the filter. Async-signal safe: prctl(2) and
    /// seccomp(2) on programs compiled in the parent.
    fn apply_in_child(&self) -> Result<(), sandbox_exec::SetupFailure> {
        use sandbox_exec::{SetupFailure, SetupStep};
        nix::sys::prctl::set_no_new_privs().map_err(SetupFailure::at(SetupStep::NoNewPrivs))?;
        for filter in &self.filters {
            if seccompiler::apply_filter(filter).is_err() {
                let errno = nix::errno::Errno::last();
                return Err(SetupFailure {
                    step: SetupStep::SeccompLoad,
                    errno: if errno == nix::errno::Errno::UnknownErrno {
                        nix::errno::Errno::EINVAL
                    } else {
                        errno
                    },
                    detail: 0,
                });
            }
        }
        Ok(())
    }

    fn name(&self) -> &str {
        "terminal ioctl filter"
    }
}

/// Classic BPF opcodes `merge` reads and writes.
const BPF_RET_K: u16 = 0x06;
const BPF_JMP_JA: u16 = 0x05;
/// The kernel's limit on the length of one program.
const BPF_MAXINSNS: usize = 4096;

/// The programs as one, where that fits in one program: the kernel prepares and JIT-compiles
/// each loaded filter (a fifth of the native backend's own set-up cost in a profile) and runs
/// every one of them on each system call of the command, so one program is cheaper on both
/// counts.
///
/// Same answers as installing the programs in order: the kernel takes the most restrictive
/// action of all filters and, among equal ones, the most recently installed filter's. So the
/// merged program runs the last program first, and each "allow" of a program but the first
/// becomes a jump to the next one down; the first program's "allow" is the answer. Every
/// program here answers only allow, one errno, or (an unknown architecture) a kill that the
/// first program reached gives as well.
fn merge(programs: Vec<BpfProgram>) -> Vec<BpfProgram> {
    let total: usize = programs.iter().map(Vec::len).sum();
    if programs.len() < 2 || total > BPF_MAXINSNS {
        return programs;
    }
    let last = programs.len() - 1;
    let mut merged = Vec::with_capacity(total);
    for (i, program) in programs.into_iter().rev().enumerate() {
        let len = program.len();
        for (at, mut insn) in program.into_iter().enumerate() {
            if i != last && insn.code == BPF_RET_K && insn.k == libc::SECCOMP_RET_ALLOW {
                insn = seccompiler::sock_filter {
                    code: BPF_JMP_JA,
                    jt: 0,
                    jf: 0,
                    // Relative to the next instruction: to the first of the next program.
                    k: (len - at - 1) as u32,
                };
            }
            merged.push(insn);
        }
    }
    vec![merged]
}

/// On x86_64, syscalls can also be made through the x32 ABI (number | 0x40000000) with the
/// same audit arch, which per-number filters would not match. Refuse them all (ENOSYS), as
/// if the kernel had no x32 support.
#[cfg(target_arch = "x86_64")]
fn x32_guard() -> BpfProgram {
    use seccompiler::sock_filter;
    const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JEQ_K: u16 = 0x15;
    const BPF_JGE_K: u16 = 0x35;
    const BPF_RET_K: u16 = 0x06;
    const OFFSET_NR: u32 = 0;
    const OFFSET_ARCH: u32 = 4;
    let ret_errno = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    let insn = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        insn(BPF_LD_W_ABS, 0, 0, OFFSET_ARCH),
        // Another arch: not ours to judge here (the main filter kills it).
        insn(BPF_JEQ_K, 0, 3, AUDIT_ARCH_X86_64),
        insn(BPF_LD_W_ABS, 0, 0, OFFSET_NR),
        insn(BPF_JGE_K, 0, 1, X32_SYSCALL_BIT),
        insn(BPF_RET_K, 0, 0, ret_errno),
        insn(BPF_RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_syscall_the_compiler_can_emit_has_a_number() {
        use sandbox_policy::model::NetPolicy;
        let dir = tempfile::tempdir().unwrap();
        let mut policy = sandbox_policy::build(sandbox_policy::PolicyRequest {
            workdir: dir.path().into(),
            block_net: true,
            ..Default::default()
        })
        .unwrap();
        assert!(matches!(policy.net, NetPolicy::Block { .. }));
        let plan = sandbox_policy::compile::seccomp::compile(&policy);
        for name in plan.syscalls() {
            assert!(syscall_number(name).is_some(), "{name}");
        }
        let programs = compile(&plan).unwrap();
        assert_eq!(
            programs.len(),
            1,
            "the errno programs and the x32 guard, merged"
        );
        policy.net = NetPolicy::Allow;
        compile(&sandbox_policy::compile::seccomp::compile(&policy)).unwrap();
    }

    /// A classic-BPF interpreter for the instructions seccompiler and the x32 guard emit,
    /// over `struct seccomp_data` (nr, arch, instruction pointer, six arguments).
    fn run(program: &[seccompiler::sock_filter], data: &[u32; 16]) -> u32 {
        let mut acc: u32 = 0;
        let mut pc = 0usize;
        loop {
            let insn = &program[pc];
            let (class, op, src) = (insn.code & 0x07, insn.code & 0xf0, insn.code & 0x08);
            pc += 1;
            match class {
                // BPF_LD | BPF_W | BPF_ABS
                0x00 => acc = data[insn.k as usize / 4],
                // BPF_ALU (AND with a constant is all seccompiler uses)
                0x04 if op == 0x50 && src == 0 => acc &= insn.k,
                0x05 => {
                    let taken = match op {
                        0x00 => {
                            pc += insn.k as usize;
                            continue;
                        }
                        0x10 => acc == insn.k,
                        0x20 => acc > insn.k,
                        0x30 => acc >= insn.k,
                        0x40 => acc & insn.k != 0,
                        other => panic!("jump op {other:#x}"),
                    };
                    pc += if taken { insn.jt } else { insn.jf } as usize;
                }
                0x06 => return insn.k,
                other => panic!("class {other:#x} (code {:#x})", insn.code),
            }
        }
    }

    /// What the kernel answers with `programs` installed in order.
    fn kernel_answer(programs: &[BpfProgram], data: &[u32; 16]) -> u32 {
        let precedence = |ret: u32| match ret & libc::SECCOMP_RET_ACTION_FULL {
            libc::SECCOMP_RET_KILL_PROCESS => 0,
            libc::SECCOMP_RET_KILL_THREAD => 1,
            libc::SECCOMP_RET_TRAP => 2,
            libc::SECCOMP_RET_ERRNO => 3,
            _ => 4,
        };
        let mut best = libc::SECCOMP_RET_ALLOW;
        for program in programs {
            let ret = run(program, data);
            // Most restrictive wins; among equals, the one installed later.
            if precedence(ret) <= precedence(best) {
                best = ret;
            }
        }
        best
    }

    #[test]
    fn the_merged_program_answers_as_the_programs_installed_one_by_one() {
        use sandbox_policy::model::NetPolicy;
        let dir = tempfile::tempdir().unwrap();
        for block_net in [false, true] {
            let policy = sandbox_policy::build(sandbox_policy::PolicyRequest {
                workdir: dir.path().into(),
                block_net,
                ..Default::default()
            })
            .unwrap();
            assert_eq!(matches!(policy.net, NetPolicy::Block { .. }), block_net);
            let plan = sandbox_policy::compile::seccomp::compile(&policy);
            let separate = compile_programs(&plan).unwrap();
            assert!(separate.len() >= 3);
            let merged = merge(separate.clone());
            assert_eq!(merged.len(), 1);
            assert_eq!(
                merged[0].len(),
                separate.iter().map(Vec::len).sum::<usize>()
            );
            let arch = 0xC000_003E_u32; // AUDIT_ARCH_X86_64
            let args = [0u32, 1, 2, 3, 10, 16, 0x5401, 0x80000, 0x10000000, u32::MAX];
            let mut denied = 0;
            for nr in (0..460).chain([0x4000_0000, 0x4000_0001, 0x4000_0029]) {
                for a0 in args {
                    for a1 in [0u32, 1, 2, 5, 0x5412, 0x541C] {
                        for a2 in [0u32, 1, 2] {
                            let mut data = [0u32; 16];
                            data[0] = nr;
                            data[1] = arch;
                            data[4] = a0;
                            data[6] = a1;
                            data[8] = a2;
                            let want = kernel_answer(&separate, &data);
                            assert_eq!(run(&merged[0], &data), want, "nr {nr} args {a0} {a1} {a2}");
                            denied += usize::from(want != libc::SECCOMP_RET_ALLOW);
                        }
                    }
                }
            }
            assert!(denied > 0, "the sample never hit a rule");
            // Another architecture gets the same answer too.
            let mut data = [0u32; 16];
            data[1] = 0x4000_0003; // AUDIT_ARCH_I386
            assert_eq!(run(&merged[0], &data), kernel_answer(&separate, &data));
        }
    }

    #[test]
    fn where_two_programs_deny_the_same_call_the_later_ones_errno_wins_as_in_the_kernel() {
        let deny = |nr: i64, errno: i32| -> BpfProgram {
            SeccompFilter::new(
                [(nr, Vec::new())].into_iter().collect(),
                SeccompAction::Allow,
                SeccompAction::Errno(errno as u32),
                target_arch().unwrap(),
            )
            .unwrap()
            .try_into()
            .unwrap()
        };
        let programs = vec![
            deny(libc::SYS_keyctl, libc::EPERM),
            deny(libc::SYS_keyctl, libc::EACCES),
        ];
        let merged = merge(programs.clone());
        let mut data = [0u32; 16];
        data[0] = libc::SYS_keyctl as u32;
        data[1] = 0xC000_003E;
        let want = kernel_answer(&programs, &data);
        assert_eq!(want, libc::SECCOMP_RET_ERRNO | libc::EACCES as u32);
        assert_eq!(run(&merged[0], &data), want);
    }
}
