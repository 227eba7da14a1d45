//! The daemon's own records as JSON values, which cannot fail: `serde_json` fails only for a
//! `Serialize` impl that returns an error or a map whose keys are not strings or numbers, and
//! the records serialised here (box and task info) are derived, with string keys. A failure
//! would be a bug in those types, so it panics naming that instead of failing a request.

use serde::Serialize;
use serde_json::Value;

#[allow(clippy::expect_used)] // see the module doc
pub(crate) fn to_value<T: Serialize + ?Sized>(v: &T) -> Value {
    serde_json::to_value(v).expect("the daemon's derived records serialise to JSON")
}
