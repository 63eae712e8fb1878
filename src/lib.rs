//! # lazyfuse
//!
//! Eager tensor semantics with fused-kernel speed. Every op on a [`Tensor`] is
//! validated at the call site and recorded into the calling thread's graph; at
//! a sync point (`to_vec`, `item`, `realize`, [`sync`], `Display`) the graph is
//! cut into fused regions, each lowered to StableHLO, compiled by XLA through
//! its PJRT plugin (cached by a canonical key) and run on the device.
//!
//! ```no_run
//! use lazyfuse::{Device, Tensor, DType};
//! # fn main() -> lazyfuse::Result<()> {
//! let dev = Device::cpu()?;
//! let x = Tensor::arange(0.0, 6.0, DType::F32, &dev)?.reshape(&[2, 3])?;
//! let y = (x.exp()? * 2.0)?.sum(&[-1], false)?; // recorded, not run
//! println!("{y}");                               // flush: one fused region
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

// The layers, top to bottom (a module only names modules below it):
//   nn, optim -> autograd -> tensor -> lazy -> device -> executor -> runtime
//   -> backend -> persist, dump; with the leaves error, config, metrics,
//   explain and exit, and the crates below: lazyfuse-xla (feature `xla`:
//   the PJRT binding, plugin provisioning, StableHLO lowering), which the
//   backend and device layers drive, then fusion and ir.
pub mod autograd;
mod backend;
// Parts used only by the XLA backend are dead without it.
#[cfg_attr(not(feature = "xla"), allow(dead_code))]
mod config;
pub mod custom;
mod device;
// Parts used only by the XLA backend are dead without it.
#[cfg_attr(not(feature = "xla"), allow(dead_code))]
mod dump;
mod error;
mod executor;
mod exit;
pub mod explain;
mod lazy;
pub mod metrics;
pub mod nn;
pub mod optim;
#[cfg(feature = "xla")]
mod persist;
mod random;
mod runtime;
mod site;
mod spmd;
mod tensor;
#[doc(hidden)]
#[cfg_attr(not(feature = "xla"), allow(dead_code))]
pub mod testing;

pub use autograd::{is_grad_enabled, no_grad, NoGradGuard};
pub use config::{
    auto_dynamic, fusion_enabled, launch_blocking, max_executables, max_pending_ops,
    poison_padding, set_auto_dynamic, set_max_executables, set_max_pending_ops, set_poison_padding,
    Buckets,
};
pub use device::Device;
pub use error::{Error, Result};
pub use lazy::{pending_ops, plan_of, FlushPlan, FusionGuard, RegionPlan};
pub use lazyfuse_ir::{DType, Element, HostTensor, Origin, Shape};
#[cfg(feature = "xla")]
pub use lazyfuse_xla::pjrt::{InMemoryKeyValueStore, KeyValueStore};
#[cfg(feature = "xla")]
pub use lazyfuse_xla::plugin::cuda::CudaOptions;
#[cfg(feature = "xla")]
pub use lazyfuse_xla::plugin::{CpuOptions, Distributed};
pub use random::Key;
pub use site::with_origin;
pub use spmd::{Mesh, MeshDevices, Sharding};
pub use tensor::dynamic::sites::reset_dynamic_sites;
pub use tensor::{flush, realize_all, sync, Dims, HostView, Local, Operand, Reduction, Tensor};

/// The IR and planner crates, for tools that inspect graphs and plans.
pub use lazyfuse_fusion as fusion;
pub use lazyfuse_ir as ir;
/// The XLA backend crate (the PJRT binding, plugin provisioning and the
/// StableHLO lowering), for tools that drive PJRT or provision plugins.
#[cfg(feature = "xla")]
pub use lazyfuse_xla as xla;
