//! Lowering of reductions (plain extrema, f32 accumulation for half
//! types), argmax (a variadic reduce with an associative tie-break) and
//! batched matmul (`dot_general`, with a single GEMM for shared 2-D weights).

use super::emit::{compare_attr, i64_array, ty, Emitter};
use super::leading::{extremum_tree, leading_extremum_as_tree, leading_sum_as_dot, sum_as_dot};
use lazyfuse_ir::{CmpOp, DType, Literal, NodeId, ReduceOp, Shape};
use std::fmt::Write;

/// Reduction `op` of `x` (shape `in_shape`, dtype `dt`) over `axes`, as one
/// `stablehlo.reduce` (f32 accumulation for half-precision sums, a division
/// for `mean`, a reshape to `out_shape` for `keepdim`).
///
/// A float `max`/`min` body is the plain `stablehlo.maximum`/`minimum`:
/// with XLA's fast min/max off (`xla/src/pjrt/options.rs`) XLA's CPU reduction
/// loops propagate NaN themselves (`tests/semantics/ieee.rs` checks every float dtype,
/// axis and NaN position), and only a plain body is vectorised. A body
/// that selected NaN operands explicitly ran as a scalar loop: a row max
/// of `[32, 128, 128]` took 1.55 ms against 0.05 ms for the row sum, and
/// softmax attention 4.0 ms against jax.jit's 1.3 ms.
#[allow(clippy::too_many_arguments)]
pub(super) fn reduce(
    e: &mut Emitter<'_>,
    op: ReduceOp,
    x: &str,
    in_shape: &Shape,
    axes: &[usize],
    keepdim: bool,
    out_shape: &Shape,
    dt: DType,
) -> String {
    if axes.is_empty() {
        return x.to_string();
    }
    if e.spmd && dt.is_float() && matches!(op, ReduceOp::Max | ReduceOp::Min) {
        return spmd_extremum(e, op, x, in_shape, axes, keepdim, out_shape, dt);
    }
    reduce_body(e, op, x, in_shape, axes, keepdim, out_shape, dt)
}

/// Float sums over more elements than this run in stages (see
/// [`staged_sum`]).
const SPLIT_SUM: usize = 1 << 16;
/// The length of each stage of a [`staged_sum`].
const SPLIT_CHUNK: usize = 1024;

/// [`reduce`]'s `stablehlo.reduce`.
#[allow(clippy::too_many_arguments)]
fn reduce_body(
    e: &mut Emitter<'_>,
    op: ReduceOp,
    x: &str,
    in_shape: &Shape,
    axes: &[usize],
    keepdim: bool,
    out_shape: &Shape,
    dt: DType,
) -> String {
    // Half-precision sums accumulate in f32, as a serious runtime must.
    let acc =
        if matches!(dt, DType::BF16 | DType::F16) && matches!(op, ReduceOp::Sum | ReduceOp::Mean) {
            DType::F32
        } else {
            dt
        };
    let xin = e.convert(x, in_shape, dt, acc);
    let flat = lazyfuse_ir::reduced_shape(in_shape, axes, false);
    let count: usize = axes.iter().map(|&a| in_shape.dims()[a]).product();
    let contiguous = axes.windows(2).all(|w| w[1] == w[0] + 1);
    let long_sum = matches!(op, ReduceOp::Sum | ReduceOp::Mean) && acc.is_float();
    // Not in SPMD programs: reshaping a sharded axis into stages before
    // partitioning makes XLA gather it; there XLA's own tree reduction
    // rewriter runs on each device's share (`xla/src/pjrt/options.rs`).
    let r = if long_sum && count > SPLIT_SUM && contiguous && !e.spmd {
        staged_sum(e, &xin, in_shape, axes, acc)
    } else if long_sum && !e.spmd && leading_sum_as_dot(in_shape, axes) {
        sum_as_dot(e, &xin, in_shape, axes, acc)
    } else if !long_sum && !e.spmd && leading_extremum_as_tree(op, in_shape, axes) {
        extremum_tree(e, op, &xin, in_shape, axes, acc)
    } else {
        one_reduce(e, op, &xin, in_shape, axes, acc)
    };
    let mut v = r;
    if op == ReduceOp::Mean {
        let c = e.constant(Literal::Float(count as f64), &flat, acc);
        v = e.eltwise("stablehlo.divide", &[&v, &c], &flat, acc, acc);
    }
    let v = e.convert(&v, &flat, acc, dt);
    if keepdim {
        e.reshape(&v, &flat, out_shape, dt)
    } else {
        v
    }
}

