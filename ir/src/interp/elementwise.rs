//! Elementwise arithmetic, comparisons, conversions and generated tensors.
//!
//! Floats are computed in f64 and rounded once to the output dtype; integers
//! are computed in wrapping i64 and wrapped to the output dtype (the low bits
//! of an i64 result are the result of the same wrapping op in i32 or u8).

use super::layout::StridedIndex;
use crate::{BinaryOp, CmpOp, DType, HostTensor, Literal, Shape, UnaryOp};

/// Element values widened for computation: floats exactly as f64, integers and
/// bools exactly as i64.
pub(crate) enum Values {
    F(Vec<f64>),
    I(Vec<i64>),
}

/// Smallest positive normal value of the dtypes whose arithmetic flushes
/// subnormals to zero, or `None` for dtypes that keep them.
///
/// lazyfuse's float semantics follow XLA on CPU and GPU: f32, f64 and bf16
/// arithmetic treats subnormal operands as zero (DAZ) and flushes subnormal
/// results to zero (FTZ), keeping the sign. f16 is computed in f32, where
/// every f16 subnormal is a normal number, so f16 keeps its subnormals.
/// Layout ops and `where_cond` move bits and never flush, and neither do
/// float `neg` and `abs`: XLA lowers them to a sign-bit flip/clear, so a
/// subnormal operand keeps its magnitude (found by the differential fuzzer,
/// `tests/semantics/fuzz_subnormals.rs::neg_and_abs_keep_subnormals`).
pub fn flush_threshold(dtype: DType) -> Option<f64> {
    match dtype {
        DType::F32 | DType::BF16 => Some(f32::MIN_POSITIVE as f64),
        DType::F64 => Some(f64::MIN_POSITIVE),
        _ => None,
    }
}

/// Flushes subnormals of `dtype` in `v` to signed zero.
fn flush(v: &mut [f64], dtype: DType) {
    if let Some(t) = flush_threshold(dtype) {
        for x in v.iter_mut() {
            if *x != 0.0 && x.abs() < t {
                *x = 0.0f64.copysign(*x);
            }
        }
    }
}

impl Values {
    /// The widened elements of `t`, as arithmetic sees them (subnormals of
    /// flushing dtypes read as zero).
    pub(crate) fn of(t: &HostTensor) -> Self {
        if t.dtype.is_float() {
            let mut v = t.to_f64_vec();
            flush(&mut v, t.dtype);
            Values::F(v)
        } else {
            Values::I(t.to_i64_vec())
        }
    }

    /// Encodes an arithmetic result into `dtype`: f64 values round to nearest
    /// (subnormal results of flushing dtypes become zero) or convert like Rust
    /// `as` for integer dtypes; i64 values wrap (or round for floats).
    pub(crate) fn encode(&self, shape: Shape, dtype: DType) -> HostTensor {
        match self {
            Values::F(v) => {
                let h = HostTensor::from_f64(v, shape, dtype);
                if flush_threshold(dtype).is_none() {
                    return h;
                }
                let mut r = h.to_f64_vec();
                flush(&mut r, dtype);
                HostTensor::from_f64(&r, h.shape, dtype)
            }
            Values::I(v) => HostTensor::from_i64(v, shape, dtype),
        }
    }
}

/// `f(a[i], b[j])` over the broadcast of `a` (shape `sa`) and `b` (shape `sb`) to `out`.
pub(crate) fn zip_broadcast<T: Copy, R>(
    (a, sa): (&[T], &Shape),
    (b, sb): (&[T], &Shape),
    out: &Shape,
    f: impl Fn(T, T) -> R,
) -> Vec<R> {
    let ia = StridedIndex::broadcast(sa, out);
    let ib = StridedIndex::broadcast(sb, out);
    ia.zip(ib).map(|(i, j)| f(a[i], b[j])).collect()
}

