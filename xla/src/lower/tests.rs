//! Golden lowering tests: the exact StableHLO text of small regions, kept in
//! `tests/golden/lower_*.txt` so a change in lowering is a visible diff
//! (every module is also compiled by XLA in the integration tests).
//!
//! The goldens leave out each op's `loc(...)` (it names lines of this file,
//! which move with every edit); `ops_carry_the_recording_location` checks
//! the locations. Regenerate the files with `LAZYFUSE_BLESS=1`.

use super::lower_region;
use lazyfuse_fusion::{plan, PlanOptions};
use lazyfuse_ir::testutil::GraphBuilder;
use lazyfuse_ir::{golden, BinaryOp, CmpOp, DType, Literal, NodeId, Op, ReduceOp, UnaryOp};

/// `text` with the ` loc(...)` suffix of every op line removed.
fn strip_locs(text: &str) -> String {
    text.lines()
        .map(|l| match l.find(" loc(") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The plan for `live` on `g` lowered region by region, without locations;
/// regions after the first are preceded by a `// region <i>` line.
fn lowered(g: &GraphBuilder, live: &[NodeId]) -> String {
    let p = plan(g.graph(), live, &PlanOptions::default());
    let modules: Vec<String> = p
        .regions
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let text = strip_locs(&lower_region(g.graph(), r));
            if i == 0 {
                text
            } else {
                format!("// region {i}\n{text}")
            }
        })
        .collect();
    modules.join("\n")
}

#[test]
fn broadcast_binary_reduce_and_lifted_scalar() {
    let mut g = GraphBuilder::new();
    let x = g.input_f32(&[2, 3]);
    let b = g.input_f32(&[3]);
    let s = g.scalar(0.5);
    let a = g.binary(BinaryOp::Add, x, b);
    let m = g.binary(BinaryOp::Mul, a, s);
    let t = g.unary(UnaryOp::Tanh, m);
    let r = g.reduce(ReduceOp::Sum, t, &[1], true);
    golden!(
        "lower_broadcast_binary_reduce_and_lifted_scalar",
        lowered(&g, &[r])
    );
}

#[test]
fn unary_family() {
    let mut g = GraphBuilder::new();
    let x = g.input_f32(&[3]);
    let mut live: Vec<NodeId> = UnaryOp::ALL.iter().map(|&u| g.unary(u, x)).collect();
    let i = g.input(&[3], DType::I32);
    live.push(g.unary(UnaryOp::Neg, i));
    live.push(g.unary(UnaryOp::Relu, i));
    let u = g.input(&[3], DType::U8);
    live.push(g.unary(UnaryOp::Neg, u));
    live.push(g.unary(UnaryOp::Abs, u));
    golden!("lower_unary_family", lowered(&g, &live));
}

#[test]
fn binary_family() {
    let mut g = GraphBuilder::new();
    let x = g.input_f32(&[2, 3]);
    let y = g.input_f32(&[3]);
    let mut live: Vec<NodeId> = BinaryOp::ALL.iter().map(|&b| g.binary(b, x, y)).collect();
    let i = g.input(&[2], DType::I32);
    let j = g.input(&[2], DType::I32);
    live.push(g.binary(BinaryOp::Maximum, i, j));
    live.push(g.binary(BinaryOp::Div, i, j));
    live.push(g.binary(BinaryOp::Pow, i, j));
    let h = g.input(&[2], DType::BF16);
    live.push(g.binary(BinaryOp::Pow, h, h));
    golden!("lower_binary_family", lowered(&g, &live));
}

#[test]
fn compare_select_and_convert() {
    let mut g = GraphBuilder::new();
    let x = g.input_f32(&[2, 3]);
    let y = g.input_f32(&[3]);
    let lt = g.compare(CmpOp::Lt, x, y);
    let sel = g.select(lt, x, y);
    let h = g.input(&[3], DType::BF16);
    let eq = g.compare(CmpOp::Eq, h, h);
    let i = g.input(&[3], DType::I32);
    let ge = g.compare(CmpOp::Ge, i, i);
    let u = g.input(&[3], DType::U8);
    let ne = g.compare(CmpOp::Ne, u, u);
    let c = g.select(eq, y, y);
    let to_bf16 = g.convert(x, DType::BF16);
    let to_i32 = g.convert(x, DType::I32);
    let same = g.convert(x, DType::F32);
    let live = [sel, ge, ne, c, to_bf16, to_i32, same];
    golden!("lower_compare_select_and_convert", lowered(&g, &live));
}

