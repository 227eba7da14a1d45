//! A VM box as asked for ([`sandbox_host::seam::VmRequest`]) checked and compiled into a
//! [`BoxSpec`]: the image, the sizes, the environment, the workdir and the worktree's git data
//! mounted by the rules of [`crate::git`], the requested mounts, the network allow-list. Reads
//! the git layout of the workdir; creates nothing but the box's git directory when its commits
//! come back.

use std::path::{Path, PathBuf};

use sandbox_git::quarantine::generation::BoxGit;
use sandbox_host::seam::VmRequest;

use crate::error::PrepareError;
use crate::git::GitData;
use crate::git::{check_against_git, commit_mounts, git_mounts, order_for_guest, CommitDirs};
use crate::spec::{self, BoxSpec, Mount, NetTarget};

/// Whether a linked worktree's box gets the commit mounts (docs/boxlite.md, "Commits from a
/// box"). They take four mounts, and with BoxLite 0.10.8 giving each its own device the
/// fourth exhausts libkrun's interrupts even without the network
/// (`RegisterVsockDevice(IrqsExhausted)`, measured booted): so they come only where the
/// box's view is composed on the host ([`crate::share`]), where the daemon can make binds.
pub const COMMITS_FROM_BOXES: bool = true;

/// Below the state directory: the boxes' git directories (`<this>/<box name>`), where a box's
/// commits come back through generations of the common dir
/// (`sandbox_git::quarantine::generation`).
pub const BOX_GIT_DIR: &str = "boxlite-git";

/// [`box_spec_with`] for a box whose git writes do not come back, a share per mount.
pub fn box_spec(vm: &VmRequest, workdir: &Path, block_net: bool) -> Result<BoxSpec, PrepareError> {
    box_spec_with(vm, workdir, block_net, None, None).map(|(spec, _)| spec)
}

/// The box's description checked and compiled into a [`BoxSpec`]: the workdir mounted at its
/// own path read-write; the worktree's git data read-only at its own paths, stacked on the
/// workdir where it lies inside it (`crate::git`: nothing the host's git runs can be written
/// from a box); the requested mounts, none of them a writable way to that data.
///
/// `commit_root`: for a linked worktree (without `unprotected_git`), the box's git directory
/// on the host: its `.git` then names a generation of the common dir there, which the host
/// reads back at the end of each busy period (`sandbox_git::quarantine::generation`).
///
/// `share`: the box's staging directory when its mounts are composed on the host
/// ([`crate::share`]); `None`, a share per mount, as many as libkrun has room for.
pub fn box_spec_with(
    vm: &VmRequest,
    workdir: &Path,
    block_net: bool,
    commit_root: Option<&Path>,
    share: Option<&Path>,
) -> Result<(BoxSpec, Option<BoxGit>), PrepareError> {
    let image = spec::image_source(vm.image.as_deref(), vm.rootfs.as_deref())?;
    let sizes = spec::check_sizes(vm.cpus, vm.memory_mib, vm.disk_size_gb)?;
    spec::check_env(&vm.env)?;
    let mut mounts = vec![spec::check_mount(workdir, workdir, false)?];
    let mut commits = None;
    let git = match sandbox_policy::git::discover(workdir) {
        Ok(Some(found)) => {
            let linked = found.layout.worktree_gitdir != found.layout.common_dir;
            if let (true, false, Some(root)) = (linked, vm.unprotected_git, commit_root) {
                let git = BoxGit::new(
                    &found.layout.common_dir,
                    &found.layout.worktree_gitdir,
                    root,
                )
                .map_err(PrepareError::BoxGit)?;
                commits = Some((git, workdir.join(".git")));
            }
            Some(GitData {
                common_dir: found.layout.common_dir.clone(),
                pointers: found
                    .layout
                    .pointers
                    .iter()
                    .map(|f| f.path.clone())
                    .collect(),
                hooks_path: found.layout.hooks_path.clone(),
            })
        }
        Ok(None) => None,
        Err(source) => {
            return Err(PrepareError::GitLayout {
                workdir: workdir.to_path_buf(),
                source,
            })
        }
    };
    match (&git, &commits) {
        (Some(git), Some((box_git, dot_git))) => {
            let dirs = CommitDirs {
                writable: box_git.writable(),
                pointer: box_git.pointer(),
                dot_git: dot_git.clone(),
            };
            mounts.extend(commit_mounts(git, &mounts[0].host, &dirs)?);
        }
        (Some(git), None) => mounts.extend(git_mounts(git, &mounts[0].host, vm.unprotected_git)?),
        (None, _) => {}
    }
    for m in &vm.mounts {
        let checked = spec::check_mount(&m.host, &m.guest, m.read_only)?;
        if mounts.iter().any(|x: &Mount| x.guest == checked.guest) {
            return Err(PrepareError::TwoMounts {
                guest: checked.guest,
            });
        }
        if let (Some(git), false) = (&git, vm.unprotected_git) {
            check_against_git(&checked, git)?;
        }
        mounts.push(checked);
    }
    order_for_guest(&mut mounts);
    let allow_net = vm
        .allow_net
        .iter()
        .map(|s| NetTarget::parse(s))
        .collect::<Result<Vec<_>, _>>()?;
    if block_net && !allow_net.is_empty() {
        return Err(spec::SpecError::AllowOnBlocked.into());
    }
    spec::check_device_budget(&mounts, block_net, share.is_some())?;
    let spec = BoxSpec {
        name: vm.name.clone(),
        image,
        cpus: sizes.cpus,
        memory_mib: sizes.memory_mib,
        disk_size_gb: sizes.disk_size_gb,
        mounts,
        share: share.map(Path::to_path_buf),
        allow_net,
        block_net,
        env: vm.env.clone(),
        workdir: Some(workdir.to_path_buf()),
    };
    Ok((spec, commits.map(|(git, _)| git)))
}

