//! Regression tests: minimal programs the differential fuzzer
//! (`tests/fuzz_ops.rs`) found, in the form it prints them, each with the
//! bug it caught and where it was fixed; by area (`numerics`, `oracle`,
//! `conv`). One test binary: each `tests/*.rs` is a separate link.

#[path = "../common/mod.rs"]
mod common;
mod conv;
#[path = "../fuzz_support/mod.rs"]
mod fuzz_support;
mod numerics;
mod oracle;
