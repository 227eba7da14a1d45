/* The floor a sandbox supervisor can reach on this machine, for the run-overhead benchmark:
 * fork, setsid, a Landlock ruleset with two rules, a one-rule seccomp filter, exec, wait.
 *
 *     min_supervisor READ_ONLY_DIR READ_WRITE_DIR PROGRAM [ARGS...]
 *
 * Nothing else: no policy, no git, no environment filtering, no error reporting beyond the
 * exit status. What `sandbox run` adds over this is what the benchmark reports. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int add_rule(int ruleset, const char *path, __u64 access) {
    struct landlock_path_beneath_attr rule = {.allowed_access = access};
    rule.parent_fd = open(path, O_PATH | O_CLOEXEC);
    if (rule.parent_fd < 0)
        return -1;
    int rc = syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0);
    close(rule.parent_fd);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 4)
        return 2;
    const __u64 read = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE |
                       LANDLOCK_ACCESS_FS_READ_DIR;
    const __u64 all = read | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_REMOVE_DIR |
                      LANDLOCK_ACCESS_FS_REMOVE_FILE | LANDLOCK_ACCESS_FS_MAKE_DIR |
                      LANDLOCK_ACCESS_FS_MAKE_REG | LANDLOCK_ACCESS_FS_MAKE_SYM;
    struct landlock_ruleset_attr attr = {.handled_access_fs = all};
    int ruleset = syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0);
    if (ruleset < 0 || add_rule(ruleset, argv[1], read) || add_rule(ruleset, argv[2], all))
        return 125;
    /* One rule: ptrace fails with EPERM; everything else is allowed. */
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ptrace, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof filter / sizeof filter[0], .filter = filter};
    pid_t pid = fork();
    if (pid < 0)
        return 125;
    if (pid == 0) {
        if (setsid() < 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
            syscall(SYS_landlock_restrict_self, ruleset, 0) ||
            syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog))
            _exit(125);
        execv(argv[3], argv + 3);
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) < 0)
        return 125;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