#[test]
fn layout_family() {
    let mut g = GraphBuilder::new();
    let x = g.input_f32(&[2, 3, 4]);
    let r = g.reshape(x, &[6, 4]);
    let p = g.permute(x, &[2, 0, 1]);
    let v = g.input_f32(&[4]);
    let b = g.broadcast_to(v, &[2, 3, 4]);
    let s = g.slice(x, 1, 1, 2);
    let c = g.concat(&[x, b, s], 1);
    golden!("lower_layout_family", lowered(&g, &[r, p, c]));
}

#[test]
fn reductions_and_contractions() {
    let mut g = GraphBuilder::new();
    let x = g.input_f32(&[2, 3, 4]);
    let max = g.reduce(ReduceOp::Max, x, &[0, 2], false);
    let mean = g.reduce(ReduceOp::Mean, x, &[2], true);
    let none = g.reduce(ReduceOp::Sum, x, &[], false);
    let h = g.input(&[2, 3], DType::BF16);
    let hsum = g.reduce(ReduceOp::Sum, h, &[1], false);
    let i = g.input(&[2, 3], DType::I32);
    let imin = g.reduce(ReduceOp::Min, i, &[0], true);
    let am = g.argmax(x, 1, true);
    let w = g.input_f32(&[4, 5]);
    let shared = g.matmul(x, w);
    let wb = g.input_f32(&[2, 4, 5]);
    let batched = g.matmul(x, wb);
    let live = [max, mean, none, hsum, imin, am, shared, batched];
    golden!("lower_reductions_and_contractions", lowered(&g, &live));
}

/// Float sums over leading axes that keep enough elements run as a product
/// with a vector of ones (a strided column loop in XLA's CPU backend
/// otherwise); sums over minor axes, sums keeping few elements, and
/// integer sums stay reductions.
#[test]
fn leading_float_sums_as_products_with_ones() {
    let mut g = GraphBuilder::new();
    let x = g.input_f32(&[8, 64]);
    let bias_grad = g.reduce(ReduceOp::Sum, x, &[0], false);
    let mean = g.reduce(ReduceOp::Mean, x, &[0], true);
    let minor = g.reduce(ReduceOp::Sum, x, &[1], false);
    let h = g.input(&[2, 4, 64], DType::BF16);
    let two = g.reduce(ReduceOp::Sum, h, &[0, 1], false);
    let narrow = g.input_f32(&[8, 16]);
    let few = g.reduce(ReduceOp::Sum, narrow, &[0], false);
    let i = g.input(&[8, 64], DType::I32);
    let int = g.reduce(ReduceOp::Sum, i, &[0], false);
    let live = [bias_grad, mean, minor, two, few, int];
    golden!("lower_leading_float_sums", lowered(&g, &live));
}

/// `x @ w^T` with `w` transposed in the region is swapped to
/// `(w x^T)^T` when `w` is much wider than `x` is tall over a long
/// contraction (XLA's CPU kernel is slow the other way round), and not
/// otherwise.
#[test]
fn wide_transposed_weights_swap_the_product() {
    let mut g = GraphBuilder::new();
    let x = g.input_f32(&[4, 512]);
    let w = g.input_f32(&[64, 512]);
    let wt = g.permute(w, &[1, 0]);
    let swapped = g.matmul(x, wt);
    let tall = g.input_f32(&[64, 512]);
    let kept = g.matmul(tall, wt);
    golden!(
        "lower_wide_transposed_weights",
        lowered(&g, &[swapped, kept])
    );
}