/// One `stablehlo.reduce` of `xin` (`in_shape`, dtype `acc`) over `axes`.
fn one_reduce(
    e: &mut Emitter<'_>,
    op: ReduceOp,
    xin: &str,
    in_shape: &Shape,
    axes: &[usize],
    acc: DType,
) -> String {
    let flat = lazyfuse_ir::reduced_shape(in_shape, axes, false);
    let init = e.constant(op.identity(acc), &Shape::scalar(), acc);
    let body = match op {
        ReduceOp::Sum | ReduceOp::Mean => "stablehlo.add",
        ReduceOp::Max => "stablehlo.maximum",
        ReduceOp::Min => "stablehlo.minimum",
    };
    let r = e.fresh();
    let st = ty(&Shape::scalar(), acc);
    let _ = writeln!(
        e.body,
        "    {r} = \"stablehlo.reduce\"({xin}, {init}) ({{\n    ^bb0({r}a: {st}, {r}b: {st}):\n      {r}m = \"{body}\"({r}a, {r}b) : ({st}, {st}) -> {st}\n      \"stablehlo.return\"({r}m) : ({st}) -> ()\n    }}) {{dimensions = {}}} : ({}, {st}) -> {}",
        i64_array(axes.iter().copied()),
        ty(in_shape, acc),
        ty(&flat, acc)
    );
    r
}

/// A float sum over the contiguous `axes` of `x` in stages: the reduced
/// elements of each output, flattened and zero-padded to whole chunks of
/// [`SPLIT_CHUNK`], are summed per chunk, and so on until at most
/// [`SPLIT_CHUNK`] partial sums are left, which one reduce adds. XLA's CPU
/// backend would otherwise sum them in one loop (its tree reduction
/// rewriter is off, see `xla/src/pjrt/options.rs`), whose rounding error grows
/// with the length: a sum of 2^24 values was off by 3.4e-6 relative.
fn staged_sum(e: &mut Emitter<'_>, x: &str, shape: &Shape, axes: &[usize], acc: DType) -> String {
    let dims = shape.dims();
    let (lo, hi) = (axes[0], axes[axes.len() - 1] + 1);
    let outer: usize = dims[..lo].iter().product();
    let mut n: usize = dims[lo..hi].iter().product();
    let inner: usize = dims[hi..].iter().product();
    let mut s3 = Shape::new(&[outer, n, inner]);
    let mut v = e.reshape(x, shape, &s3, acc);
    while n > SPLIT_CHUNK {
        let chunks = n.div_ceil(SPLIT_CHUNK);
        let padded = Shape::new(&[outer, chunks * SPLIT_CHUNK, inner]);
        if padded != s3 {
            let zero = e.constant(Literal::Float(0.0), &Shape::scalar(), acc);
            let attrs = format!(
                "edge_padding_high = {}, edge_padding_low = {}, interior_padding = {}",
                i64_array([0, chunks * SPLIT_CHUNK - n, 0]),
                i64_array([0, 0, 0]),
                i64_array([0, 0, 0])
            );
            v = e.op(
                "stablehlo.pad",
                &[(&v, ty(&s3, acc)), (&zero, ty(&Shape::scalar(), acc))],
                &attrs,
                &ty(&padded, acc),
            );
        }
        let s4 = Shape::new(&[outer, chunks, SPLIT_CHUNK, inner]);
        let split = e.reshape(&v, &padded, &s4, acc);
        v = one_reduce(e, ReduceOp::Sum, &split, &s4, &[2], acc);
        n = chunks;
        s3 = Shape::new(&[outer, n, inner]);
    }
    let total = one_reduce(e, ReduceOp::Sum, &v, &s3, &[1], acc);
    let flat = lazyfuse_ir::reduced_shape(shape, axes, false);
    e.reshape(&total, &Shape::new(&[outer, inner]), &flat, acc)
}

