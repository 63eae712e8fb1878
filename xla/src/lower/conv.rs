//! The convolution and `flip`: IR ops that map one to one onto StableHLO's
//! `convolution` and `reverse`.

use super::emit::{i64_array, ty, Emitter};
use lazyfuse_ir::{ConvSpec, Literal, Node};

/// Operand `k` of `node`: its SSA value and its node.
fn operand<'g>(e: &Emitter<'g>, node: &Node, k: usize) -> (String, &'g Node) {
    let id = node.inputs[k];
    (e.value(id), e.graph.node(id))
}

/// `stablehlo.convolution` in the IR's channels-first layout. A kernel with
/// no taps or no input channels sums nothing: zeros, without asking XLA
/// (its CPU emitters divide by those sizes).
pub(super) fn conv(e: &mut Emitter<'_>, node: &Node, spec: &ConvSpec) -> String {
    let (x, xn) = operand(e, node, 0);
    let (w, wn) = operand(e, node, 1);
    if wn.shape.numel() == 0 {
        return e.constant(Literal::Int(0), &node.shape, node.dtype);
    }
    let d = spec.spatial_rank();
    let sp = (0..d).map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
    let pads = spec
        .padding
        .iter()
        .map(|(lo, hi)| format!("[{lo}, {hi}]"))
        .collect::<Vec<_>>()
        .join(", ");
    let attrs = format!(
        "batch_group_count = {} : i64, dimension_numbers = #stablehlo.conv<[b, f, {sp}]x[o, i, {sp}]->[b, f, {sp}]>, \
         feature_group_count = {} : i64, lhs_dilation = {}, padding = dense<[{pads}]> : tensor<{d}x2xi64>, \
         rhs_dilation = {}, window_strides = {}",
        spec.batch_groups,
        spec.feature_groups,
        i64_array(spec.lhs_dilation.iter().copied()),
        i64_array(spec.rhs_dilation.iter().copied()),
        i64_array(spec.stride.iter().copied()),
    );
    e.op(
        "stablehlo.convolution",
        &[(&x, ty(&xn.shape, xn.dtype)), (&w, ty(&wn.shape, wn.dtype))],
        &attrs,
        &ty(&node.shape, node.dtype),
    )
}

/// `stablehlo.reverse` of operand 0 along `axes`.
pub(super) fn reverse(e: &mut Emitter<'_>, node: &Node, axes: &[usize]) -> String {
    let (x, xn) = operand(e, node, 0);
    if axes.is_empty() {
        return x;
    }
    let attr = format!("dimensions = {}", i64_array(axes.iter().copied()));
    let t = ty(&xn.shape, xn.dtype);
    e.op("stablehlo.reverse", &[(&x, t.clone())], &attr, &t)
}
