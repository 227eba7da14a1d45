//! Serialising the protocol's own values, which cannot fail: `serde_json` fails only for a
//! `Serialize` impl that returns an error or a map whose keys are not strings or numbers, and
//! every type this crate serialises is derived with field-name or string keys (a [`Value`]
//! always serialises); writing into a `Vec` does no I/O. A failure would be a bug in this
//! crate's types, so it panics naming that instead of making every encoder fallible.

use serde::Serialize;
use serde_json::Value;

const WHY: &str = "the protocol's derived types serialise to JSON";

#[allow(clippy::expect_used)] // see the module doc
pub(crate) fn to_value<T: Serialize + ?Sized>(v: &T) -> Value {
    serde_json::to_value(v).expect(WHY)
}

#[allow(clippy::expect_used)] // see the module doc
pub(crate) fn to_vec<T: Serialize + ?Sized>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect(WHY)
}

#[allow(clippy::expect_used)] // see the module doc
pub(crate) fn write<T: Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
    serde_json::to_writer(out, v).expect(WHY)
}