/// NaN-propagating maximum; `max(-0.0, +0.0)` is `+0.0` (IEEE 754-2019 `maximum`).
pub(crate) fn fmax(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a > b || (a == b && b.is_sign_negative()) {
        a
    } else {
        b
    }
}

/// NaN-propagating minimum; `min(-0.0, +0.0)` is `-0.0` (IEEE 754-2019 `minimum`).
pub(crate) fn fmin(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a < b || (a == b && a.is_sign_negative()) {
        a
    } else {
        b
    }
}

fn unary_f(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Relu => fmax(x, 0.0),
        UnaryOp::Gelu => 0.5 * x * (1.0 + (0.7978845608028654 * (x + 0.044715 * x * x * x)).tanh()),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Erf => erf(x),
    }
}

/// The error function to within a few ulps of f64: for `|x| < 6` the series
/// `erf(x) = 2/sqrt(pi) * exp(-x^2) * sum_n 2^n x^(2n+1) / (1*3*...*(2n+1))`,
/// whose terms are all positive (no cancellation); beyond, `erf` is `±1` in
/// f64 (`erfc(6) < 2.2e-17`). NaN stays NaN, `erf(-0.0) = -0.0`.
pub(crate) fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    if a >= 6.0 {
        return 1.0f64.copysign(x);
    }
    let (mut term, mut sum, mut n) = (a, a, 0.0);
    while term > sum * 1e-17 {
        n += 1.0;
        term *= 2.0 * a * a / (2.0 * n + 1.0);
        sum += term;
    }
    let r = 2.0 / std::f64::consts::PI.sqrt() * (-a * a).exp() * sum;
    r.min(1.0).copysign(x)
}

fn unary_i(op: UnaryOp, x: i64) -> i64 {
    match op {
        UnaryOp::Neg => x.wrapping_neg(),
        UnaryOp::Abs => x.wrapping_abs(),
        UnaryOp::Relu => x.max(0),
        _ => unreachable!("infer rejects {} on integers", op.name()),
    }
}

fn binary_f(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Maximum => fmax(a, b),
        BinaryOp::Minimum => fmin(a, b),
    }
}

/// Integer binary op in wrapping i64. Division truncates toward zero; division
/// by zero gives all ones: -1, which wraps to 255 for u8.
fn binary_i(op: BinaryOp, a: i64, b: i64) -> i64 {
    match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div if b == 0 => -1,
        // i32::MIN / -1 = 2^31 in i64, which wraps back to i32::MIN.
        BinaryOp::Div => a.wrapping_div(b),
        BinaryOp::Pow => pow_i(a, b),
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
    }
}

/// Integer power: a negative exponent gives 0, except bases 1 (→ 1) and -1
/// (→ ±1 by parity); otherwise wrapping exponentiation by squaring.
fn pow_i(base: i64, exp: i64) -> i64 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 if exp % 2 == 0 => 1,
            -1 => -1,
            _ => 0,
        };
    }
    let (mut result, mut base, mut exp) = (1i64, base, exp as u64);
    while exp > 0 {
        if exp & 1 == 1 {
            result = result.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        exp >>= 1;
    }
    result
}

fn compare<T: PartialOrd>(op: CmpOp, a: T, b: T) -> bool {
    match op {
        CmpOp::Eq => a == b,
        CmpOp::Ne => a != b,
        CmpOp::Lt => a < b,
        CmpOp::Le => a <= b,
        CmpOp::Gt => a > b,
        CmpOp::Ge => a >= b,
    }
}

/// Float `neg`/`abs` as the sign-bit operations they are: exact, no flushing.
fn sign_bit_op(op: UnaryOp, x: &HostTensor) -> HostTensor {
    let w = x.dtype.size_in_bytes();
    let mut bytes = x.bytes.clone();
    for top in bytes.chunks_exact_mut(w).map(|e| &mut e[w - 1]) {
        *top = if op == UnaryOp::Neg {
            *top ^ 0x80
        } else {
            *top & 0x7f
        };
    }
    HostTensor {
        shape: x.shape.clone(),
        dtype: x.dtype,
        bytes,
    }
}

