//! The elementwise rules on lowered values: unary and binary arithmetic
//! (integer division and powers spelled out exactly as the interpreter
//! computes them), comparisons, NaN-propagating extrema, and subnormal
//! flushing where XLA's CPU arithmetic and the interpreter disagree. Used
//! by the per-node lowering (`ops.rs`) and by reductions (`contract.rs`).

use super::emit::{compare_attr, ty, Emitter};
use lazyfuse_ir::{BinaryOp, CmpOp, DType, Literal, Shape, UnaryOp};

/// Unary op `u` on `x` (shape `s`, dtype `dt`).
pub(super) fn unary(e: &mut Emitter<'_>, u: UnaryOp, x: &str, s: &Shape, dt: DType) -> String {
    let simple = |name: &str, e: &mut Emitter<'_>| e.eltwise(name, &[x], s, dt, dt);
    match u {
        UnaryOp::Neg if dt == DType::U8 => {
            let z = e.constant(Literal::Int(0), s, dt);
            e.eltwise("stablehlo.subtract", &[&z, x], s, dt, dt)
        }
        UnaryOp::Abs if dt == DType::U8 => x.to_string(),
        UnaryOp::Neg => simple("stablehlo.negate", e),
        UnaryOp::Abs => simple("stablehlo.abs", e),
        UnaryOp::Exp => e.nan_guarded("stablehlo.exponential", x, s, dt),
        // Newer XLA CPU builds compute `log` of a negative subnormal as NaN
        // in some loops (its bits read as a negative number) where flush to
        // zero makes it -0 and the answer -inf: flush first, as for `pow`
        // (`tests/fuzz_regressions/numerics.rs::log_of_a_negative_subnormal_in_a_loop_tail_is_minus_infinity`).
        UnaryOp::Log => {
            let x = flush_subnormals(e, x, s, dt);
            e.eltwise("stablehlo.log", &[&x], s, dt, dt)
        }
        UnaryOp::Sqrt => simple("stablehlo.sqrt", e),
        UnaryOp::Rsqrt => simple("stablehlo.rsqrt", e),
        UnaryOp::Tanh => simple("stablehlo.tanh", e),
        UnaryOp::Sigmoid => e.nan_guarded("stablehlo.logistic", x, s, dt),
        UnaryOp::Sin => simple("stablehlo.sine", e),
        UnaryOp::Cos => simple("stablehlo.cosine", e),
        UnaryOp::Floor => simple("stablehlo.floor", e),
        // CHLO is legalised by XLA's StableHLO pipeline; its erf is accurate in f64.
        UnaryOp::Erf => simple("chlo.erf", e),
        UnaryOp::Relu => {
            let z = e.constant(Literal::Int(0), s, dt);
            extremum(e, "stablehlo.maximum", x, &z, s, dt)
        }
        UnaryOp::Gelu => {
            let c = |e: &mut Emitter<'_>, v: f64| e.constant(Literal::Float(v), s, dt);
            let mul = |e: &mut Emitter<'_>, a: &str, b: &str| {
                e.eltwise("stablehlo.multiply", &[a, b], s, dt, dt)
            };
            let x2 = mul(e, x, x);
            let x3 = mul(e, &x2, x);
            let k = c(e, 0.044715);
            let kx3 = mul(e, &k, &x3);
            let inner = e.eltwise("stablehlo.add", &[x, &kx3], s, dt, dt);
            let r = c(e, 0.797_884_560_802_865_4);
            let arg = mul(e, &r, &inner);
            let t = e.eltwise("stablehlo.tanh", &[&arg], s, dt, dt);
            let one = c(e, 1.0);
            let onept = e.eltwise("stablehlo.add", &[&one, &t], s, dt, dt);
            let half = c(e, 0.5);
            let hx = mul(e, &half, x);
            mul(e, &hx, &onept)
        }
    }
}

/// Binary op `b` on `x` and `y`, both already of shape `s` and dtype `dt`.
pub(super) fn binary(
    e: &mut Emitter<'_>,
    b: BinaryOp,
    x: &str,
    y: &str,
    s: &Shape,
    dt: DType,
) -> String {
    if b == BinaryOp::Pow && dt.is_float() {
        // XLA's CPU `power` inspects operand bits (libm style), so it sees a
        // subnormal operand at its true value even under flush-to-zero: flush
        // explicitly, as every other arithmetic op does (regression test
        // `tests/semantics/fuzz_subnormals.rs::pow_flushes_subnormal_operands`).
        let (x, y) = (flush_subnormals(e, x, s, dt), flush_subnormals(e, y, s, dt));
        return e.eltwise("stablehlo.power", &[&x, &y], s, dt, dt);
    }
    if b == BinaryOp::Pow {
        return int_pow(e, x, y, s, dt);
    }
    if b == BinaryOp::Div && !dt.is_float() {
        return int_div(e, x, y, s, dt);
    }
    let name = match b {
        BinaryOp::Add => "stablehlo.add",
        BinaryOp::Sub => "stablehlo.subtract",
        BinaryOp::Mul => "stablehlo.multiply",
        BinaryOp::Div => "stablehlo.divide",
        BinaryOp::Pow => "stablehlo.power",
        BinaryOp::Maximum => return extremum(e, "stablehlo.maximum", x, y, s, dt),
        BinaryOp::Minimum => return extremum(e, "stablehlo.minimum", x, y, s, dt),
    };
    e.eltwise(name, &[x, y], s, dt, dt)
}

