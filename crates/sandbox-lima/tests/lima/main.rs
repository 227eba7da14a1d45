//! The Lima backend's tests: the generator against Lima's documented schema (contract), the
//! lifecycle against a `limactl` stand-in that plays back Lima's real output (standin), and
//! the real `limactl` where one is installed (real; `skipped: <reason>` elsewhere).

// A panic is how a test or a benchmark reports failure; the workspace lints against
// unwrap/expect apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod contract;
mod real;
mod standin;
mod store;
mod virtiofs;
