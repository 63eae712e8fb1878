//! Reverse-mode automatic differentiation on lazy tensors.
//!
//! Strategy: every op already goes through one recording path
//! (`Tensor::apply_args`), so autograd hooks in there. When grad mode is on and
//! an operand requires grad, the output gets a [`Meta::Node`] holding the IR
//! [`Op`], handles to its operands and a weak handle to itself. The gradient
//! of each op is a rule on that IR op ([`rules`]), not on API methods, so
//! every composite (softmax, layer norm, attention, ...) is differentiable as
//! soon as its primitives are. Gradients are ordinary recorded tensor ops:
//! the backward pass lands in the same graph as the forward pass and fuses
//! with it. [`Tensor::backward`] does not wait: the gradients stay pending,
//! so forward, backward and the optimizer update (which syncs) run as one
//! fused executable.
//!
//! Tensors that do not take part pay one `OnceLock` load per operand when
//! recorded. Leaves are marked with [`Tensor::set_requires_grad`] and
//! accumulate into [`Tensor::grad`] across backward calls until zeroed.
//! Backward ops are recorded under [`no_grad`] (no higher-order gradients).

mod backward;
mod conv;
pub(crate) mod custom;
#[cfg(feature = "xla")]
mod ragged;
mod rules;
mod vjp;

pub use vjp::vjp;

use crate::lazy::TensorInner;
use crate::tensor::{Arg, Tensor};
use crate::{Error, Result};
use lazyfuse_ir::Origin;
use lazyfuse_ir::{DType, Literal, Op};
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

/// Autograd state of one tensor.
pub(crate) enum Meta {
    /// A user-created tensor whose gradient is accumulated in `grad`.
    Leaf {
        requires: AtomicBool,
        grad: Mutex<Option<Tensor>>,
    },
    /// The result of a recorded op on tensors that require grad.
    Node(GradNode),
}

/// How a tracked tensor was computed.
pub(crate) struct GradNode {
    op: Op,
    /// The operands; `None` once a backward pass has released them (so the
    /// forward intermediates need not be materialised at the next flush).
    inputs: Mutex<Option<SmallVec<[Saved; 3]>>>,
    /// The output itself, weak to avoid a cycle through its own `Meta`.
    out: Weak<TensorInner>,
    origin: Origin,
}

/// A recorded operand.
#[derive(Clone)]
enum Saved {
    T(Tensor),
    Scalar(Literal, DType),
}

