//! One module per subcommand.

pub mod config;
pub mod doctor;
pub mod exec;
pub mod exec_box;
pub mod home;
pub mod hook;
pub mod lima;
pub mod policy;
pub mod ps;
pub mod run;
pub mod serve;
pub mod use_backend;
pub mod view;
pub mod why;
