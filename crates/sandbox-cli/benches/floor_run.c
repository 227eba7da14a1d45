/* The floor of one `sandbox run` with the private view, for the start-up benchmark
 * (`benches/startup.rs`): the same kernel work, and nothing else.
 *
 *     floor_run PLAN PROGRAM [ARGS...]
 *
 * PLAN is written by the benchmark from `sandbox policy show --json` of the same run (one step
 * a line, fields separated by tabs): the view's mounts in the view's order (binds, tmpfs,
 * links, the package caches' overlays, the git store's overlay on a bounded tmpfs layer,
 * pins, the empty files over password hashes, the seal, a private devpts), the user, mount,
 * pid and network namespaces, the id maps, the cgroup v1 groups with their limits (joined
 * through `tasks`), the capability drop, the Landlock ruleset (the parent's rules, then the
 * child's for what only its view has), the very BPF program `sandbox` loads, chroot, exec,
 * wait, and after the command the groups removed, the overlays' volatile markers removed (a
 * layer cannot be mounted again while its marker is there) and the run's scratch directory
 * removed. No policy, no git, no private home, no checks, no error text: what `sandbox run`
 * adds over this is what the benchmark reports. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_STEPS 512
#define MAX_FIELDS 8

struct step {
    char *f[MAX_FIELDS];
    int n;
};

static struct step steps[MAX_STEPS];
static int nsteps;
static char run_dir[4096];

/* Our own copy: older headers lack `scoped`. */
struct ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net;
    uint64_t scoped;
};

struct mount_attr_ {
    uint64_t attr_set, attr_clr, propagation, userns_fd;
};

#ifndef MOUNT_ATTR_RDONLY
#define MOUNT_ATTR_RDONLY 0x1
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif

static char *subst(const char *s) {
    /* "@RUN@" names this run's scratch directory. */
    size_t n = 1;
    for (const char *p = strstr(s, "@RUN@"); p; p = strstr(p + 5, "@RUN@"))
        n++;
    char *out = malloc(strlen(s) + n * strlen(run_dir) + 1), *o = out;
    for (const char *p = s; *p;) {
        if (!strncmp(p, "@RUN@", 5)) {
            o = stpcpy(o, run_dir);
            p += 5;
        } else {
            *o++ = *p++;
        }
    }
    *o = 0;
    return out;
}

static int load(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0 && nsteps < MAX_STEPS) {
        line[strcspn(line, "\n")] = 0;
        if (!*line)
            continue;
        struct step *s = &steps[nsteps++];
        char *save = NULL;
        for (char *tok = strtok_r(line, "\t", &save); tok && s->n < MAX_FIELDS;
             tok = strtok_r(NULL, "\t", &save))
            s->f[s->n++] = subst(tok);
    }
    free(line);
    fclose(f);
    return 0;
}

static int is(const struct step *s, const char *op) { return !strcmp(s->f[0], op); }

static int write_file(const char *path, const char *data) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, data, strlen(data));
    close(fd);
    return n == (ssize_t)strlen(data) ? 0 : -1;
}

static int readonly(const char *path, int recursive) {
    struct mount_attr_ attr = {.attr_set = MOUNT_ATTR_RDONLY};
    return syscall(SYS_mount_setattr, AT_FDCWD, path, recursive ? AT_RECURSIVE : 0, &attr,
                   sizeof attr);
}

/* `staging` + `path` (absolute) into `out`. */
static void inside(char *out, const char *staging, const char *path) {
    snprintf(out, 4096, "%s%s", staging, path);
}

/* Mount points: every missing ancestor of the target, then the target (a directory, or an
 * empty file). On the root tmpfs as the view makes them, or in a bound host directory where
 * `sandbox` made them before the run. */
static size_t staging_len;

static void make_parents(char *buf) {
    for (char *p = buf + staging_len + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        mkdir(buf, 0755);
        *p = '/';
    }
}

static void make_point(const char *path, int dir) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    make_parents(buf);
    if (dir) {
        mkdir(buf, 0755);
    } else {
        int fd = open(buf, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd >= 0)
            close(fd);
    }
}