/// The mounts of `spec` that are grants of the user's (checked against the trusted places and
/// BoxLite's home): all but those of the box's own git directory `commit_root`, which the
/// backend made for this box (as a private home is a run's) inside the state directory.
pub fn granted_mounts<'a>(
    spec: &'a BoxSpec,
    commit_root: &'a Path,
) -> impl Iterator<Item = &'a Mount> + 'a {
    spec.mounts
        .iter()
        .filter(move |m| !m.host.starts_with(commit_root))
}

/// The first granted mount that reaches BoxLite's `home` (lies in it, or holds it): the box
/// could rewrite another box's disk, or the runtime's database.
pub fn reaching_home<'a>(
    mut granted: impl Iterator<Item = &'a Mount>,
    home: &Path,
) -> Option<PathBuf> {
    granted
        .find(|m| m.host.starts_with(home) || home.starts_with(&m.host))
        .map(|m| m.host.clone())
}

#[cfg(test)]
mod tests {
    //! The git rules of a box's mounts, against real repositories and worktrees.
    use std::path::{Path, PathBuf};

    use sandbox_host::seam::VmMount;
    use sandbox_testkit::git;

    use super::*;

    /// A repository with one commit, and a linked worktree `task` beside it.
    fn repo(root: &Path) -> (PathBuf, PathBuf) {
        let main = root.join("repo");
        let task = root.join("task");
        sandbox_testkit::linked_worktree(&main, &task);
        let layout = root.join("layout");
        std::fs::create_dir(&layout).unwrap();
        std::fs::write(layout.join("oci-layout"), "{}").unwrap();
        std::fs::write(layout.join("index.json"), "{}").unwrap();
        (main.canonicalize().unwrap(), task.canonicalize().unwrap())
    }

    fn mount(host: &Path, guest: &str, read_only: bool) -> VmMount {
        VmMount {
            host: host.to_path_buf(),
            guest: PathBuf::from(guest),
            read_only,
        }
    }

    fn request(root: &Path, mounts: Vec<VmMount>, unprotected: bool) -> VmRequest {
        VmRequest {
            name: "b".into(),
            rootfs: Some(root.join("layout")),
            mounts,
            unprotected_git: unprotected,
            ..VmRequest::default()
        }
    }

