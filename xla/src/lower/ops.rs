//! Per-op lowering rules (the StableHLO meaning of each IR op).
//!
//! [`lower_node`] dispatches on the op to one step per op family:
//! creation (constants, `arange`), elementwise unary and binary ops,
//! comparisons and `where`, dtype conversion, layout ops (reshape, permute,
//! broadcast, slice, concat), reductions and contractions (in `contract.rs`),
//! and the indexed read and random generator (in `index.rs`).

use super::contract::{argmax, contraction_len, matmul, reduce};
use super::elementwise::{binary, compare, flush_subnormals, unary};
use super::emit::{i64_array, ty, Emitter};
use lazyfuse_ir::{
    BinaryOp, CmpOp, DType, KernelBody, Literal, Node, NodeId, Op, ReduceOp, Shape, UnaryOp,
};

/// Lowers node `id` (its operands are already lowered) and binds its value.
pub fn lower_node(e: &mut Emitter<'_>, id: NodeId) {
    let node = e.graph.node(id);
    e.set_loc(node.op.name(), node.origin);
    inject_compile_fault(e, node);
    if let Some(v) = super::fold::fold(e, id) {
        return e.bind(id, v);
    }
    let v = match &node.op {
        Op::Input { .. } => panic!("lowering bug: input node {id:?} must be a region parameter"),
        // A value with no elements is the same whatever computed it. As a
        // constant it keeps zero-size operands away from StableHLO's folding
        // patterns, one of which (`SliceOpConcatSimplify` on an empty slice
        // of a concatenate with empty operands) throws a C++ exception that
        // would abort the process. Random draws still advance their state.
        op if node.shape.numel() == 0 && !matches!(op, Op::RandomUniform { .. }) => {
            e.constant(Literal::Int(0), &node.shape, node.dtype)
        }
        // A contraction over an empty axis is a sum of nothing: zeros. XLA's
        // CPU dot emitter divides by the contraction length while tiling and
        // kills the process with SIGFPE when it is 0.
        Op::MatMul if contraction_len(e, node) == 0 => {
            e.constant(Literal::Int(0), &node.shape, node.dtype)
        }
        Op::Constant { value, .. } => e.constant(*value, &node.shape, node.dtype),
        Op::Arange {
            start,
            step,
            len,
            dtype,
        } => arange(e, *start, *step, *len, *dtype),
        Op::Unary(u) => elementwise_unary(e, node, *u),
        Op::Binary(b) => elementwise_binary(e, node, *b),
        Op::Compare(c) => elementwise_compare(e, node, *c),
        Op::Select => select(e, node),
        Op::Convert(to) => convert(e, node, *to),
        Op::Reduce { op, axes, keepdim } => reduction(e, node, *op, axes, *keepdim),
        Op::ArgMax { axis, .. } => arg_max(e, node, *axis),
        Op::Reshape(_) => reshape(e, node),
        Op::Permute(perm) => permute(e, node, perm),
        Op::Reverse(axes) => super::conv::reverse(e, node, axes),
        Op::BroadcastTo(_) => broadcast_operand(e, node, 0),
        Op::ShardingConstraint(_) => super::sharding_constraint(e, id, node),
        Op::Slice { axis, start, len } => slice(e, node, *axis, *start, *len),
        Op::Concat { axis } => concat(e, node, *axis),
        Op::MatMul => matmul(e, id),
        Op::Conv(spec) => super::conv::conv(e, node, spec),
        Op::Custom(k) => custom(e, node, k),
        Op::IndexSelect { axis } => index_select(e, node, *axis),
        Op::ScatterAdd { axis } => scatter_add(e, node, *axis),
        Op::DynamicSlice { axis, .. } => dynamic_slice(e, node, *axis),
        Op::DynamicUpdateSlice { axis } => dynamic_update_slice(e, node, *axis),
        Op::RandomUniform { .. } => random_uniform(e, node),
    };
    e.bind(id, v);
}

/// Emits an op XLA rejects before `node`'s own lowering when the caller
/// asked to sabotage the compilation of its op ([`super::Options::sabotage`]).
fn inject_compile_fault(e: &mut Emitter<'_>, node: &Node) {
    if e.sabotage == Some(node.op.name()) {
        e.op(
            "stablehlo.injected_fault",
            &[],
            "",
            &ty(&node.shape, node.dtype),
        );
    }
}

// ---- Operands ---------------------------------------------------------------

/// Operand `k` of `node`: its SSA value and its node (for shape and dtype).
fn operand<'g>(e: &Emitter<'g>, node: &Node, k: usize) -> (String, &'g Node) {
    let id = node.inputs[k];
    (e.value(id), e.graph.node(id))
}

