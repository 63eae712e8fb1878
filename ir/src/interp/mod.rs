//! The reference interpreter: the executable definition of every op's
//! semantics, in plain Rust on [`HostTensor`]s. Backends are tested against it.
//!
//! Numeric rules shared by all ops:
//! - Float dtypes (f32, f64, bf16, f16) compute each element in f64 and round to
//!   nearest-even once per op output; reductions and matmul accumulate in f64
//!   in row-major order and round once at the end.
//! - Integer dtypes (i32, i64, u8) compute in wrapping i64 and keep the low bits
//!   of the result; bool is 0/1.
//! - NaN propagates through `maximum`/`minimum`/`max`/`min`, and
//!   `max(-0.0, +0.0)` is `+0.0` (`min` gives `-0.0`), as IEEE 754-2019 `maximum`.
//!   `relu(x)` is `maximum(x, 0)`.
//! - Layout ops (reshape, permute, broadcast, slice, concat, select) copy element
//!   bytes, so they are bit-exact for every dtype; float `neg`/`abs` flip or
//!   clear the sign bit (subnormals are kept, NaN payloads too).
//!
//! Per-op details are documented on the (private) functions of the
//! `elementwise`, `index`, `layout` and `reduce` submodules.

mod conv;
mod elementwise;
mod index;
mod layout;
mod reduce;

pub use elementwise::scalar_constant;
pub use index::{mix32, random_bits};

use crate::{infer, Graph, HostTensor, InferError, NodeId, Op, Operand};
use smallvec::SmallVec;
use std::collections::HashMap;

fn err<T>(msg: impl Into<String>) -> Result<T, InferError> {
    Err(InferError(msg.into()))
}

/// Checks that a tensor's byte buffer holds exactly `numel` elements of its dtype.
fn check_bytes(t: &HostTensor) -> Result<(), InferError> {
    let want = t.numel() * t.dtype.size_in_bytes();
    if t.bytes.len() != want {
        return err(format!(
            "host tensor {} {} has {} bytes, expected {want}",
            t.dtype,
            t.shape,
            t.bytes.len()
        ));
    }
    Ok(())
}

/// Evaluates one op on host operands. The call is validated with [`crate::infer`]
/// first, so an invalid op/operand combination (or a malformed tensor) is an
/// `Err`, never a panic. `Op::Input` has no value of its own and is an `Err`
/// (graph inputs come from the map given to [`eval_graph`]).
pub fn eval_op(op: &Op, inputs: &[&HostTensor]) -> Result<HostTensor, InferError> {
    if op.is_input() {
        return err("an input node has no value of its own; pass it to eval_graph");
    }
    for t in inputs {
        check_bytes(t)?;
    }
    let operands: SmallVec<[Operand<'_>; 3]> = inputs.iter().map(|t| (&t.shape, t.dtype)).collect();
    let (shape, dtype) = infer(op, &operands)?;
    let x = || inputs[0];
    let out = match op {
        Op::Input { .. } => unreachable!("handled above"),
        Op::Constant { value, dtype, .. } => elementwise::constant(*value, &shape, *dtype),
        Op::Arange {
            start,
            step,
            len,
            dtype,
        } => elementwise::arange(*start, *step, *len, *dtype),
        Op::Unary(u) => elementwise::unary(*u, x()),
        Op::Binary(b) => elementwise::binary(*b, x(), inputs[1], shape.clone()),
        Op::Compare(c) => elementwise::compare_op(*c, x(), inputs[1], shape.clone()),
        Op::Select => layout::select(x(), inputs[1], inputs[2], shape.clone()),
        Op::Convert(to) => elementwise::convert(x(), *to),
        Op::Reduce { op, axes, .. } => reduce::reduce(*op, x(), axes, shape.clone()),
        Op::ArgMax { axis, .. } => reduce::argmax(x(), *axis, shape.clone()),
        Op::Reshape(_) => layout::reshape(x(), &shape),
        Op::Permute(perm) => layout::permute(x(), perm),
        Op::Reverse(axes) => layout::reverse(x(), axes),
        Op::BroadcastTo(_) => layout::broadcast_to(x(), &shape),
        Op::ShardingConstraint(_) => x().clone(),
        Op::Slice { axis, start, len } => layout::slice(x(), *axis, *start, *len),
        Op::Concat { axis } => layout::concat(inputs, *axis, shape.clone()),
        Op::DynamicSlice { axis, len } => layout::dynamic_slice(x(), inputs[1], *axis, *len),
        Op::DynamicUpdateSlice { axis } => {
            layout::dynamic_update_slice(x(), inputs[1], inputs[2], *axis)
        }
        Op::MatMul => reduce::matmul(x(), inputs[1], shape.clone()),
        Op::Conv(spec) => conv::conv(spec, x(), inputs[1], shape.clone()),
        Op::IndexSelect { axis } => index::index_select(x(), inputs[1], *axis, shape.clone()),
        Op::ScatterAdd { axis } => index::scatter_add(x(), inputs[1], inputs[2], *axis),
        Op::RandomUniform { dtype, .. } => index::random_uniform(x(), shape.clone(), *dtype),
        Op::Custom(k) => host_kernel(k, inputs)?,
    };
    debug_assert_eq!(
        (&out.shape, out.dtype),
        (&shape, dtype),
        "{} result type",
        op.name()
    );
    debug_assert_eq!(out.bytes.len(), shape.numel() * dtype.size_in_bytes());
    Ok(out)
}

/// Runs a host kernel on the operands (copied into aligned buffers, so the
/// kernel can view them in place); a StableHLO kernel is an `Err`.
fn host_kernel(k: &crate::CustomKernel, inputs: &[&HostTensor]) -> Result<HostTensor, InferError> {
    let Some(f) = k.host() else {
        return err(format!(
            "custom kernel {} is StableHLO, which the reference interpreter cannot run (use an XLA device)",
            k.name
        ));
    };
    // u64 words: aligned for every dtype.
    let aligned = |n: usize| vec![0u64; n.div_ceil(8)];
    let held: Vec<Vec<u64>> = inputs
        .iter()
        .map(|t| {
            let mut w = aligned(t.bytes.len());
            bytes_of_mut(&mut w)[..t.bytes.len()].copy_from_slice(&t.bytes);
            w
        })
        .collect();
    let dims: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape.dims().to_vec()).collect();
    let args: Vec<crate::HostArg<'_>> = inputs
        .iter()
        .zip(&held)
        .zip(&dims)
        .map(|((t, w), d)| crate::HostArg {
            dtype: t.dtype,
            dims: d,
            bytes: &bytes_of(w)[..t.bytes.len()],
        })
        .collect();
    let (shape, dtype) = k.result.clone();
    let n = shape.numel() * dtype.size_in_bytes();
    let mut out = aligned(n);
    let out_dims = shape.dims().to_vec();
    let mut res = crate::HostOut {
        dtype,
        dims: &out_dims,
        bytes: &mut bytes_of_mut(&mut out)[..n],
    };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f.call(&args, &mut res)))
        .unwrap_or_else(|_| Err("the host kernel panicked".into()))
        .map_err(|e| InferError(format!("host kernel {}: {e}", k.name)))?;
    Ok(HostTensor {
        shape,
        dtype,
        bytes: bytes_of(&out)[..n].to_vec(),
    })
}

