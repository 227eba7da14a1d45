//! A [`SeccompPlan`] compiled to BPF with `seccompiler`, in the parent. The child only
//! installs the finished programs.

use std::collections::BTreeMap;

use sandbox_policy::compile::seccomp::{ArgCheck, SeccompPlan};
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
        _ => return None,
    };
    Some(nr)
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

/// Compiles the plan to one BPF program per errno (a seccomp filter has one match action;
/// the kernel runs every installed filter and the most restrictive answer wins).
pub fn compile(plan: &SeccompPlan) -> Result<Vec<BpfProgram>, HostError> {
    let arch = target_arch()?;
    let mut by_errno: BTreeMap<i32, BTreeMap<i64, Vec<SeccompRule>>> = BTreeMap::new();
    let mut unconditional: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for rule in &plan.rules {
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
        assert!(programs.len() >= 3, "EPERM, EACCES and ENOSYS programs");
        policy.net = NetPolicy::Allow;
        compile(&sandbox_policy::compile::seccomp::compile(&policy)).unwrap();
    }
}
