//! The convolution and `flip`: IR ops that map one to one onto StableHLO's
//! `convolution` and `reverse`.

use super::emit::{i64_array, ty, Emitter};
use lazyfuse_ir::{ConvSpec, Literal, Node, Shape};

/// Operand `k` of `node`: its SSA value and its node.
fn operand<'g>(e: &Emitter<'g>, node: &Node, k: usize) -> (String, &'g Node) {
    let id = node.inputs[k];
    (e.value(id), e.graph.node(id))
}

/// `stablehlo.convolution` in the IR's channels-first layout. A kernel with
/// no taps or no input channels sums nothing: zeros, without asking XLA
/// (its CPU emitters divide by those sizes).
///
/// The padding of an axis with a negative side (a crop) is done first, by
/// a `stablehlo.pad` of its own (with the input dilation of that axis as
/// interior padding, which comes before padding in the convolution's
/// definition), so the convolution itself never crops: XLA's CPU
/// convolutions, old and new plugin alike, computed wrong values when one
/// side of an axis was cropped and the other padded
/// (`tests/fuzz_regressions/conv.rs::conv_with_negative_padding_crops_its_input`).
pub(super) fn conv(e: &mut Emitter<'_>, node: &Node, spec: &ConvSpec) -> String {
    let (mut x, xn) = operand(e, node, 0);
    let (w, wn) = operand(e, node, 1);
    if wn.shape.numel() == 0 {
        return e.constant(Literal::Int(0), &node.shape, node.dtype);
    }
    let mut x_shape = xn.shape.clone();
    let mut lhs_dilation = spec.lhs_dilation.clone();
    let mut padding = spec.padding.clone();
    if padding.iter().any(|&(lo, hi)| lo < 0 || hi < 0) {
        (x, x_shape) = crop(e, &x, &xn.shape, xn.dtype, &mut lhs_dilation, &mut padding);
    }
    let d = spec.spatial_rank();
    let sp = (0..d).map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
    let pads = padding
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
        i64_array(lhs_dilation.iter().copied()),
        i64_array(spec.rhs_dilation.iter().copied()),
        i64_array(spec.stride.iter().copied()),
    );
    e.op(
        "stablehlo.convolution",
        &[(&x, ty(&x_shape, xn.dtype)), (&w, ty(&wn.shape, wn.dtype))],
        &attrs,
        &ty(&node.shape, node.dtype),
    )
}

/// The input `x` (channels-first) padded as the convolution would pad it
/// on every axis with a negative padding, with the input dilation of those
/// axes as interior padding: one `stablehlo.pad` (whose edges may be
/// negative and may crop into the other side's padding, as on an empty
/// axis), after which `padding` and `lhs_dilation` are left with what the
/// convolution still does there: nothing (padding 0, dilation 1).
fn crop(
    e: &mut Emitter<'_>,
    x: &str,
    shape: &Shape,
    dtype: lazyfuse_ir::DType,
    lhs_dilation: &mut lazyfuse_ir::Spatial<usize>,
    padding: &mut lazyfuse_ir::Spatial<(i64, i64)>,
) -> (String, Shape) {
    let rank = shape.rank();
    let (mut low, mut high, mut interior) = (vec![0i64; rank], vec![0i64; rank], vec![0i64; rank]);
    let mut dims = shape.dims().to_vec();
    for (i, (pad, dil)) in padding.iter_mut().zip(lhs_dilation.iter_mut()).enumerate() {
        if pad.0 >= 0 && pad.1 >= 0 {
            continue;
        }
        let a = i + 2;
        interior[a] = *dil as i64 - 1;
        (low[a], high[a]) = *pad;
        let dilated = if dims[a] == 0 {
            0
        } else {
            (dims[a] as i64 - 1) * *dil as i64 + 1
        };
        dims[a] = (dilated + low[a] + high[a]).max(0) as usize;
        *pad = (0, 0);
        *dil = 1;
    }
    let out = Shape::new(&dims);
    let zero = e.constant(Literal::Int(0), &Shape::scalar(), dtype);
    let attrs = format!(
        "edge_padding_high = {}, edge_padding_low = {}, interior_padding = {}",
        i64_array(high),
        i64_array(low),
        i64_array(interior)
    );
    let v = e.op(
        "stablehlo.pad",
        &[(x, ty(shape, dtype)), (&zero, ty(&Shape::scalar(), dtype))],
        &attrs,
        &ty(&out, dtype),
    );
    (v, out)
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