fn bytes_of(w: &[u64]) -> &[u8] {
    // SAFETY: u8 has no alignment or validity requirement; the length
    // covers exactly the words' bytes.
    unsafe { std::slice::from_raw_parts(w.as_ptr().cast::<u8>(), std::mem::size_of_val(w)) }
}

fn bytes_of_mut(w: &mut [u64]) -> &mut [u8] {
    // SAFETY: as in `bytes_of`, borrowed mutably.
    unsafe { std::slice::from_raw_parts_mut(w.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(w)) }
}

/// Evaluates the nodes of `graph` that `outputs` depend on (and no others), in
/// topological order, and returns the values of `outputs` in order (repeats
/// allowed). Each `Op::Input` node takes its value from `inputs`; a missing
/// value or one whose shape/dtype differs from the node's is an `Err`, as is an
/// unknown output id. Intermediate values are dropped after their last use.
pub fn eval_graph(
    graph: &Graph,
    inputs: &HashMap<NodeId, HostTensor>,
    outputs: &[NodeId],
) -> Result<Vec<HostTensor>, InferError> {
    let n = graph.len();
    // Mark what the outputs need and count the remaining uses of every value.
    let mut needed = vec![false; n];
    let mut uses = vec![0usize; n];
    let mut stack = Vec::with_capacity(outputs.len());
    for &o in outputs {
        if o.index() >= n {
            return err(format!(
                "output {o:?} is not a node of this graph ({n} nodes)"
            ));
        }
        uses[o.index()] += 1;
        stack.push(o);
    }
    while let Some(id) = stack.pop() {
        if std::mem::replace(&mut needed[id.index()], true) {
            continue;
        }
        for &i in &graph.node(id).inputs {
            uses[i.index()] += 1;
            stack.push(i);
        }
    }

    let mut values: Vec<Option<HostTensor>> = vec![None; n];
    for id in graph.ids().filter(|id| needed[id.index()]) {
        let node = graph.node(id);
        let value = if node.op.is_input() {
            let v = inputs
                .get(&id)
                .ok_or_else(|| InferError(format!("no value given for input node {id:?}")))?;
            check_bytes(v)?;
            v.clone()
        } else {
            let operands: SmallVec<[&HostTensor; 3]> = node
                .inputs
                .iter()
                .map(|i| {
                    values[i.index()]
                        .as_ref()
                        .expect("operands precede their users")
                })
                .collect();
            eval_op(&node.op, &operands).map_err(|e| {
                InferError(format!(
                    "node {id:?} ({}) recorded at {}: {}",
                    node.op.name(),
                    node.origin,
                    e.0
                ))
            })?
        };
        if value.shape != node.shape || value.dtype != node.dtype {
            return err(format!(
                "node {id:?} ({}) has type {} {} but its value is {} {}",
                node.op.name(),
                node.dtype,
                node.shape,
                value.dtype,
                value.shape
            ));
        }
        for &i in &node.inputs {
            uses[i.index()] -= 1;
            if uses[i.index()] == 0 {
                values[i.index()] = None;
            }
        }
        values[id.index()] = Some(value);
    }

    let mut results = Vec::with_capacity(outputs.len());
    for &o in outputs {
        uses[o.index()] -= 1;
        let slot = &mut values[o.index()];
        results.push(
            if uses[o.index()] == 0 {
                slot.take()
            } else {
                slot.clone()
            }
            .expect("outputs are evaluated"),
        );
    }
    Ok(results)
}
