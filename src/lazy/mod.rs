//! The lazy layer: per-thread graphs, recording, flushing, and the state of
//! every tensor's value. It is the one owner of that state machine:
//!
//! ```text
//! Pending (a node of a thread's graph) --flush--> InFlight (a queued job's latch)
//!     --job binds--> Ready (a device buffer) | Failed (the error)
//! ```
//!
//! A flush hands the graph to the device's executor and returns at once;
//! the executor binds results through the [`crate::executor::Slot`] seam,
//! which [`TensorInner`] implements, so the executor never names a tensor.
//! Nodes nobody holds are never materialised.

mod clock;
mod dry;
mod flush;
mod graph;
mod mode;
mod predict;
mod value;

pub(crate) use clock::sync_points;
pub use dry::{plan_of, FlushPlan, RegionPlan};
pub use graph::pending_ops;
pub(crate) use graph::{record, sync_thread, wait_thread_jobs, LazyArg};
pub use mode::FusionGuard;
pub(crate) use value::{materialize_all, Logical, TensorInner};