thread_local! {
    static NO_GRAD_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Whether ops recorded on this thread are tracked for autograd (not inside
/// [`no_grad`] or a [`NoGradGuard`]).
pub fn is_grad_enabled() -> bool {
    NO_GRAD_DEPTH.with(|d| d.get() == 0)
}

/// Disables gradient tracking on this thread until dropped (nestable):
/// optimizer updates and evaluation record plain ops.
#[must_use = "tracking resumes when the guard is dropped"]
pub struct NoGradGuard(());

impl NoGradGuard {
    /// Starts a no-grad scope.
    pub fn new() -> Self {
        NO_GRAD_DEPTH.with(|d| d.set(d.get() + 1));
        NoGradGuard(())
    }
}

impl Default for NoGradGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        NO_GRAD_DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// Runs `f` with gradient tracking off on this thread.
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _g = NoGradGuard::new();
    f()
}

fn meta(t: &Tensor) -> Option<&Meta> {
    t.0.autograd().and_then(|m| m.downcast_ref::<Meta>())
}

/// [`meta`] as a shared handle (the backward pass keys nodes by it).
fn meta_arc(t: &Tensor) -> Option<Arc<Meta>> {
    t.0.autograd()
        .cloned()
        .and_then(|m| m.downcast::<Meta>().ok())
}

fn requires(t: &Tensor) -> bool {
    match meta(t) {
        None => false,
        Some(Meta::Leaf { requires, .. }) => requires.load(Ordering::Relaxed),
        Some(Meta::Node(_)) => true,
    }
}

/// True when recording `args` must attach a grad node.
fn tracks(args: &[Arg<'_>]) -> bool {
    let any = args.iter().any(|a| matches!(a, Arg::T(t) if requires(t)));
    any && is_grad_enabled()
}

/// The tape hook the tensor layer calls after recording an op on operands
/// with autograd state: attaches the op's grad node when it is tracked.
fn tape(op: Op, args: &[Arg<'_>], out: &Tensor, origin: Origin) {
    if tracks(args) {
        attach(op, args, out, origin);
    }
}

/// Attaches the grad node of `op` on `args` to the freshly recorded `out`.
fn attach(op: Op, args: &[Arg<'_>], out: &Tensor, origin: Origin) {
    if !out.dtype().is_float() {
        return; // comparisons, argmax, indices: nothing flows back
    }
    let inputs = args
        .iter()
        .map(|a| match a {
            Arg::T(t) => Saved::T((*t).clone()),
            Arg::Scalar(l, d) => Saved::Scalar(*l, *d),
        })
        .collect();
    let node = GradNode {
        op,
        inputs: Mutex::new(Some(inputs)),
        out: Arc::downgrade(&out.0),
        origin,
    };
    let _ = out.0.autograd_slot().set(Arc::new(Meta::Node(node)));
}

impl Tensor {
    /// Marks a leaf tensor as a variable whose gradient [`Tensor::backward`]
    /// accumulates into [`Tensor::grad`] (or unmarks it). Needs a float dtype;
    /// results of tracked ops already require grad and cannot be changed.
    #[track_caller]
    pub fn set_requires_grad(&self, on: bool) -> Result<()> {
        let loc = crate::site::caller();
        if !self.dtype().is_float() {
            return Err(Error::op(
                "set_requires_grad",
                "only float tensors can require grad",
                self.describe(),
                loc,
            ));
        }
        crate::tensor::install_tape(tape);
        let m = self.0.autograd_slot().get_or_init(|| {
            Arc::new(Meta::Leaf {
                requires: AtomicBool::new(on),
                grad: Mutex::new(None),
            })
        });
        match m.downcast_ref::<Meta>() {
            None => Err(Error::internal("foreign autograd state")),
            Some(Meta::Leaf { requires, .. }) => {
                requires.store(on, Ordering::Relaxed);
                Ok(())
            }
            Some(Meta::Node(_)) => Err(Error::op(
                "set_requires_grad",
                "not a leaf: this tensor is computed from tensors that require grad (use detach())",
                self.describe(),
                loc,
            )),
        }
    }

    /// Builder form of [`Tensor::set_requires_grad`]`(true)`.
    #[track_caller]
    pub fn with_grad(self) -> Result<Tensor> {
        self.set_requires_grad(true)?;
        Ok(self)
    }

    /// Whether gradients flow to or through this tensor.
    pub fn requires_grad(&self) -> bool {
        requires(self)
    }

    /// True unless this tensor was computed by a tracked op.
    pub fn is_leaf(&self) -> bool {
        !matches!(meta(self), Some(Meta::Node(_)))
    }

    /// The gradient accumulated in this leaf by backward passes, if any.
    pub fn grad(&self) -> Option<Tensor> {
        match meta(self) {
            Some(Meta::Leaf { grad, .. }) => grad.lock().clone(),
            _ => None,
        }
    }

    /// Replaces (or with `None` clears) the accumulated gradient of a leaf.
    pub fn set_grad(&self, g: Option<Tensor>) {
        if let Some(Meta::Leaf { grad, .. }) = meta(self) {
            *grad.lock() = g;
        }
    }

    /// Clears the accumulated gradient (the next backward starts from zero).
    pub fn zero_grad(&self) {
        self.set_grad(None);
    }

    /// The same value cut off from autograd: a fresh leaf that does not
    /// require grad. A materialised tensor shares its buffer; a pending one is
    /// an identity node, which costs nothing once fused.
    #[track_caller]
    pub fn detach(&self) -> Result<Tensor> {
        self.stop_gradient(crate::site::caller())
    }

    /// Computes the gradient of this one-element float tensor with respect
    /// to every leaf that requires grad, adding it to their [`Tensor::grad`].
    /// The backward ops are recorded into the same graph as the forward ones
    /// and stay pending (reading a gradient flushes as usual), so forward,
    /// backward and an optimizer update run as one fused graph. The recorded graph is released (a second backward through
    /// it is an `Err`; see [`Tensor::backward_retain_graph`]).
    #[track_caller]
    pub fn backward(&self) -> Result<()> {
        backward::run(self, false, crate::site::caller())
    }

    /// Like [`Tensor::backward`], keeping the recorded graph for another pass.
    #[track_caller]
    pub fn backward_retain_graph(&self) -> Result<()> {
        backward::run(self, true, crate::site::caller())
    }
}
