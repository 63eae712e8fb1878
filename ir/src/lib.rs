//! # lazyfuse-ir
//!
//! The intermediate representation of lazyfuse, independent of any backend:
//! element types, shapes, the closed [`Op`] set, shape/dtype inference (the one
//! place that decides what is a valid call), the recorded [`Graph`] with
//! structural hashes, and the reference interpreter ([`interp`]) that is the
//! executable definition of every op's semantics. Nothing here knows about XLA.
//!
//! Also here, for every crate of the workspace: [`SplitMix64`], the one
//! deterministic random stream (test data, example data, seeds), and, with
//! the `test-util` feature, the shared test helpers in `testutil`.

#![warn(missing_docs)]

mod conv;
mod custom;
mod dtype;
mod graph;
mod host;
mod infer;
pub mod interp;
mod op;
mod origin;
mod rng;
mod scatter;
mod shape;
#[cfg(feature = "test-util")]
pub mod testutil;

pub use conv::{ConvSpec, Spatial};
pub use custom::registry as host_kernels;
pub use custom::{CustomKernel, HostArg, HostElement, HostFn, HostKernelFn, HostOut, KernelBody};
pub use dtype::{DType, Element};
pub use graph::{node_hash, stable_hasher, Graph, Inputs, Node, NodeId};
pub use host::HostTensor;
pub use infer::{
    check_literal, infer, normalize_axes, normalize_axis, reduced_shape, InferError, Operand,
};
pub use op::{Axes, BinaryOp, CmpOp, Literal, Op, ReduceOp, SplitAxes, UnaryOp};
pub use origin::{Origin, SiteInfo};
pub use rng::{splitmix64, SplitMix64};
pub use shape::Shape;