/// Operand `k` of `node` broadcast to `node`'s shape, keeping its own dtype
/// (the implicit NumPy broadcasting of elementwise ops, made explicit).
fn broadcast_operand(e: &mut Emitter<'_>, node: &Node, k: usize) -> String {
    let (v, n) = operand(e, node, k);
    e.broadcast(&v, &n.shape, &node.shape, n.dtype)
}

// ---- Elementwise ops ----------------------------------------------------------

/// An elementwise unary op on operand 0.
fn elementwise_unary(e: &mut Emitter<'_>, node: &Node, u: UnaryOp) -> String {
    let (x, _) = operand(e, node, 0);
    unary(e, u, &x, &node.shape, node.dtype)
}

/// An elementwise binary op on both operands broadcast to the result shape.
fn elementwise_binary(e: &mut Emitter<'_>, node: &Node, b: BinaryOp) -> String {
    let (x, y) = (broadcast_operand(e, node, 0), broadcast_operand(e, node, 1));
    binary(e, b, &x, &y, &node.shape, node.dtype)
}

/// A comparison of both operands broadcast to the result shape; the compare
/// type comes from the operands' dtype (the result is bool).
fn elementwise_compare(e: &mut Emitter<'_>, node: &Node, c: CmpOp) -> String {
    let (x, y) = (broadcast_operand(e, node, 0), broadcast_operand(e, node, 1));
    let operand_dtype = e.graph.node(node.inputs[0]).dtype;
    compare(e, c, &x, &y, &node.shape, operand_dtype)
}

/// `where(cond, on_true, on_false)` with all three broadcast together.
fn select(e: &mut Emitter<'_>, node: &Node) -> String {
    let c = broadcast_operand(e, node, 0);
    let x = broadcast_operand(e, node, 1);
    let y = broadcast_operand(e, node, 2);
    let t = ty(&node.shape, node.dtype);
    e.op(
        "stablehlo.select",
        &[
            (&c, ty(&node.shape, DType::Bool)),
            (&x, t.clone()),
            (&y, t.clone()),
        ],
        "",
        &t,
    )
}

/// Element type conversion of operand 0 to `to` (nothing when it has it).
///
/// Float to bool is lowered as the comparison `x != 0` it means: XLA's
/// own float-to-pred conversion, once fused behind another conversion
/// (f32 -> bf16 -> bool), tested the bits and so took a subnormal for
/// nonzero, where every other path flushes it to zero first
/// (`tests/semantics/fuzz_subnormals.rs::subnormal_through_bf16_to_bool_is_false_fused_too`).
fn convert(e: &mut Emitter<'_>, node: &Node, to: DType) -> String {
    let (x, n) = operand(e, node, 0);
    if to == DType::Bool && n.dtype.is_float() {
        let zero = e.constant(Literal::Float(0.0), &n.shape, n.dtype);
        return compare(e, CmpOp::Ne, &x, &zero, &n.shape, n.dtype);
    }
    let y = e.convert(&x, &node.shape, n.dtype, to);
    if n.dtype == DType::BF16 && matches!(to, DType::F32 | DType::F64) {
        // XLA widens bf16 by shifting its bits, so a bf16 subnormal is an
        // f32 subnormal in a register, and LLVM folds a compare of it with a
        // constant zero into an integer test that sees it non-zero, where
        // unfused the hardware reads it from memory as zero: `bf16 -> f32 ->
        // bool` of one was `true` fused (`tests/semantics/fuzz_subnormals.rs::
        // widened_bf16_subnormal_converts_to_false`). Flushed, as the
        // interpreter's conversion does.
        return flush_subnormals(e, &y, &node.shape, to);
    }
    y
}

// ---- Reductions (lowered in `contract.rs`) --------------------------------

/// A reduction of operand 0 over `axes`.
fn reduction(
    e: &mut Emitter<'_>,
    node: &Node,
    op: ReduceOp,
    axes: &[usize],
    keepdim: bool,
) -> String {
    let (x, n) = operand(e, node, 0);
    reduce(e, op, &x, &n.shape, axes, keepdim, &node.shape, node.dtype)
}

/// The index of the first maximum of operand 0 along `axis`.
fn arg_max(e: &mut Emitter<'_>, node: &Node, axis: usize) -> String {
    let (x, n) = operand(e, node, 0);
    argmax(e, &x, &n.shape, n.dtype, axis, &node.shape)
}

// ---- Layout ops -------------------------------------------------------------

