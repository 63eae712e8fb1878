//! Op-level differential fuzzing support, shared by `tests/fuzz_ops.rs`
//! (proptest, fixed seed in CI) and the cargo-fuzz target in `fuzz/`
//! (bytes through `arbitrary`), which includes this module by `#[path]`.
//!
//! - [`envelope`]: what the interpreter accepts per op (the tolerances);
//! - [`gen`]: genes (raw numbers, freely shrinkable) to well-typed programs;
//! - [`program`]: the program representation and its Rust printing;
//! - [`oracle`]: runs a program fused and unfused and checks every observed
//!   value against the reference interpreter (tolerances documented there);
//! - [`shrink`]: program-level shrinking of a failing program;
//! - [`values`]: deterministic shapes, dtypes and special values.
#![allow(dead_code, unused_imports)]

pub mod envelope;
pub mod gen;
pub mod oracle;
pub mod program;
pub mod shrink;
pub mod values;

pub use gen::{build, random_genes, Gene};
pub use oracle::check_program;
pub use program::{Program, Step};
pub use shrink::{shrink, shrink_program};