/// Integer division with the interpreter's (and XLA's run-time) semantics,
/// `x / 0` all ones and `MIN / -1` = `MIN`, computed so that no division
/// by zero or overflowing division is ever evaluated: XLA folds divisions
/// of constants while it converts the module, in C++, and such a division
/// killed the process with SIGFPE (regression test
/// `tests/fuzz_crashes.rs::constant_integer_division_by_zero_does_not_kill_the_process`).
fn int_div(e: &mut Emitter<'_>, x: &str, y: &str, s: &Shape, dt: DType) -> String {
    let t = ty(s, dt);
    let b = ty(s, DType::Bool);
    let int = |e: &mut Emitter<'_>, v: i64| e.constant(Literal::Int(v), s, dt);
    let cmp = |e: &mut Emitter<'_>, p: &str, q: &str| {
        e.op(
            "stablehlo.compare",
            &[(p, t.clone()), (q, t.clone())],
            &compare_attr(CmpOp::Eq, dt),
            &b,
        )
    };
    let zero = int(e, 0);
    let by_zero = cmp(e, y, &zero);
    let mut bad = by_zero.clone();
    if dt != DType::U8 {
        let min = int(
            e,
            if dt == DType::I32 {
                i32::MIN as i64
            } else {
                i64::MIN
            },
        );
        let minus_one = int(e, -1);
        let (is_min, is_minus_one) = (cmp(e, x, &min), cmp(e, y, &minus_one));
        let overflow = e.eltwise(
            "stablehlo.and",
            &[&is_min, &is_minus_one],
            s,
            DType::Bool,
            DType::Bool,
        );
        bad = e.eltwise(
            "stablehlo.or",
            &[&bad, &overflow],
            s,
            DType::Bool,
            DType::Bool,
        );
    }
    let one = int(e, 1);
    let select = |e: &mut Emitter<'_>, c: &str, p: &str, q: &str| e.select(c, p, q, s, dt);
    // A bad divisor becomes 1: `MIN / 1` is the wrapped `MIN / -1`.
    let safe = select(e, &bad, &one, y);
    let q = e.eltwise("stablehlo.divide", &[x, &safe], s, dt, dt);
    let all_ones = int(e, if dt == DType::U8 { 255 } else { -1 });
    select(e, &by_zero, &all_ones, &q)
}

/// Integer power with the interpreter's semantics: wrapping square-and-multiply
/// over *every* bit of the exponent; a negative exponent gives 0, except bases
/// 1 (→ 1) and -1 (→ ±1 by parity). XLA's own integer `power` only looks at the
/// low 6 exponent bits, so `115^119` wrapped in i32 came out as `115^55`
/// (regression test `tests/fuzz_regressions/numerics.rs::int_pow_uses_every_exponent_bit`).
fn int_pow(e: &mut Emitter<'_>, x: &str, y: &str, s: &Shape, dt: DType) -> String {
    let t = ty(s, dt);
    let b = ty(s, DType::Bool);
    let int = |e: &mut Emitter<'_>, v: i64| e.constant(Literal::Int(v), s, dt);
    let cmp = |e: &mut Emitter<'_>, c: CmpOp, p: &str, q: &str| {
        e.op(
            "stablehlo.compare",
            &[(p, t.clone()), (q, t.clone())],
            &compare_attr(c, dt),
            &b,
        )
    };
    let select = |e: &mut Emitter<'_>, c: &str, p: &str, q: &str| e.select(c, p, q, s, dt);
    let (zero, one, minus_one) = (int(e, 0), int(e, 1), int(e, -1));
    let mut acc = one.clone();
    let mut base = x.to_string();
    let mut exp = y.to_string();
    let bits = if dt == DType::I64 { 63 } else { 31 };
    for i in 0..bits {
        let low = e.eltwise("stablehlo.and", &[&exp, &one], s, dt, dt);
        let set = cmp(e, CmpOp::Eq, &low, &one);
        let times = e.eltwise("stablehlo.multiply", &[&acc, &base], s, dt, dt);
        acc = select(e, &set, &times, &acc);
        if i + 1 < bits {
            base = e.eltwise("stablehlo.multiply", &[&base, &base], s, dt, dt);
            exp = e.eltwise("stablehlo.shift_right_logical", &[&exp, &one], s, dt, dt);
        }
    }
    // Negative exponents: 1 for base 1, ±1 for base -1, else 0.
    let odd = e.eltwise("stablehlo.and", &[y, &one], s, dt, dt);
    let is_odd = cmp(e, CmpOp::Eq, &odd, &one);
    let parity = select(e, &is_odd, &minus_one, &one);
    let is_minus_one = cmp(e, CmpOp::Eq, x, &minus_one);
    let is_one = cmp(e, CmpOp::Eq, x, &one);
    let neg = select(e, &is_minus_one, &parity, &zero);
    let neg = select(e, &is_one, &one, &neg);
    let negative = cmp(e, CmpOp::Lt, y, &zero);
    select(e, &negative, &neg, &acc)
}

