//! Joining a run's cgroups: the caller creates the groups and opens the file that moves a
//! process in (v1's `tasks`, v2's `cgroup.procs`); the child prelude ([`crate::prelude`]) writes itself into each, first of all its
//! steps, so that the command and every process it starts are counted from their first
//! instruction (a fork bomb's first fork included) and no process of the run is ever outside.

use std::os::fd::OwnedFd;

use crate::setup::{SetupFailure, SetupStep};

/// The files that move the writer into each group a command's process joins (`tasks` of
/// each cgroup v1 hierarchy — the child is a single thread then —, or a v2 group's
/// `cgroup.procs`), open for writing.
#[derive(Debug)]
pub struct JoinCgroups {
    procs: Vec<OwnedFd>,
}

impl JoinCgroups {
    pub fn new(procs: Vec<OwnedFd>) -> JoinCgroups {
        JoinCgroups { procs }
    }

    /// Child side: moves the calling process into every group (`0` names the writer, in v1
    /// and v2 alike). Async-signal safe: write(2) only.
    pub(crate) fn join(&self) -> Result<(), SetupFailure> {
        for (index, fd) in self.procs.iter().enumerate() {
            // write(2) only (nix's wrapper allocates nothing).
            if nix::unistd::write(fd, b"0") != Ok(1) {
                let mut failure = SetupFailure::last(SetupStep::JoinCgroup);
                failure.detail = index as u32;
                return Err(failure);
            }
        }
        Ok(())
    }
}
