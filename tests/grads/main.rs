//! Autograd: the tape and its rules (`autograd`), finite-difference
//! gradient checks of every differentiable op (`grad_check`) and training
//! loops (`training`). One test binary: each `tests/*.rs` is a separate
//! link.
#[macro_use]
#[path = "../common/mod.rs"]
mod common;
mod autograd;
mod grad_check;
mod training;
