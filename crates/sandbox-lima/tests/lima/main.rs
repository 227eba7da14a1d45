//! The Lima backend's tests: the generator against Lima's documented schema (contract), the
//! lifecycle against a `limactl` stand-in that plays back Lima's real output (standin), and
//! the real `limactl` where one is installed (real; `skipped: <reason>` elsewhere).

mod common;
mod contract;
mod real;
mod standin;
mod store;