/// Elementwise unary op; the output has `x`'s shape and dtype.
pub(crate) fn unary(op: UnaryOp, x: &HostTensor) -> HostTensor {
    if x.dtype.is_float() && matches!(op, UnaryOp::Neg | UnaryOp::Abs) {
        return sign_bit_op(op, x);
    }
    let out = match Values::of(x) {
        Values::F(v) => Values::F(v.into_iter().map(|x| unary_f(op, x)).collect()),
        Values::I(v) => Values::I(v.into_iter().map(|x| unary_i(op, x)).collect()),
    };
    out.encode(x.shape.clone(), x.dtype)
}

/// Elementwise binary op on operands of one dtype, broadcast to `shape`.
pub(crate) fn binary(op: BinaryOp, a: &HostTensor, b: &HostTensor, shape: Shape) -> HostTensor {
    let out = match (Values::of(a), Values::of(b)) {
        (Values::F(x), Values::F(y)) => Values::F(zip_broadcast(
            (&x, &a.shape),
            (&y, &b.shape),
            &shape,
            |p, q| binary_f(op, p, q),
        )),
        (Values::I(x), Values::I(y)) => Values::I(zip_broadcast(
            (&x, &a.shape),
            (&y, &b.shape),
            &shape,
            |p, q| binary_i(op, p, q),
        )),
        _ => unreachable!("infer checks that operand dtypes match"),
    };
    out.encode(shape, a.dtype)
}

/// Elementwise comparison broadcast to `shape`, producing bool. Any comparison
/// with NaN is false except `ne`.
pub(crate) fn compare_op(op: CmpOp, a: &HostTensor, b: &HostTensor, shape: Shape) -> HostTensor {
    let out: Vec<i64> = match (Values::of(a), Values::of(b)) {
        (Values::F(x), Values::F(y)) => {
            zip_broadcast((&x, &a.shape), (&y, &b.shape), &shape, |p, q| {
                compare(op, p, q) as i64
            })
        }
        (Values::I(x), Values::I(y)) => {
            zip_broadcast((&x, &a.shape), (&y, &b.shape), &shape, |p, q| {
                compare(op, p, q) as i64
            })
        }
        _ => unreachable!("infer checks that operand dtypes match"),
    };
    HostTensor::from_i64(&out, shape, DType::Bool)
}

/// Element type conversion. Float sources: to float rounds to nearest, to an
/// integer truncates toward zero and saturates with NaN → 0 (Rust `as`), to bool
/// is `v != 0` (NaN → true). Integer/bool sources: to an integer wraps (keeps
/// the low bits), to float rounds to nearest once, to bool is `v != 0`.
/// Converting to the same dtype is an exact copy.
pub(crate) fn convert(x: &HostTensor, to: DType) -> HostTensor {
    if x.dtype == to {
        return x.clone();
    }
    Values::of(x).encode(x.shape.clone(), to)
}

/// `value` converted to `dtype` with the [`convert`] rules (a float literal is a
/// float source, an int literal an i64 source, a bool a bool source), repeated
/// over `shape`.
pub(crate) fn constant(value: Literal, shape: &Shape, dtype: DType) -> HostTensor {
    let one = scalar_constant(value, dtype);
    HostTensor {
        shape: shape.clone(),
        dtype,
        bytes: one.bytes.repeat(shape.numel()),
    }
}

