use super::cleanup::{owner_of, sweep_in};
use super::mounts::unescape;
use super::*;

const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 /inner /sys/fs/cgroup/pids ro,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

#[test]
fn the_start_time_is_counted_after_the_last_parenthesis() {
    let stat = "4242 (a) (b c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 \
                1000 10";
    assert_eq!(start_time(stat), Some(987654));
    assert_eq!(start_time("1 (x) S 1"), None);
    let tag = process_tag();
    assert!(
        tag.starts_with(&format!("{}-", std::process::id())),
        "{tag}"
    );
}

/// A group a killed run left with this process's pid (its record in another project's
/// journal, so nothing removed it) is not in this run's way: with names of the pid
/// alone, the run failed with "creating the group: File exists".
#[test]
fn a_group_left_with_this_pid_does_not_stop_a_run() {
    let machine = probe();
    let Some(parent) = machine
        .v1
        .iter()
        .find(|p| p.controller == Controller::Pids)
        .map(|p| p.dir.clone())
    else {
        return sandbox_testkit::skip(
            "limits-unprivileged-cgroup",
            "no writable cgroup v1 pids group here (as root it is)",
        );
    };
    let left: Vec<PathBuf> = (0..4)
        .map(|n| parent.join(format!("sandbox-{}-{n}", std::process::id())))
        .collect();
    for dir in &left {
        std::fs::create_dir(dir).unwrap();
    }
    let limits = sandbox_policy::Limits {
        pids: Some(sandbox_policy::Limit {
            value: 64,
            source: sandbox_policy::LimitSource::Flag,
        }),
        ..sandbox_policy::Limits::default()
    };
    let plan = limits::plan(&limits, &machine);
    let made = RunGroups::create(&plan, &machine, None);
    for dir in &left {
        std::fs::remove_dir(dir).unwrap();
    }
    let made = made.unwrap();
    assert_eq!(made.dirs().count(), 1);
}

#[test]
fn a_groups_owner_is_read_from_its_name() {
    assert_eq!(owner_of("sandbox-42-987654-3"), Some((42, 987654)));
    assert_eq!(owner_of("sandbox-supervisor-42-987654"), Some((42, 987654)));
    for other in [
        "sandbox-42-3",
        "sandbox-supervisor-42",
        "sandbox-42-987654-3-1",
        "sandbox-a-1-2",
        "sandbox--1-2",
        "user.slice",
        "sandbox-supervisor-42-1-2",
    ] {
        assert_eq!(owner_of(other), None, "{other}");
    }
}

/// The sweep on plain directories standing for a hierarchy's groups (the kernel's side is
/// the CLI's `limits::` tests): a dead owner's empty group goes, whatever journal named it;
/// a live owner's stays (this process, and the pid with another start time is dead); other
/// names stay; a group with something in it stays; as a user, another user's stays.
#[test]
fn the_sweep_removes_only_dead_owners_empty_groups() {
    let root = tempfile::tempdir().unwrap();
    let parent = root.path().join("pids");
    std::fs::create_dir(&parent).unwrap();
    let me = std::process::id();
    let start: u64 = process_tag().rsplit('-').next().unwrap().parse().unwrap();
    // A pid no process has: above the kernel's largest pid_max.
    let dead = 4_194_305u32;
    let mk = |name: String| {
        let dir = parent.join(name);
        std::fs::create_dir(&dir).unwrap();
        dir
    };
    let live = mk(format!("sandbox-{me}-{start}-0"));
    let live_leaf = mk(format!("sandbox-supervisor-{me}-{start}"));
    let reused = mk(format!("sandbox-{me}-{}-0", start + 1));
    let gone = mk(format!("sandbox-{dead}-5-1"));
    let gone_leaf = mk(format!("sandbox-supervisor-{dead}-5"));
    let busy = mk(format!("sandbox-{dead}-5-2"));
    std::fs::write(busy.join("cgroup.procs"), "1\n").unwrap();
    let old = mk(format!("sandbox-{dead}-2"));
    let other = mk("user.slice".into());

    let uid = nix::unistd::geteuid().as_raw();
    assert!(
        sweep_in(std::slice::from_ref(&parent), Some(uid.wrapping_add(1))).is_empty(),
        "another user's groups are not a user's to remove"
    );
    let mut removed = sweep_in(std::slice::from_ref(&parent), Some(uid));
    removed.sort();
    let mut want = vec![reused, gone, gone_leaf];
    want.sort();
    assert_eq!(removed, want);
    for kept in [live, live_leaf, busy, old, other] {
        assert!(kept.is_dir(), "{} was kept", kept.display());
    }
}

