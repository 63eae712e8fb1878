//! Elementwise expressions of constants alone, evaluated when lowering by
//! the reference interpreter, so that no compiler folds them.
//!
//! XLA's CPU code runs with subnormals flushed to zero, but LLVM folds an
//! expression of constants in IEEE arithmetic. `full(1e-40, f64)` converted
//! to bf16 folded to a bf16 subnormal where run-time code gives zero, so
//! `x / x` of it was `1` fused and NaN unfused (`fuzz_campaign` seed 1001,
//! program 5287; `tests/semantics/fuzz_subnormals.rs::
//! subnormals_folded_from_constants_are_flushed`). Folding such an
//! expression here, with the interpreter that defines every op, leaves the
//! compiler nothing to fold and gives the reference bits, fused or not.

use super::emit::Emitter;
use lazyfuse_ir::{interp, HostTensor, Literal, Node, NodeId, Op, Shape};
use smallvec::SmallVec;

/// When node `id`'s value is known at lowering time to be one scalar
/// repeated, records it; for an elementwise op of such values, also
/// returns the constant that replaces its code.
///
/// Constants are splats (a dimension literal, a run-time value, is not);
/// layout ops keep their operand's splat and are lowered as usual.
pub fn fold(e: &mut Emitter<'_>, id: NodeId) -> Option<String> {
    let node = e.graph.node(id);
    match &node.op {
        Op::Constant { value, dtype, .. } if !matches!(value, Literal::Dim(_)) => {
            e.set_splat(id, interp::scalar_constant(*value, *dtype));
            None
        }
        Op::Reshape(_)
        | Op::Permute(_)
        | Op::Reverse(_)
        | Op::BroadcastTo(_)
        | Op::ShardingConstraint(_)
        | Op::Slice { .. } => {
            if let Some(s) = e.splat(node.inputs[0]).cloned() {
                e.set_splat(id, s);
            }
            None
        }
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Convert(_) => {
            let value = evaluate(e, node)?;
            let v = e.host_constant(&value, &node.shape);
            e.set_splat(id, value);
            Some(v)
        }
        _ => None,
    }
}

/// The interpreter's value of elementwise `node` on its operands' splats,
/// rank 0; `None` when an operand is not a splat.
fn evaluate(e: &Emitter<'_>, node: &Node) -> Option<HostTensor> {
    let operands: SmallVec<[&HostTensor; 3]> = node
        .inputs
        .iter()
        .map(|&i| e.splat(i))
        .collect::<Option<_>>()?;
    let value = interp::eval_op(&node.op, &operands).ok()?;
    (value.shape == Shape::scalar()).then_some(value)
}