/// `x` with subnormals replaced by a zero of the same sign, for the float
/// dtypes whose arithmetic flushes them (f32, f64, bf16); other dtypes as is.
pub(super) fn flush_subnormals(e: &mut Emitter<'_>, x: &str, s: &Shape, dt: DType) -> String {
    let min_normal = match dt {
        DType::F32 | DType::BF16 => f32::MIN_POSITIVE as f64,
        DType::F64 => f64::MIN_POSITIVE,
        _ => return x.to_string(),
    };
    let t = ty(s, dt);
    let b = ty(s, DType::Bool);
    let abs = e.eltwise("stablehlo.abs", &[x], s, dt, dt);
    let limit = e.constant(Literal::Float(min_normal), s, dt);
    let tiny = e.op(
        "stablehlo.compare",
        &[(&abs, t.clone()), (&limit, t.clone())],
        &compare_attr(CmpOp::Lt, dt),
        &b,
    );
    let zero = e.constant(Literal::Float(0.0), s, dt);
    let signed_zero = e.eltwise("stablehlo.multiply", &[x, &zero], s, dt, dt);
    e.op(
        "stablehlo.select",
        &[(&tiny, b), (&signed_zero, t.clone()), (x, t.clone())],
        "",
        &t,
    )
}

/// NaN-propagating maximum/minimum. XLA's CPU backend may lower plain
/// `stablehlo.maximum` to instructions that drop NaNs (notably inside
/// reductions), so float extrema select a NaN operand explicitly.
fn extremum(e: &mut Emitter<'_>, name: &str, x: &str, y: &str, s: &Shape, dt: DType) -> String {
    let m = e.eltwise(name, &[x, y], s, dt, dt);
    if !dt.is_float() {
        return m;
    }
    let t = ty(s, dt);
    let b = ty(s, DType::Bool);
    let ne = compare_attr(CmpOp::Ne, dt);
    let xn = e.op(
        "stablehlo.compare",
        &[(x, t.clone()), (x, t.clone())],
        &ne,
        &b,
    );
    let yn = e.op(
        "stablehlo.compare",
        &[(y, t.clone()), (y, t.clone())],
        &ne,
        &b,
    );
    let r1 = e.op(
        "stablehlo.select",
        &[(&yn, b.clone()), (y, t.clone()), (&m, t.clone())],
        "",
        &t,
    );
    e.op(
        "stablehlo.select",
        &[(&xn, b), (x, t.clone()), (&r1, t.clone())],
        "",
        &t,
    )
}

/// Comparison `c` of `x` and `y` (shape `s`, operand dtype `dt`), a bool result.
pub(super) fn compare(
    e: &mut Emitter<'_>,
    c: CmpOp,
    x: &str,
    y: &str,
    s: &Shape,
    dt: DType,
) -> String {
    // XLA's CPU bf16 `EQ`/`NE` see a subnormal at its true value while the
    // ordered compares (and the interpreter) read it as zero, so 9e-41 was
    // neither equal to nor greater than 0. Flush bf16 operands explicitly
    // (regression test `tests/semantics/fuzz_subnormals.rs::bf16_compare_reads_subnormals_as_zero`).
    let (x, y) = if dt == DType::BF16 {
        (flush_subnormals(e, x, s, dt), flush_subnormals(e, y, s, dt))
    } else {
        (x.to_string(), y.to_string())
    };
    let (x, y) = (x.as_str(), y.as_str());
    let t = ty(s, dt);
    e.op(
        "stablehlo.compare",
        &[(x, t.clone()), (y, t)],
        &compare_attr(c, dt),
        &ty(s, DType::Bool),
    )
}