    /// A box without the network: these tests are about the mounts, and with the network a
    /// linked worktree's three mounts are refused (the device budget's own test below).
    const BLOCKED: bool = true;

    #[test]
    fn with_the_network_a_linked_worktree_is_refused_and_a_main_worktree_fits() {
        let t = tempfile::tempdir().unwrap();
        let (main, task) = repo(t.path());
        let online = request(t.path(), vec![], false);
        let e = box_spec(&online, &task, false).unwrap_err().to_string();
        assert!(
            e.contains("--block-net") && e.contains("IrqsExhausted"),
            "{e}"
        );
        box_spec(&online, &main, false).unwrap();
        // Composed on the host, a linked worktree with its commit mounts fits beside the network.
        let staging = t.path().join("staging");
        let (spec, git) = box_spec_with(
            &online,
            &task,
            false,
            Some(&t.path().join("box-git")),
            Some(&staging),
        )
        .unwrap();
        assert!(git.is_some());
        assert_eq!(spec.mounts.len(), 4, "{:?}", spec.mounts);
        assert_eq!(spec.share.as_deref(), Some(staging.as_path()));
    }

    fn seen(spec: &BoxSpec) -> Vec<(PathBuf, bool)> {
        spec.mounts
            .iter()
            .inspect(|m| assert_eq!(m.host, m.guest, "git data sits at its own path"))
            .map(|m| (m.host.clone(), m.read_only))
            .collect()
    }

    #[test]
    fn a_main_worktree_gets_its_git_dir_read_only_on_top_of_the_writable_tree() {
        let t = tempfile::tempdir().unwrap();
        let (main, _) = repo(t.path());
        let spec = box_spec(&request(t.path(), vec![], false), &main, BLOCKED).unwrap();
        assert_eq!(
            seen(&spec),
            [(main.clone(), false), (main.join(".git"), true)]
        );
        let unprotected = box_spec(&request(t.path(), vec![], true), &main, BLOCKED).unwrap();
        assert_eq!(
            seen(&unprotected),
            [(main.clone(), false), (main.join(".git"), false)]
        );
    }

    #[test]
    fn a_hooks_path_in_the_worktree_is_read_only_in_the_box() {
        let t = tempfile::tempdir().unwrap();
        let (main, task) = repo(t.path());
        git(&main, &["config", "core.hooksPath", ".husky"]);
        let e = box_spec(&request(t.path(), vec![], false), &task, BLOCKED)
            .unwrap_err()
            .to_string();
        assert!(e.contains("core.hooksPath"), "{e}");
        std::fs::create_dir(task.join(".husky")).unwrap();
        let spec = box_spec(&request(t.path(), vec![], false), &task, BLOCKED).unwrap();
        assert!(
            seen(&spec).contains(&(task.join(".husky"), true)),
            "{:?}",
            spec.mounts
        );
    }

    #[test]
    fn a_linked_worktree_gets_the_common_dir_and_its_pointer_read_only() {
        let t = tempfile::tempdir().unwrap();
        let (main, task) = repo(t.path());
        let spec = box_spec(&request(t.path(), vec![], false), &task, BLOCKED).unwrap();
        assert_eq!(
            seen(&spec),
            [
                (task.clone(), false),
                (main.join(".git"), true),
                (task.join(".git"), true)
            ]
        );
        assert!(task.join(".git").is_file(), "the pointer is a file mount");
    }