/// The rank-0 value a constant literal stores in `dtype`: rounded to the
/// dtype, and a subnormal of a flushing dtype (see [`flush_threshold`])
/// stored as zero of its sign.
///
/// Why: arithmetic reads such a subnormal as zero at run time, but a
/// constant is visible to the compiler, which folds expressions of it
/// with IEEE host arithmetic (XLA's constant folding, LLVM's inside a fused
/// kernel): `log(full(-1e-40))` became NaN fused and `-inf` unfused. Stored
/// flushed, every path computes from the same zero. The lowering and the
/// lifted-scalar packs take constants' bits from here.
pub fn scalar_constant(value: Literal, dtype: DType) -> HostTensor {
    let one = match value {
        Literal::Float(v) => HostTensor::from_f64(&[v], Shape::scalar(), dtype),
        Literal::Int(v) | Literal::Dim(v) => HostTensor::from_i64(&[v], Shape::scalar(), dtype),
        Literal::Bool(b) => HostTensor::from_i64(&[b as i64], Shape::scalar(), dtype),
    };
    match flush_threshold(dtype) {
        Some(t) => {
            let v = one.to_f64_vec()[0];
            if v != 0.0 && v.abs() < t {
                HostTensor::from_f64(&[0.0f64.copysign(v)], Shape::scalar(), dtype)
            } else {
                one
            }
        }
        None => one,
    }
}

/// `start + i * step` for `i in 0..len`: in f64 rounded once for float dtypes,
/// in wrapping i64 then wrapped for integer dtypes.
pub(crate) fn arange(start: Literal, step: Literal, len: usize, dtype: DType) -> HostTensor {
    let shape = Shape::new(&[len]);
    let values = if dtype.is_float() {
        let (start, step) = (start.as_f64(), step.as_f64());
        Values::F((0..len).map(|i| start + i as f64 * step).collect())
    } else {
        let (start, step) = (start.as_i64(), step.as_i64());
        Values::I(
            (0..len)
                .map(|i| start.wrapping_add((i as i64).wrapping_mul(step)))
                .collect(),
        )
    };
    values.encode(shape, dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_power() {
        assert_eq!(pow_i(3, 4), 81);
        assert_eq!(pow_i(-2, 3), -8);
        assert_eq!(pow_i(0, 0), 1);
        assert_eq!(pow_i(5, -1), 0);
        assert_eq!(pow_i(1, -7), 1);
        assert_eq!(pow_i(-1, -7), -1);
        assert_eq!(pow_i(-1, -8), 1);
        assert_eq!(pow_i(2, 64), 0);
        assert_eq!(pow_i(3, 41), 3i64.wrapping_pow(41));
        assert_eq!(pow_i(2, 63), i64::MIN);
        assert_eq!(pow_i(-1, i64::MAX), -1);
        assert_eq!(pow_i(-1, i64::MIN), 1);
    }

    #[test]
    fn erf_matches_known_values() {
        // Reference values from the closed-form tables (Abramowitz & Stegun 7.1).
        for (x, want) in [
            (0.0, 0.0),
            (0.1, 0.1124629160182849),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (3.0, 0.9999779095030014),
            (5.0, 0.9999999999984626),
        ] {
            assert!(
                (erf(x) - want).abs() <= 4.0 * f64::EPSILON * want,
                "erf({x})"
            );
            assert!(
                (erf(-x) + want).abs() <= 4.0 * f64::EPSILON * want,
                "erf(-{x})"
            );
        }
        assert!(erf(-0.0).is_sign_negative() && erf(f64::NAN).is_nan());
        assert_eq!(erf(f64::INFINITY), 1.0);
    }

    #[test]
    fn nan_and_signed_zero_extrema() {
        assert!(fmax(f64::NAN, 1.0).is_nan() && fmax(1.0, f64::NAN).is_nan());
        assert!(fmin(f64::NAN, 1.0).is_nan() && fmin(1.0, f64::NAN).is_nan());
        assert!(fmax(-0.0, 0.0).is_sign_positive() && fmax(0.0, -0.0).is_sign_positive());
        assert!(fmin(-0.0, 0.0).is_sign_negative() && fmin(0.0, -0.0).is_sign_negative());
        assert_eq!(fmax(-3.0, 2.0), 2.0);
        assert_eq!(fmin(-3.0, 2.0), -3.0);
    }
}