static int view(const char *staging) {
    char t[4096], s[4096];
    char empty[4096];
    int have_empty = 0;
    inside(empty, staging, "/.sandbox-empty");
    staging_len = strlen(staging);
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
        mount("tmpfs", staging, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755"))
        return 1;
    for (int i = 0; i < nsteps; i++) {
        struct step *st = &steps[i];
        if (is(st, "layer")) {
            /* The git store's writable layer: a bounded tmpfs with its two directories. */
            char data[64];
            snprintf(data, sizeof data, "size=%s,mode=0700", st->f[2]);
            if (mount("tmpfs", st->f[1], "tmpfs", MS_NOSUID | MS_NODEV, data))
                return 2;
            for (int k = 3; k < st->n; k++) {
                snprintf(t, sizeof t, "%s/%s", st->f[1], st->f[k]);
                if (mkdir(t, 0755))
                    return 2;
            }
        } else if (is(st, "tmpfs")) {
            inside(t, staging, st->f[1]);
            make_point(t, 1);
            char data[32];
            snprintf(data, sizeof data, "mode=%s", st->f[2]);
            if (mount("tmpfs", t, "tmpfs", MS_NOSUID | MS_NODEV, data))
                return 3;
        } else if (is(st, "bind")) {
            inside(t, staging, st->f[2]);
            make_point(t, st->f[4][0] == '1');
            if (mount(st->f[1], t, NULL, MS_BIND | MS_REC, NULL) ||
                (st->f[3][0] == '1' && readonly(t, 1)))
                return 4;
        } else if (is(st, "symlink")) {
            inside(t, staging, st->f[2]);
            make_parents(t);
            if (symlink(st->f[1], t))
                return 5;
        } else if (is(st, "overlay")) {
            inside(t, staging, st->f[1]);
            make_point(t, 1);
            if (mount("overlay", t, "overlay", MS_NOSUID | MS_NODEV, st->f[2]))
                return 6;
        } else if (is(st, "pin")) {
            inside(t, staging, st->f[1]);
            if (mount(t, t, NULL, MS_BIND, NULL) || readonly(t, 0))
                return 7;
        } else if (is(st, "seal")) {
            inside(t, staging, st->f[1]);
            if (mount(t, t, NULL, MS_BIND | MS_REC, NULL) || readonly(t, 0))
                return 8;
        } else if (is(st, "empty")) {
            if (!have_empty) {
                make_point(empty, 0);
                have_empty = 1;
            }
            inside(t, staging, st->f[1]);
            make_point(t, 0);
            if (mount(empty, t, NULL, MS_BIND | MS_REC, NULL) || readonly(t, 1))
                return 9;
        } else if (is(st, "devpts")) {
            inside(t, staging, st->f[1]);
            make_point(t, 1);
            if (mount("devpts", t, "devpts", MS_NOSUID | MS_NOEXEC,
                      "newinstance,ptmxmode=0666,mode=0620"))
                return 10;
        } else if (is(st, "procdir")) {
            inside(s, staging, "/proc");
            make_point(s, 1);
        }
    }
    if (have_empty)
        unlink(empty);
    return readonly(staging, 0) ? 11 : 0;
}

static int has(const char *op) {
    for (int i = 0; i < nsteps; i++)
        if (is(&steps[i], op))
            return 1;
    return 0;
}

static const struct step *find(const char *op) {
    for (int i = 0; i < nsteps; i++)
        if (is(&steps[i], op))
            return &steps[i];
    return NULL;
}

static uint64_t rights(char class, int dir, uint64_t all) {
    const uint64_t file = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE |
                          LANDLOCK_ACCESS_FS_READ_FILE | (1ULL << 14) /* TRUNCATE */ |
                          (1ULL << 15) /* IOCTL_DEV */;
    uint64_t r;
    switch (class) {
    case 'r':
        r = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE |
            LANDLOCK_ACCESS_FS_READ_DIR;
        break;
    case 'l':
        r = LANDLOCK_ACCESS_FS_READ_DIR;
        break;
    case 'd':
        r = file;
        break;
    default:
        r = all;
    }
    r &= all;
    return dir ? r : r & file;
}

static int add_rule(int ruleset, const char *path, char class, uint64_t all) {
    struct landlock_path_beneath_attr rule = {0};
    rule.parent_fd = open(path, O_PATH | O_CLOEXEC);
    if (rule.parent_fd < 0)
        return 0; /* as `sandbox`: a system path that is not there is skipped */
    struct stat st;
    fstat(rule.parent_fd, &st);
    rule.allowed_access = rights(class, S_ISDIR(st.st_mode), all);
    int rc = syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0);
    close(rule.parent_fd);
    return rc;
}

