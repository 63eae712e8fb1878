//! # lazyfuse-fusion
//!
//! Pure graph-to-plan logic: given a flushed [`Graph`](lazyfuse_ir::Graph)
//! and the nodes that live tensors still hold, decide which nodes to compute
//! and how to cut them into regions, each compiled and run as one XLA
//! executable. Nothing here knows about XLA; every decision is deterministic
//! (no timing, no thread state), so it can be pinned by golden tests and
//! region counts.
//!
//! Strategy: prune everything no live tensor needs; turn rank-0 host scalars
//! into region parameters (scalar lifting: a changing learning rate never
//! recompiles); cut loop bodies recorded several times in a row into one
//! region per repetition (one cached executable); pack the rest into as few
//! regions as the compile-cost cap allows. With fusion off, one region per op.
//! Other constants are cloned into each region that uses them instead of being
//! computed on their own. Region keys are canonical (see [`RegionKey`]).

#![warn(missing_docs)]

mod key;
mod plan;
mod repeat;
mod reuse;
mod signature;

pub use key::RegionKey;
pub use plan::{plan, plan_with_donation, Plan, PlanOptions, Region, ScalarPack};
pub use repeat::{find_repeats, Repeat, RepeatOptions};
pub use reuse::PlanCache;
pub use signature::{
    describe, primary_cause, summarize, Cause, Description, Difference, NodeDescription, Signature,
};