#[test]
fn the_probe_reads_mounts_and_own_groups() {
    let mounts = parse_mountinfo(MOUNTINFO);
    assert_eq!(mounts.len(), 4, "{mounts:?}");
    assert!(mounts[3].v2);
    assert_eq!(mounts[1].controllers, vec!["rw", "memory"]);
    assert!(mounts[2].read_only);
    let own = parse_proc_cgroup("9:name=systemd:/\n4:memory:/api/b2\n8:pids:/inner/x\n0::/\n");
    assert_eq!(own[1], (vec!["memory".to_string()], "/api/b2".to_string()));
    assert_eq!(own[3], (Vec::new(), "/".to_string()));
    assert_eq!(
        group_dir(&mounts[1], "/api/b2"),
        Some(PathBuf::from("/sys/fs/cgroup/memory/api/b2"))
    );
    assert_eq!(
        group_dir(&mounts[2], "/inner/x"),
        Some(PathBuf::from("/sys/fs/cgroup/pids/x"))
    );
    assert_eq!(group_dir(&mounts[2], "/elsewhere"), None);
    assert_eq!(
        group_dir(&mounts[3], "/"),
        Some(PathBuf::from("/sys/fs/cgroup/unified"))
    );
    let err = probe_v1(&mounts, &own, Controller::Pids).unwrap_err();
    assert!(err.contains("not writable"), "{err}");
    assert_eq!(unescape("/a\\040b"), "/a b");
}

/// The v2 decisions on a group's files (the kernel's own behaviour is guest-test's limits
/// part, on a real delegated hierarchy): controllers enabled below the group, a scope
/// this process is alone in (vacated first), one shared with others (refused, naming the
/// scope), and the leaf a run moved this process into (its parent is the group).
#[test]
fn the_v2_probe_vacates_only_a_group_this_process_is_alone_in() {
    let root = tempfile::tempdir().unwrap();
    let mount = CgroupMount {
        mount_point: root.path().to_path_buf(),
        root: "/".into(),
        v2: true,
        controllers: Vec::new(),
        read_only: false,
    };
    let scope = root.path().join("app.slice/run-1.scope");
    std::fs::create_dir_all(&scope).unwrap();
    let me = std::process::id().to_string();
    let write = |dir: &Path, file: &str, text: &str| std::fs::write(dir.join(file), text).unwrap();
    write(&scope, "cgroup.controllers", "cpuset cpu io memory pids\n");
    write(&scope, "cgroup.subtree_control", "");
    write(&scope, "cgroup.procs", &format!("{me}\n"));
    let probe = |path: &str| {
        let mut machine = Machine::default();
        probe_v2(
            std::slice::from_ref(&mount),
            &[(Vec::new(), path.to_string())],
            &mut machine,
        );
        machine
    };
    let alone = probe("/app.slice/run-1.scope");
    let v2 = alone.v2.expect("a scope of its own is used");
    assert!(v2.vacate);
    assert_eq!(v2.dir, scope);
    assert_eq!(
        v2.enabled,
        vec![Controller::Cpu, Controller::Memory, Controller::Pids]
    );

    write(&scope, "cgroup.procs", &format!("{me}\n1\n"));
    let shared = probe("/app.slice/run-1.scope");
    assert!(shared.v2.is_none());
    assert!(
        shared.v2_why_not.contains("other processes are in it")
            && shared.v2_why_not.contains("systemd-run --user --scope"),
        "{}",
        shared.v2_why_not
    );

    write(&scope, "cgroup.subtree_control", "memory pids\n");
    let leaf = scope.join(leaf_name());
    std::fs::create_dir(&leaf).unwrap();
    write(&leaf, "cgroup.procs", &format!("{me}\n"));
    write(&leaf, "cgroup.controllers", "memory pids\n");
    write(&leaf, "cgroup.subtree_control", "");
    let moved = probe(&format!("/app.slice/run-1.scope/{}", leaf_name()));
    let v2 = moved.v2.expect("the leaf's parent is the group");
    assert!(v2.vacate, "held as vacated");
    assert_eq!(v2.dir, scope);
    assert_eq!(v2.enabled, vec![Controller::Memory, Controller::Pids]);
}