/// A float max/min reduction in an SPMD program: the partitioner combines
/// the devices' partial extrema with an all-reduce, and NaN propagation is
/// not left to the collective's max: the plain extremum is replaced by NaN
/// where any reduced element is NaN (a count of NaNs, itself a plain sum,
/// which all-reduces exactly).
#[allow(clippy::too_many_arguments)]
fn spmd_extremum(
    e: &mut Emitter<'_>,
    op: ReduceOp,
    x: &str,
    in_shape: &Shape,
    axes: &[usize],
    keepdim: bool,
    out_shape: &Shape,
    dt: DType,
) -> String {
    let flat = lazyfuse_ir::reduced_shape(in_shape, axes, false);
    let plain = reduce_body(e, op, x, in_shape, axes, false, &flat, dt);
    let b = ty(in_shape, DType::Bool);
    let t = ty(in_shape, dt);
    let isnan = e.op(
        "stablehlo.compare",
        &[(x, t.clone()), (x, t)],
        &compare_attr(CmpOp::Ne, dt),
        &b,
    );
    let ones = e.convert(&isnan, in_shape, DType::Bool, DType::I32);
    let nans = reduce(
        e,
        ReduceOp::Sum,
        &ones,
        in_shape,
        axes,
        false,
        &flat,
        DType::I32,
    );
    let zero = e.constant(Literal::Int(0), &flat, DType::I32);
    let any = e.op(
        "stablehlo.compare",
        &[
            (&nans, ty(&flat, DType::I32)),
            (&zero, ty(&flat, DType::I32)),
        ],
        &compare_attr(CmpOp::Gt, DType::I32),
        &ty(&flat, DType::Bool),
    );
    let nan = e.constant(Literal::Float(f64::NAN), &flat, dt);
    let tf = ty(&flat, dt);
    let v = e.op(
        "stablehlo.select",
        &[
            (&any, ty(&flat, DType::Bool)),
            (&nan, tf.clone()),
            (&plain, tf.clone()),
        ],
        "",
        &tf,
    );
    if keepdim {
        e.reshape(&v, &flat, out_shape, dt)
    } else {
        v
    }
}

/// The i64 index of the first maximum of `x` along `axis` (NaN counts as
/// the maximum). Outside SPMD programs, two plain reductions that XLA
/// vectorises ([`argmax_two_pass`]); in them (and for bool or an empty
/// axis), a variadic reduce over values and an iota of indices.
pub(super) fn argmax(
    e: &mut Emitter<'_>,
    x: &str,
    in_shape: &Shape,
    dt: DType,
    axis: usize,
    out_shape: &Shape,
) -> String {
    if !e.spmd && dt != DType::Bool && in_shape.dims()[axis] > 0 {
        return argmax_two_pass(e, x, in_shape, dt, axis, out_shape);
    }
    argmax_variadic(e, x, in_shape, dt, axis, out_shape)
}

/// [`argmax`] as the maximum along `axis` (which is NaN where the axis
/// holds one), then the least index whose value equals it or is NaN. XLA
/// runs a variadic reduce as a scalar loop: over the rows of `[1024,
/// 1024]` it took 2.4 ms, jax.jit's 2.1. Equality is [`super::elementwise::compare`]'s,
/// which reads bf16 subnormals as zero like the maximum does.
fn argmax_two_pass(
    e: &mut Emitter<'_>,
    x: &str,
    in_shape: &Shape,
    dt: DType,
    axis: usize,
    out_shape: &Shape,
) -> String {
    let n = in_shape.dims()[axis];
    let flat = lazyfuse_ir::reduced_shape(in_shape, &[axis], false);
    let kept = lazyfuse_ir::reduced_shape(in_shape, &[axis], true);
    let m = one_reduce(e, ReduceOp::Max, x, in_shape, &[axis], dt);
    let m = e.reshape(&m, &flat, &kept, dt);
    let m = e.broadcast(&m, &kept, in_shape, dt);
    let mut hit = super::elementwise::compare(e, CmpOp::Eq, x, &m, in_shape, dt);
    if dt.is_float() {
        let nan = super::elementwise::compare(e, CmpOp::Ne, x, x, in_shape, dt);
        hit = e.eltwise(
            "stablehlo.or",
            &[&hit, &nan],
            in_shape,
            DType::Bool,
            DType::Bool,
        );
    }
    let idx = e.op(
        "stablehlo.iota",
        &[],
        &format!("iota_dimension = {axis} : i64"),
        &ty(in_shape, DType::I64),
    );
    let none = e.constant(Literal::Int(n as i64), in_shape, DType::I64);
    let t = ty(in_shape, DType::I64);
    let cand = e.op(
        "stablehlo.select",
        &[
            (&hit, ty(in_shape, DType::Bool)),
            (&idx, t.clone()),
            (&none, t.clone()),
        ],
        "",
        &t,
    );
    let first = one_reduce(e, ReduceOp::Min, &cand, in_shape, &[axis], DType::I64);
    e.reshape(&first, &flat, out_shape, DType::I64)
}