/// Operand 0 in the result shape.
fn reshape(e: &mut Emitter<'_>, node: &Node) -> String {
    let (x, n) = operand(e, node, 0);
    e.reshape(&x, &n.shape, &node.shape, node.dtype)
}

/// Operand 0 with its dims reordered: result dim `i` is its dim `perm[i]`.
fn permute(e: &mut Emitter<'_>, node: &Node, perm: &[usize]) -> String {
    let (x, n) = operand(e, node, 0);
    e.transpose(&x, &n.shape, perm, node.dtype)
}

/// `len` elements of operand 0 from `start` along `axis` (unit strides).
fn slice(e: &mut Emitter<'_>, node: &Node, axis: usize, start: usize, len: usize) -> String {
    let (x, n) = operand(e, node, 0);
    let dt = node.dtype;
    let rank = n.shape.rank();
    let starts = (0..rank).map(|i| if i == axis { start } else { 0 });
    let limits = (0..rank).map(|i| {
        if i == axis {
            start + len
        } else {
            n.shape.dims()[i]
        }
    });
    let attr = format!(
        "start_indices = {}, limit_indices = {}, strides = {}",
        i64_array(starts),
        i64_array(limits),
        i64_array(std::iter::repeat_n(1, rank))
    );
    e.op(
        "stablehlo.slice",
        &[(&x, ty(&n.shape, dt))],
        &attr,
        &ty(&node.shape, dt),
    )
}

/// All operands joined along `axis`.
fn concat(e: &mut Emitter<'_>, node: &Node, axis: usize) -> String {
    let dt = node.dtype;
    // Empty operands add nothing; leaving them out keeps them from XLA's
    // concatenate patterns (see `lower_node`). The result is not empty here,
    // so at least one operand remains.
    let args: Vec<(String, String)> = node
        .inputs
        .iter()
        .filter(|&&i| e.graph.node(i).shape.numel() > 0)
        .map(|&i| (e.value(i), ty(&e.graph.node(i).shape, dt)))
        .collect();
    if let [(only, _)] = args.as_slice() {
        return only.clone();
    }
    let refs: Vec<(&str, String)> = args.iter().map(|(v, t)| (v.as_str(), t.clone())).collect();
    e.op(
        "stablehlo.concatenate",
        &refs,
        &format!("dimension = {axis} : i64"),
        &ty(&node.shape, dt),
    )
}

// ---- Indexed reads and random numbers (lowered in `index.rs`) ---------------

/// `index_add(x, axis, idx, src)`: operand 2 added into operand 0 at the
/// indices of operand 1.
fn scatter_add(e: &mut Emitter<'_>, node: &Node, axis: usize) -> String {
    let (x, _) = operand(e, node, 0);
    let (i, inn) = operand(e, node, 1);
    let (s, sn) = operand(e, node, 2);
    super::index::scatter_add(
        e,
        (&x, &node.shape),
        (&i, &inn.shape, inn.dtype),
        (&s, &sn.shape),
        axis,
        node.dtype,
    )
}

/// `index_select(x, axis, idx)`: operand 0 read at the indices of operand 1.
fn index_select(e: &mut Emitter<'_>, node: &Node, axis: usize) -> String {
    let (x, xn) = operand(e, node, 0);
    let (i, inn) = operand(e, node, 1);
    super::index::index_select(
        e,
        (&x, &xn.shape),
        (&i, &inn.shape, inn.dtype),
        axis,
        &node.shape,
        node.dtype,
    )
}

/// `dynamic_slice(x, start)` along `axis` (lowered in `index.rs`).
fn dynamic_slice(e: &mut Emitter<'_>, node: &Node, axis: usize) -> String {
    let (x, xn) = operand(e, node, 0);
    let (s, sn) = operand(e, node, 1);
    super::index::dynamic_slice(
        e,
        (&x, &xn.shape),
        (&s, sn.dtype),
        axis,
        &node.shape,
        node.dtype,
    )
}

/// `dynamic_update_slice(x, update, start)` along `axis` (in `index.rs`).
fn dynamic_update_slice(e: &mut Emitter<'_>, node: &Node, axis: usize) -> String {
    let (x, _) = operand(e, node, 0);
    let (u, un) = operand(e, node, 1);
    let (s, sn) = operand(e, node, 2);
    super::index::dynamic_update_slice(
        e,
        &x,
        (&u, &un.shape),
        (&s, sn.dtype),
        axis,
        &node.shape,
        node.dtype,
    )
}

/// Uniform `[0, 1)` values from the seed in operand 0.
fn random_uniform(e: &mut Emitter<'_>, node: &Node) -> String {
    let (seed, _) = operand(e, node, 0);
    super::index::random_uniform(e, &seed, &node.shape, node.dtype)
}

