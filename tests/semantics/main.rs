//! Op semantics through the public API: every op against the reference
//! interpreter, fused and unfused (`ops`, `reductions`, `index_random_ops`),
//! IEEE behaviour (`ieee`, `fuzz_subnormals`) and the fuzz shrinker
//! (`fuzz_shrink`). One test binary: each `tests/*.rs` is a separate link.
#[macro_use]
#[path = "../common/mod.rs"]
mod common;
mod fuzz_shrink;
mod fuzz_subnormals;
#[path = "../fuzz_support/mod.rs"]
mod fuzz_support;
mod ieee;
mod index_random_ops;
mod ops;
mod reductions;