/// [`argmax`] as a variadic reduce over values and an iota of indices,
/// with an associative tie-break.
fn argmax_variadic(
    e: &mut Emitter<'_>,
    x: &str,
    in_shape: &Shape,
    dt: DType,
    axis: usize,
    out_shape: &Shape,
) -> String {
    let flat = lazyfuse_ir::reduced_shape(in_shape, &[axis], false);
    let idx = e.op(
        "stablehlo.iota",
        &[],
        &format!("iota_dimension = {axis} : i64"),
        &ty(in_shape, DType::I64),
    );
    let init_v = e.constant(ReduceOp::Max.identity(dt), &Shape::scalar(), dt);
    let init_i = e.constant(Literal::Int(0), &Shape::scalar(), DType::I64);
    let r = e.fresh();
    let sv = ty(&Shape::scalar(), dt);
    let si = ty(&Shape::scalar(), DType::I64);
    let b = argmax_combiner(&r, dt);
    let _ = writeln!(
        e.body,
        "    {r}:2 = \"stablehlo.reduce\"({x}, {idx}, {init_v}, {init_i}) ({{\n{b}    }}) {{dimensions = {}}} : ({}, {}, {sv}, {si}) -> ({}, {})",
        i64_array([axis]),
        ty(in_shape, dt),
        ty(in_shape, DType::I64),
        ty(&flat, dt),
        ty(&flat, DType::I64)
    );
    let v = format!("{r}#1");
    e.reshape(&v, &flat, out_shape, DType::I64)
}

/// The region of [`argmax_variadic`]'s reduce (its SSA names prefixed
/// with the reduce's result `r`): combines two (value, index) pairs, the
/// values of dtype `dt`, into the one argmax keeps.
fn argmax_combiner(r: &str, dt: DType) -> String {
    let sv = ty(&Shape::scalar(), dt);
    let si = ty(&Shape::scalar(), DType::I64);
    let sb = ty(&Shape::scalar(), DType::Bool);
    let cmp = |c: CmpOp, d: DType| compare_attr(c, d);
    // Pick a if: a is NaN and (b is not NaN or ai < bi); or neither is NaN and
    // (a > b or (a == b and ai < bi)). Associative and commutative, so XLA may
    // combine in any order.
    let mut b = String::new();
    let _ = writeln!(
        b,
        "    ^bb0({r}av: {sv}, {r}ai: {si}, {r}bv: {sv}, {r}bi: {si}):"
    );
    let mut line = |s: String| {
        let _ = writeln!(b, "      {s}");
    };
    line(format!(
        "{r}an = \"stablehlo.compare\"({r}av, {r}av) {{{}}} : ({sv}, {sv}) -> {sb}",
        cmp(CmpOp::Ne, dt)
    ));
    line(format!(
        "{r}bn = \"stablehlo.compare\"({r}bv, {r}bv) {{{}}} : ({sv}, {sv}) -> {sb}",
        cmp(CmpOp::Ne, dt)
    ));
    line(format!(
        "{r}gt = \"stablehlo.compare\"({r}av, {r}bv) {{{}}} : ({sv}, {sv}) -> {sb}",
        cmp(CmpOp::Gt, dt)
    ));
    line(format!(
        "{r}eq = \"stablehlo.compare\"({r}av, {r}bv) {{{}}} : ({sv}, {sv}) -> {sb}",
        cmp(CmpOp::Eq, dt)
    ));
    line(format!(
        "{r}lt = \"stablehlo.compare\"({r}ai, {r}bi) {{{}}} : ({si}, {si}) -> {sb}",
        cmp(CmpOp::Lt, DType::I64)
    ));
    line(format!(
        "{r}nbn = \"stablehlo.not\"({r}bn) : ({sb}) -> {sb}"
    ));
    line(format!(
        "{r}t1 = \"stablehlo.or\"({r}nbn, {r}lt) : ({sb}, {sb}) -> {sb}"
    ));
    line(format!(
        "{r}t2 = \"stablehlo.and\"({r}eq, {r}lt) : ({sb}, {sb}) -> {sb}"
    ));
    line(format!(
        "{r}t3 = \"stablehlo.or\"({r}gt, {r}t2) : ({sb}, {sb}) -> {sb}"
    ));
    line(format!(
        "{r}t4 = \"stablehlo.and\"({r}nbn, {r}t3) : ({sb}, {sb}) -> {sb}"
    ));
    line(format!(
        "{r}pick = \"stablehlo.select\"({r}an, {r}t1, {r}t4) : ({sb}, {sb}, {sb}) -> {sb}"
    ));
    line(format!(
        "{r}v = \"stablehlo.select\"({r}pick, {r}av, {r}bv) : ({sb}, {sv}, {sv}) -> {sv}"
    ));
    line(format!(
        "{r}i = \"stablehlo.select\"({r}pick, {r}ai, {r}bi) : ({sb}, {si}, {si}) -> {si}"
    ));
    line(format!(
        "\"stablehlo.return\"({r}v, {r}i) : ({sv}, {si}) -> ()"
    ));
    b
}