// ---- Creation ---------------------------------------------------------------

/// `arange`: `start + i * step` for `i in 0..len`, in `dt`.
fn arange(e: &mut Emitter<'_>, start: Literal, step: Literal, len: usize, dt: DType) -> String {
    // Computed in f64 (floats) or i64 (ints) and converted once, exactly like
    // the reference interpreter.
    let s = Shape::new(&[len]);
    let wide = if dt.is_float() {
        DType::F64
    } else {
        DType::I64
    };
    let iota = e.op(
        "stablehlo.iota",
        &[],
        "iota_dimension = 0 : i64",
        &ty(&s, DType::I64),
    );
    let i = e.convert(&iota, &s, DType::I64, wide);
    let (st, sp) = if dt.is_float() {
        (
            Literal::Float(start.as_f64()),
            Literal::Float(step.as_f64()),
        )
    } else {
        (Literal::Int(start.as_i64()), Literal::Int(step.as_i64()))
    };
    let stepc = e.constant(sp, &s, wide);
    let startc = e.constant(st, &s, wide);
    let m = e.eltwise("stablehlo.multiply", &[&i, &stepc], &s, wide, wide);
    let a = e.eltwise("stablehlo.add", &[&m, &startc], &s, wide, wide);
    e.convert(&a, &s, wide, dt)
}

/// A custom kernel: its function joins the module (once, renamed to the
/// kernel's symbol and made private) and `@main` calls it.
fn custom(e: &mut Emitter<'_>, node: &Node, k: &lazyfuse_ir::CustomKernel) -> String {
    let text = match &k.body {
        KernelBody::StableHlo(text) => text,
        KernelBody::Host(_) => return host_call(e, node, k),
    };
    let sym = k.symbol();
    if !e.funcs.iter().any(|(s, _)| *s == sym) {
        e.funcs.push((sym.clone(), renamed(text, &sym)));
    }
    let args = operands(e, node);
    let refs: Vec<(&str, String)> = args.iter().map(|(v, t)| (v.as_str(), t.clone())).collect();
    e.op(
        "func.call",
        &refs,
        &format!("callee = @{sym}"),
        &ty(&node.shape, node.dtype),
    )
}

/// A host kernel: a call to lazyfuse's one registered handler, which
/// finds the kernel by the name in the call's attributes (so a cached
/// executable stays valid in a new process that registers the kernel
/// again).
fn host_call(e: &mut Emitter<'_>, node: &Node, k: &lazyfuse_ir::CustomKernel) -> String {
    let args = operands(e, node);
    let refs: Vec<(&str, String)> = args.iter().map(|(v, t)| (v.as_str(), t.clone())).collect();
    super::host::call(e, &k.name, &refs, &ty(&node.shape, node.dtype))
}

/// The node's operands: each one's value and type.
fn operands(e: &mut Emitter<'_>, node: &Node) -> Vec<(String, String)> {
    node.inputs
        .iter()
        .map(|&i| {
            let n = e.graph.node(i);
            (e.value(i), ty(&n.shape, n.dtype))
        })
        .collect()
}

/// `text` with its entry `@main` renamed to `sym`, and every other
/// function it defines to `sym_<name>` (so two kernels' helpers never
/// clash in one module), all private.
fn renamed(text: &str, sym: &str) -> String {
    let ident = |c: char| c.is_alphanumeric() || c == '_' || c == '$' || c == '.';
    // The names the text defines: `func.func [visibility] @name(`.
    let mut defined = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("func.func") {
        rest = &rest[at + 9..];
        if let Some(a) = rest.find('@') {
            let name: String = rest[a + 1..].chars().take_while(|&c| ident(c)).collect();
            defined.push(name);
        }
    }
    let mut out = String::with_capacity(text.len() + 64);
    let mut rest = text;
    while let Some(at) = rest.find('@') {
        out.push_str(&rest[..at]);
        let name: String = rest[at + 1..].chars().take_while(|&c| ident(c)).collect();
        out.push('@');
        if name == "main" {
            out.push_str(sym);
        } else if defined.contains(&name) {
            out.push_str(&format!("{sym}_{name}"));
        } else {
            out.push_str(&name);
        }
        rest = &rest[at + 1 + name.len()..];
    }
    out.push_str(rest);
    // Every function private: only `@main` of the region is public.
    out.replace("func.func public @", "func.func @")
        .replace("func.func private @", "func.func @")
        .replace("func.func @", "func.func private @")
}
