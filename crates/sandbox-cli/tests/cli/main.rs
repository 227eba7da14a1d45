//! The `sandbox` binary's integration tests, one test binary (`--test cli`): each module was
//! a binary of its own, and each compiled the shared escape suite (`common/escape/`) again.
//! Run one family with a filter: `cargo test -p sandbox-cli --test cli -- escape::`.

// A panic is how a test or a benchmark reports failure; the workspace lints against
// unwrap/expect apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

mod agents;
mod boxlite;
mod config;
mod credentials;
mod escape;
mod exec;
mod external;
mod git_store;
mod home;
mod home_kept;
mod home_tasks;
mod host_files;
mod lima;
mod limits;
mod native;
mod net;
mod net_agree;
mod net_user;
mod notices;
mod publish;
mod run;
mod seam;
mod service;
mod view;