/// The `k` of a matmul node: the last dim of its first operand.
pub(super) fn contraction_len(e: &Emitter<'_>, node: &lazyfuse_ir::Node) -> usize {
    let a = &e.graph.node(node.inputs[0]).shape;
    a.dims()[a.rank() - 1]
}

/// The batched matrix product of node `id`'s operands as one `dot_general`.
pub(super) fn matmul(e: &mut Emitter<'_>, id: NodeId) -> String {
    let g = e.graph;
    let node = g.node(id);
    let (a, b) = (g.node(node.inputs[0]), g.node(node.inputs[1]));
    let out = &node.shape;
    let batch = &out.dims()[..out.rank() - 2];
    let full = |s: &Shape| {
        let mut d = batch.to_vec();
        d.extend_from_slice(&s.dims()[s.rank() - 2..]);
        Shape::new(&d)
    };
    let (sa, sb) = (full(&a.shape), full(&b.shape));
    let acc = matmul_acc(e.spmd, node.dtype);
    let va = e.value(node.inputs[0]);
    let vb = e.value(node.inputs[1]);
    let va = e.convert(&va, &a.shape, a.dtype, acc);
    let vb = e.convert(&vb, &b.shape, b.dtype, acc);
    let va = e.broadcast(&va, &a.shape, &sa, acc);
    if b.shape.dims()[..b.shape.rank() - 2].iter().all(|&d| d == 1) {
        return shared_weight_matmul(e, node, (&va, &sa), &vb, acc);
    }
    let vb = e.broadcast(&vb, &b.shape, &sb, acc);
    batched_matmul(e, node, (&va, &sa), (&vb, &sb), acc)
}

/// The dtype [`matmul`] computes a `dt` product in. In an SPMD program a
/// split contraction is summed across devices after each device's dot:
/// half types compute in f32 there, so the partial sums are not rounded
/// (and overflowed) to the half type before the all-reduce, as one
/// device's f32 accumulation does not (fuzz_spmd seed 8, program 219:
/// inf + -inf = NaN).
fn matmul_acc(spmd: bool, dt: DType) -> DType {
    if spmd && matches!(dt, DType::F16 | DType::BF16) {
        DType::F32
    } else {
        dt
    }
}

