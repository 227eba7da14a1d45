//! Refs in the quarantine: what existed at the start (`store`), what the sandbox changed in
//! its layer (`layer`, read through `untrusted`), which changes the host applies
//! ([`judge`], pure: `rules`), and the compare-and-swap that applies them (`write`).

mod layer;
mod rules;
mod store;
#[cfg(test)]
mod tests;
mod untrusted;
mod write;

pub use layer::Wanted;
pub use rules::{
    creatable_namespace, creation_refused, head_allowed, is_object_id, judge, shadows, RefVerdict,
};
pub use store::{ref_exists, valid_ref_name};

pub(crate) use layer::{changed, changed_in_copy, is_whiteout};
pub(crate) use store::{list, read_packed, symbolic_target};
pub(crate) use untrusted::{open_untrusted, read_untrusted};
pub(crate) use write::{compare_and_swap, last_reflog_message, read_reflog, write_reflog};
