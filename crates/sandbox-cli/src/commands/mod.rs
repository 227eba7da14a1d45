//! One module per subcommand.

pub mod doctor;
pub mod policy;
pub mod run;
pub mod use_backend;
pub mod view;