#[test]
fn index_creation_and_random() {
    let mut g = GraphBuilder::new();
    let x = g.input_f32(&[5, 3]);
    let idx = g.input(&[2], DType::I64);
    let sel = g.index_select(x, 1, idx);
    let fa = g.push(
        Op::Arange {
            start: Literal::Float(0.5),
            step: Literal::Float(0.25),
            len: 4,
            dtype: DType::F32,
        },
        &[],
    );
    let ia = g.push(
        Op::Arange {
            start: Literal::Int(3),
            step: Literal::Int(-2),
            len: 4,
            dtype: DType::I32,
        },
        &[],
    );
    let one = g.constant(Literal::Float(1.0), &[4], DType::F32);
    let sum = g.binary(BinaryOp::Add, fa, one);
    let seed = g.input(&[], DType::I64);
    let rnd = g.random_uniform(seed, &[2, 3], DType::BF16);
    golden!(
        "lower_index_creation_and_random",
        lowered(&g, &[sel, ia, sum, rnd])
    );
}

#[test]
fn ops_carry_the_recording_location() {
    let mut g = GraphBuilder::new();
    let x = g.input(&[4], DType::F64);
    let line = line!() + 1;
    let y = g.unary(UnaryOp::Exp, x);
    let p = plan(g.graph(), &[y], &PlanOptions::default());
    let text = lower_region(g.graph(), &p.regions[0]);
    assert!(
        text.contains(&format!("loc(\"exp @ {}:{line}:", file!())),
        "{text}"
    );
}

#[test]
fn literals_are_exact_bit_patterns() {
    use super::emit::literal;
    assert_eq!(literal(Literal::Float(1.0), DType::F32), "0x3F800000");
    assert_eq!(
        literal(Literal::Float(-0.0), DType::F64),
        "0x8000000000000000"
    );
    assert_eq!(
        literal(Literal::Float(f64::NEG_INFINITY), DType::BF16),
        "0xFF80"
    );
    assert_eq!(literal(Literal::Float(1.0), DType::F16), "0x3C00");
    assert_eq!(literal(Literal::Int(-7), DType::I32), "-7");
    assert_eq!(literal(Literal::Int(255), DType::U8), "255");
    assert_eq!(literal(Literal::Bool(true), DType::Bool), "true");
}

#[test]
fn custom_kernels_are_private_functions_called_from_main() {
    let mut g = GraphBuilder::new();
    let x = g.input_f32(&[4]);
    let kernel = |name: &str, body: &str| {
        Op::Custom(std::sync::Arc::new(lazyfuse_ir::CustomKernel {
            name: name.into(),
            body: lazyfuse_ir::KernelBody::StableHlo(format!(
                "func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {{\n  %r = {body} : tensor<4xf32>\n  return %r : tensor<4xf32>\n}}"
            )),
            params: vec![(lazyfuse_ir::Shape::new(&[4]), DType::F32)],
            result: (lazyfuse_ir::Shape::new(&[4]), DType::F32),
        }))
    };
    let exp = kernel("exp", "stablehlo.exponential %a");
    let y = g.push(exp.clone(), &[x]);
    let z = g.push(kernel("neg", "stablehlo.negate %a"), &[y]);
    // The same kernel twice: one function, called twice.
    let w = g.push(exp, &[z]);
    golden!("lower_custom_kernels", lowered(&g, &[w]));
}

#[test]
fn host_kernels_are_typed_ffi_calls_naming_the_kernel() {
    let mut g = GraphBuilder::new();
    let x = g.input_f32(&[4]);
    let host = Op::Custom(std::sync::Arc::new(lazyfuse_ir::CustomKernel {
        name: "my.kernel".into(),
        body: lazyfuse_ir::KernelBody::Host(lazyfuse_ir::HostFn::new(|_, _| Ok(()))),
        params: vec![(lazyfuse_ir::Shape::new(&[4]), DType::F32)],
        result: (lazyfuse_ir::Shape::new(&[2, 2]), DType::F32),
    }));
    let y = g.push(host, &[x]);
    golden!("lower_host_kernel", lowered(&g, &[y]));
}