/// [`matmul`] of `va` (shape `sa`, the lhs with full batch dims) by a
/// shared weight `vb` (`[k, n]` behind leading 1s): one large GEMM with the
/// batch dims folded into m, instead of materialising a broadcast weight
/// and running many small batched GEMMs. The product is emitted as a 2-D
/// `[rows, k] x [k, n]` between reshapes: XLA's CPU backend runs a dot
/// whose lhs has several free dims about 4x slower than the same GEMM in
/// 2-D (measured on a hidden-512 Llama decode step: 66 ms -> 17 ms per
/// token).
fn shared_weight_matmul(
    e: &mut Emitter<'_>,
    node: &lazyfuse_ir::Node,
    (va, sa): (&str, &Shape),
    vb: &str,
    acc: DType,
) -> String {
    let g = e.graph;
    let b = g.node(node.inputs[1]);
    let out = &node.shape;
    let nb = out.rank() - 2;
    let kn = Shape::new(&b.shape.dims()[b.shape.rank() - 2..]);
    let vb = e.reshape(vb, &b.shape, &kn, acc);
    let (k, n) = (kn.dims()[0], kn.dims()[1]);
    let rows: usize = sa.dims()[..sa.rank() - 1].iter().product();
    let (lhs2, out2) = (Shape::new(&[rows, k]), Shape::new(&[rows, n]));
    let va = if nb == 0 {
        va.to_string()
    } else {
        e.reshape(va, sa, &lhs2, acc)
    };
    let y = match swapped_nt(e, g, node.inputs[1], (&va, rows, k, n), acc) {
        Some(y) => y,
        None => {
            let attr = "dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>";
            e.op(
                "stablehlo.dot_general",
                &[(&va, ty(&lhs2, acc)), (&vb, ty(&kn, acc))],
                attr,
                &ty(&out2, acc),
            )
        }
    };
    let y = e.convert(&y, &out2, acc, node.dtype);
    if nb == 0 {
        y
    } else {
        e.reshape(&y, &out2, out, node.dtype)
    }
}

/// [`matmul`] of `va` and `vb`, both broadcast to the output's batch dims
/// (shapes `sa` and `sb`), as one batched `dot_general`.
fn batched_matmul(
    e: &mut Emitter<'_>,
    node: &lazyfuse_ir::Node,
    (va, sa): (&str, &Shape),
    (vb, sb): (&str, &Shape),
    acc: DType,
) -> String {
    let out = &node.shape;
    let nb = out.rank() - 2;
    let bd = (0..nb)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let attr = format!(
        "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [{bd}], rhs_batching_dimensions = [{bd}], lhs_contracting_dimensions = [{}], rhs_contracting_dimensions = [{}]>",
        nb + 1,
        nb
    );
    let y = e.op(
        "stablehlo.dot_general",
        &[(va, ty(sa, acc)), (vb, ty(sb, acc))],
        &attr,
        &ty(out, acc),
    );
    e.convert(&y, out, acc, node.dtype)
}

/// `[rows, k] x transpose([n, k])` as `transpose([n, k] x [rows, k]^T)`
/// when the weight is transposed in this region (autograd's `g @ w^T`),
/// and much wider than the lhs is tall over a long contraction. XLA folds
/// the transpose into the dot either way; its CPU kernels for a dot
/// contracting both operands' minor dims are fast when the lhs has the
/// rows and slow the other way round. Measured on the 2-core development
/// machine, ms (as written / swapped): rows 256, k 1024, n 1024: 6.1 / 4.7;
/// 64, 512, 512: 0.98 / 0.47; 128, 768, 3072: 7.7 / 5.0; 16, 2048, 2048:
/// 9.2 / 1.7; 256, 4096, 1024: 24 / 17. Outside the rule it can lose
/// (1024, 1024, 256: 4.3 / 7.0; 512, 256, 1024: 2.0 / 2.8).
fn swapped_nt(
    e: &mut Emitter<'_>,
    g: &lazyfuse_ir::Graph,
    rhs: lazyfuse_ir::NodeId,
    (va, rows, k, n): (&str, usize, usize, usize),
    acc: DType,
) -> Option<String> {
    let t = g.node(rhs);
    let lazyfuse_ir::Op::Permute(perm) = &t.op else {
        return None;
    };
    let w = g.node(t.inputs[0]);
    let wide = rows >= 2 && 4 * rows <= n && k >= NT_SWAP_MIN_K;
    if !wide || perm.as_slice() != [1, 0] || w.dtype != acc || t.dtype != acc {
        return None;
    }
    let vw = e.value_if_lowered(t.inputs[0])?;
    let attr = "dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]>";
    let (wk, ak, nr) = (
        Shape::new(&[n, k]),
        Shape::new(&[rows, k]),
        Shape::new(&[n, rows]),
    );
    let yt = e.op(
        "stablehlo.dot_general",
        &[(&vw, ty(&wk, acc)), (va, ty(&ak, acc))],
        attr,
        &ty(&nr, acc),
    );
    Some(e.transpose(&yt, &nr, &[1, 0], acc))
}

/// The shortest contraction for which [`swapped_nt`] applies.
const NT_SWAP_MIN_K: usize = 512;
