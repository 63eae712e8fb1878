//! # lazyfuse-fusion
//!
//! Pure graph-to-plan logic: given a flushed [`Graph`] and the nodes that live
//! tensors still hold, decide which nodes to compute and how to cut them into
//! regions, each compiled and run as one XLA executable. Nothing here knows
//! about XLA; every decision is deterministic (no timing, no thread state), so
//! it can be pinned by golden tests and region counts.
//!
//! Strategy today: prune everything no live tensor needs; with fusion on, put
//! the rest into as few regions as the size cap allows; with fusion off, one
//! region per op. Splat constants are cloned into each region that uses them
//! instead of being computed on their own, so a scalar operand never costs a
//! separate execution.

mod key;
mod plan;

pub use key::RegionKey;
pub use plan::{plan, Plan, PlanOptions, Region};
