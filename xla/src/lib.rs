//! # lazyfuse-xla
//!
//! lazyfuse's XLA backend, kept out of the core so the core (recording,
//! planning, autograd, `nn`, `optim`) builds and tests with no plugin and no
//! XLA code at all. Three parts:
//!
//! - [`pjrt`]: a small, safe binding to the PJRT C API (generated from the
//!   plugin's `pjrt_c_api.h`): plugins, clients, buffers, executables,
//!   completion events, compile options;
//! - [`plugin`]: finding and provisioning plugins: the pinned CPU wheel
//!   from PyPI, the CUDA plugin and NVIDIA's libraries, multi-process setup;
//! - [`lower`]: one fused region of the IR as a StableHLO module (with
//!   Shardy shardings for SPMD programs);
//! - [`kernels`]: lazyfuse's own host kernels (grouped matrix products
//!   in Rust), which the CPU plugin calls where its own code is slow.
//!
//! It knows nothing of lazyfuse's tensors, graphs or executor: the core's
//! PJRT backend (behind its `Backend` seam, cargo feature `xla`) drives it.
//! Dependencies point down only: `lazyfuse-fusion` and `lazyfuse-ir`.

#![warn(missing_docs)]

pub mod env;
pub mod kernels;
pub mod lower;
pub mod pjrt;
pub mod plugin;