static int lo_up(void) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr = {0};
    strcpy(ifr.ifr_name, "lo");
    int rc = s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) ? -1 : 0;
    ifr.ifr_flags |= IFF_UP;
    rc = rc || ioctl(s, SIOCSIFFLAGS, &ifr);
    close(s);
    return rc;
}

/* The command's process: its proc, the child's Landlock rules, the capability drop,
 * no_new_privs, the ruleset, the filter, exec. */
static void command(int ruleset, uint64_t all, struct sock_fprog *progs, int nprogs,
                    char **argv) {
    if (has("procdir") &&
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, NULL))
        _exit(120);
    for (int i = 0; i < nsteps; i++)
        if (is(&steps[i], "crule") && add_rule(ruleset, steps[i].f[2], steps[i].f[1][0], all))
            _exit(121);
    const struct step *caps = find("capdrop");
    if (caps)
        for (int c = 0; c <= atoi(caps->f[1]); c++)
            if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0))
                _exit(122);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
        syscall(SYS_landlock_restrict_self, ruleset, 0))
        _exit(123);
    for (int i = 0; i < nprogs; i++)
        if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &progs[i]))
            _exit(123);
    execv(argv[0], argv);
    _exit(127);
}

static int status_of(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    snprintf(run_dir, sizeof run_dir, "-");
    const char *scratch = NULL;
    {
        /* The scratch directory is named before the plan's paths are read. */
        FILE *f = fopen(argv[1], "r");
        char line[4096];
        while (f && fgets(line, sizeof line, f))
            if (!strncmp(line, "scratch\t", 8)) {
                line[strcspn(line, "\n")] = 0;
                scratch = strdup(line + 8);
                snprintf(run_dir, sizeof run_dir, "%s/%d", scratch, getpid());
            }
        if (f)
            fclose(f);
    }
    if (load(argv[1]))
        return 2;
    const struct step *staging = find("staging");
    if (!staging)
        return 2;
    mkdir(staging->f[1], 0700);
    /* Per run: the git store's scratch directory (its snapshot and layer). */
    if (scratch) {
        char p[4096];
        mkdir(run_dir, 0700);
        snprintf(p, sizeof p, "%s/snapshot", run_dir);
        mkdir(p, 0700);
        snprintf(p, sizeof p, "%s/layer", run_dir);
        mkdir(p, 0700);
    }
    /* The command's cgroups, with their limits. */
    for (int i = 0; i < nsteps; i++)
        if (is(&steps[i], "cgroup")) {
            char p[4096];
            snprintf(p, sizeof p, "%s/floor-%d", steps[i].f[1], getpid());
            if (mkdir(p, 0755))
                return 125;
            for (int k = 2; k + 1 < steps[i].n; k += 2) {
                char f[4096];
                snprintf(f, sizeof f, "%s/%s", p, steps[i].f[k]);
                if (write_file(f, steps[i].f[k + 1]))
                    return 125;
            }
        }
    /* The ruleset: every handled right of this kernel's ABI, the parent's rules. */
    int abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    uint64_t all = (1ULL << 13) - 1;
    if (abi >= 2)
        all |= 1ULL << 13;
    if (abi >= 3)
        all |= 1ULL << 14;
    if (abi >= 5)
        all |= 1ULL << 15;
    struct ruleset_attr attr = {.handled_access_fs = all};
    if (abi >= 6)
        attr.scoped = 3; /* abstract unix sockets, signals */
    int ruleset = syscall(SYS_landlock_create_ruleset, &attr,
                          abi >= 6 ? sizeof attr : 2 * sizeof(uint64_t), 0);
    if (ruleset < 0)
        return 125;
    for (int i = 0; i < nsteps; i++)
        if (is(&steps[i], "rule") && add_rule(ruleset, steps[i].f[2], steps[i].f[1][0], all))
            return 125;
    /* The filters `sandbox` loads, as it compiled them. */
    static struct sock_fprog progs[4];
    int nprogs = 0;
    for (int i = 0; i < nsteps && nprogs < 4; i++) {
        if (!is(&steps[i], "bpf"))
            continue;
        struct sock_filter *filter = malloc(BPF_MAXINSNS * sizeof *filter);
        int fd = open(steps[i].f[1], O_RDONLY | O_CLOEXEC);
        ssize_t n = fd < 0 ? -1 : read(fd, filter, BPF_MAXINSNS * sizeof *filter);
        if (fd >= 0)
            close(fd);
        if (n <= 0)
            return 125;
        progs[nprogs].len = n / sizeof *filter;
        progs[nprogs++].filter = filter;
    }
    int ns = CLONE_NEWUSER | CLONE_NEWNS;
    if (has("procdir"))
        ns |= CLONE_NEWPID;
    if (has("netns"))
        ns |= CLONE_NEWNET;
    char uid_map[64], gid_map[64];
    snprintf(uid_map, sizeof uid_map, "%d %d 1\n", geteuid(), geteuid());
    snprintf(gid_map, sizeof gid_map, "%d %d 1\n", getegid(), getegid());
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd))
        return 125;
    pid_t pid = fork();
    if (pid < 0)
        return 125;
    if (pid == 0) {
        /* One thread: `tasks` moves it without the thread-group lock. */
        for (int i = 0; i < nsteps; i++)
            if (is(&steps[i], "cgroup")) {
                char p[4096];
                snprintf(p, sizeof p, "%s/floor-%d/tasks", steps[i].f[1], getppid());
                if (write_file(p, "0"))
                    _exit(124);
            }
        if (setsid() < 0 || unshare(ns) || write_file("/proc/self/setgroups", "deny") ||
            write_file("/proc/self/uid_map", uid_map) ||
            write_file("/proc/self/gid_map", gid_map))
            _exit(124);
        int v = view(staging->f[1]);
        if (v)
            _exit(100 + v);
        if ((ns & CLONE_NEWNET) && lo_up())
            _exit(119);
        if (chdir(staging->f[1]) || chroot(".") || chdir(cwd))
            _exit(118);
        if (!(ns & CLONE_NEWPID))
            command(ruleset, all, progs, nprogs, argv + 2);
        /* The namespace's init: starts the command, waits for it, ends with its status. */
        pid_t init = fork();
        if (init < 0)
            _exit(117);
        if (init == 0) {
            pid_t cmd = fork();
            if (cmd < 0)
                _exit(116);
            if (cmd == 0)
                command(ruleset, all, progs, nprogs, argv + 2);
            int status;
            while (waitpid(cmd, &status, 0) < 0 && errno == EINTR)
                ;
            _exit(status_of(status));
        }
        int status;
        while (waitpid(init, &status, 0) < 0 && errno == EINTR)
            ;
        _exit(status_of(status));
    }
    int status;
    if (waitpid(pid, &status, 0) < 0)
        return 125;
    /* After the command: the groups, the overlays' volatile markers, the scratch. */
    for (int i = 0; i < nsteps; i++) {
        char p[4096];
        if (is(&steps[i], "cgroup")) {
            snprintf(p, sizeof p, "%s/floor-%d", steps[i].f[1], getpid());
            rmdir(p);
        } else if (is(&steps[i], "marker")) {
            snprintf(p, sizeof p, "%s/work/incompat/volatile/dirty", steps[i].f[1]);
            unlink(p);
            snprintf(p, sizeof p, "%s/work/incompat/volatile", steps[i].f[1]);
            rmdir(p);
        }
    }
    if (scratch) {
        char cmd[4200];
        /* Removed the way `sandbox` removes a layer: its directories, one by one. */
        snprintf(cmd, sizeof cmd, "%s/layer", run_dir);
        rmdir(cmd);
        snprintf(cmd, sizeof cmd, "%s/snapshot", run_dir);
        rmdir(cmd);
        rmdir(run_dir);
    }
    return status_of(status);
}