    /// With a git directory for the box, a linked worktree's `.git` names the box's current
    /// generation (a read-only file of the host's), the generations' directory is writable at
    /// its own path, and the common dir stays read-only. A main worktree, and an unprotected
    /// box, are as before.
    #[test]
    fn a_linked_worktree_whose_commits_come_back_gets_the_generation_mounts() {
        let t = tempfile::tempdir().unwrap();
        let (main, task) = repo(t.path());
        let root = t.path().join("box-git");
        let (spec, git) = box_spec_with(
            &request(t.path(), vec![], false),
            &task,
            BLOCKED,
            Some(&root),
            None,
        )
        .unwrap();
        let git = git.expect("a linked worktree's commits come back");
        let root = root.canonicalize().unwrap();
        let mounts: Vec<_> = spec
            .mounts
            .iter()
            .map(|m| (m.host.clone(), m.guest.clone(), m.read_only))
            .collect();
        assert_eq!(
            mounts,
            [
                (task.clone(), task.clone(), false),
                (main.join(".git"), main.join(".git"), true),
                (root.join("pointer"), task.join(".git"), true),
                (root.join("git"), root.join("git"), false),
            ]
        );
        assert_eq!(
            std::fs::read_to_string(git.pointer()).unwrap(),
            format!("gitdir: {}/git/current/worktrees/task\n", root.display())
        );
        // The box's own git directory is not a grant; the worktree and the git data are.
        let granted: Vec<_> = granted_mounts(&spec, &root).map(|m| &m.host).collect();
        assert_eq!(granted, [&task, &main.join(".git")]);
        for (dir, unprotected) in [(&main, false), (&task, true)] {
            let (_, none) = box_spec_with(
                &request(t.path(), vec![], unprotected),
                dir,
                BLOCKED,
                Some(&root),
                None,
            )
            .unwrap();
            assert!(none.is_none(), "{}", dir.display());
        }
    }

    #[test]
    fn a_writable_mount_that_reaches_git_data_is_refused_and_a_read_only_one_is_not() {
        let t = tempfile::tempdir().unwrap();
        let (main, task) = repo(t.path());
        for (host, names) in [
            (&main, ".git"),
            (&main.join(".git/hooks"), ".git"),
            (&task, "pointer"),
        ] {
            let rw = vec![mount(host, "/elsewhere", false)];
            let e = box_spec(&request(t.path(), rw.clone(), false), &task, BLOCKED)
                .unwrap_err()
                .to_string();
            assert!(e.contains("writable") && e.contains(names), "{e}");
            let ro = vec![mount(host, "/elsewhere", true)];
            box_spec(&request(t.path(), ro, false), &task, BLOCKED).unwrap();
            box_spec(&request(t.path(), rw, true), &task, BLOCKED).unwrap();
        }
    }

    #[test]
    fn a_mount_on_a_parent_of_the_worktree_is_made_before_it() {
        let t = tempfile::tempdir().unwrap();
        let (_, task) = repo(t.path());
        let empty = t.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let parent = task.parent().unwrap();
        let mounts = vec![mount(&empty, parent.to_str().unwrap(), false)];
        let spec = box_spec(&request(t.path(), mounts, false), &task, BLOCKED).unwrap();
        assert_eq!(spec.mounts[0].guest, parent, "{:?}", spec.mounts);
    }

    #[test]
    fn two_mounts_at_one_guest_path_and_a_mount_reaching_the_home_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let (_, task) = repo(t.path());
        let a = t.path().join("a");
        std::fs::create_dir(&a).unwrap();
        let twice = vec![mount(&a, "/m", true), mount(&a, "/m", false)];
        let e = box_spec(&request(t.path(), twice, false), &task, BLOCKED).unwrap_err();
        assert!(
            matches!(&e, PrepareError::TwoMounts { guest } if guest == Path::new("/m")),
            "{e}"
        );
        let a = a.canonicalize().unwrap();
        let spec = box_spec(
            &request(t.path(), vec![mount(&a, "/m", true)], false),
            &task,
            BLOCKED,
        )
        .unwrap();
        let none = Path::new("/nowhere");
        let reaching = |home: &Path| reaching_home(granted_mounts(&spec, none), home);
        assert_eq!(
            reaching(&a.join("boxlite")),
            Some(a.clone()),
            "a mount holding it"
        );
        assert_eq!(reaching(&a), Some(a.clone()), "the home itself");
        assert_eq!(reaching(&t.path().join("elsewhere")), None);
    }
}
