//! Deterministic random data for fuzz programs: shapes, dtypes and element
//! values that mix ordinary ranges with the values fusion runtimes get wrong
//! (NaN, ±Inf, -0.0, subnormals, huge magnitudes, integer extremes).

use lazyfuse::ir::{DType, HostTensor, Literal, Shape};

/// lazyfuse's splitmix64 stream (tiny, seedable, identical on every
/// platform) with the draws the generator needs.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// A generator whose whole stream is determined by `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x6a09_e667_f3bc_c908)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut s = lazyfuse::ir::SplitMix64(self.0);
        let v = s.next_u64();
        self.0 = s.0;
        v
    }
    /// Uniform in `0..n` (0 when `n == 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    /// True with probability `1/n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
    /// Uniform in `[lo, hi)`.
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }
    /// A uniformly chosen element.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

/// A dimension: mostly 1..=3 (1 exercises broadcasting), sometimes 4, 5 or 0.
pub fn random_dim(rng: &mut Rng) -> usize {
    rng.pick(&[1, 1, 2, 2, 3, 3, 3, 4, 5, 0, 2, 1])
}

/// A shape of rank 0..=4 with at most 128 elements.
pub fn random_dims(rng: &mut Rng) -> Vec<usize> {
    let rank = rng.pick(&[0, 1, 1, 2, 2, 2, 3, 3, 4]);
    let mut d: Vec<usize> = (0..rank).map(|_| random_dim(rng)).collect();
    while d.iter().product::<usize>() > 128 {
        let i = rng.below(d.len());
        d[i] = d[i].div_ceil(2);
    }
    d
}

/// A dtype, weighted towards f32 (the common case) but covering all eight.
pub fn random_dtype(rng: &mut Rng) -> DType {
    use DType::*;
    rng.pick(&[
        F32, F32, F32, F32, F32, F32, F64, F64, BF16, BF16, F16, F16, I32, I32, I64, I64, U8, Bool,
        Bool, F32,
    ])
}

/// Special float values, as f64 (rounded into the dtype when stored: 1e30 is
/// +Inf in f16, 1e-40 is an f32/bf16 subnormal, 1e-310 an f64 subnormal,
/// 3e-6 an f16 subnormal).
pub const FLOAT_SPECIALS: [f64; 14] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    -0.0,
    0.0,
    1e-40,
    -1e-40,
    1e-310,
    3e-6,
    1e30,
    -1e30,
    1.0,
    -1.0,
    65504.0,
];

/// Integer extremes per dtype.
pub fn int_specials(dtype: DType) -> &'static [i64] {
    match dtype {
        DType::I32 => &[0, -1, 1, i32::MIN as i64, i32::MAX as i64, 7],
        DType::I64 => &[0, -1, 1, i64::MIN, i64::MAX, 1 << 40],
        DType::U8 => &[0, 1, 255, 128, 127],
        _ => &[0, 1],
    }
}

/// Random elements of `dtype`: one of a few value profiles per tensor, with
/// special values sprinkled in (about one element in eight).
pub fn random_data(rng: &mut Rng, dims: &[usize], dtype: DType) -> HostTensor {
    let shape = Shape::new(dims);
    let n = shape.numel();
    let specials = rng.one_in(3) || n <= 2 && rng.one_in(2);
    if dtype.is_float() {
        let (lo, hi) = rng.pick(&[(-3.0, 3.0), (0.1, 4.0), (-1e4, 1e4), (-0.5, 0.5)]);
        let v: Vec<f64> = (0..n)
            .map(|_| {
                if specials && rng.one_in(4) {
                    rng.pick(&FLOAT_SPECIALS)
                } else {
                    rng.range(lo, hi)
                }
            })
            .collect();
        HostTensor::from_f64(&v, shape, dtype)
    } else {
        let v: Vec<i64> = (0..n)
            .map(|_| match dtype {
                DType::Bool => rng.below(2) as i64,
                _ if specials && rng.one_in(4) => rng.pick(int_specials(dtype)),
                DType::U8 => rng.below(256) as i64,
                _ => rng.below(41) as i64 - 20,
            })
            .collect();
        HostTensor::from_i64(&v, shape, dtype)
    }
}

/// Host scalars worth trying as `full` values and host scalar operands of `dtype`.
pub fn scalar_candidates(dtype: DType) -> Vec<f64> {
    match dtype {
        DType::Bool => vec![0.0, 1.0],
        d if d.is_float() => {
            let mut v = FLOAT_SPECIALS.to_vec();
            v.extend_from_slice(&[0.5, 2.0, -3.0, 1e-3]);
            v
        }
        d => {
            let mut v: Vec<f64> = int_specials(d).iter().map(|&x| x as f64).collect();
            v.extend_from_slice(&[2.0, 3.0, -2.0]);
            v
        }
    }
}

/// The literal a host scalar `value` denotes in `dtype` (the rule the
/// `Tensor` API applies to `full` and host scalar operands).
pub fn literal_for(value: f64, dtype: DType) -> Literal {
    match dtype {
        DType::Bool => Literal::Bool(value != 0.0),
        d if d.is_int() && value.fract() == 0.0 && value.abs() < 9.2e18 => {
            Literal::Int(value as i64)
        }
        _ => Literal::Float(value),
    }
}

/// Unit roundoff of a float dtype (half an ulp of 1.0).
pub fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 2f64.powi(-53),
        DType::F32 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => 0.0,
    }
}

/// Largest finite value of a float dtype.
pub fn max_finite(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::MAX,
        DType::F32 => f32::MAX as f64,
        DType::F16 => 65504.0,
        DType::BF16 => 3.3895313892515355e38,
        _ => f64::INFINITY,
    }
}

/// The next representable value of every element of a float tensor, towards
/// +Inf (`up`) or -Inf: a one-ulp perturbation that stays in the dtype.
pub fn nudge(t: &HostTensor, up: bool) -> HostTensor {
    let w = t.dtype.size_in_bytes();
    let mut bytes = Vec::with_capacity(t.bytes.len());
    for chunk in t.bytes.chunks_exact(w) {
        let mut b = [0u8; 8];
        b[..w].copy_from_slice(chunk);
        let bits = u64::from_le_bytes(b);
        let sign = 1u64 << (8 * w - 1);
        let mag = bits & !sign;
        let exp_all = match t.dtype {
            DType::F64 => 0x7ff0_0000_0000_0000,
            DType::F32 => 0x7f80_0000,
            DType::F16 => 0x7c00,
            _ => 0x7f80, // bf16
        };
        let neg = bits & sign != 0;
        let next = if mag > exp_all || (mag == exp_all && neg != up) {
            bits // NaN, or an infinity moving outwards: unchanged
        } else if mag == 0 {
            if up {
                1
            } else {
                sign | 1
            }
        } else if neg == up {
            bits - 1 // towards zero
        } else {
            bits + 1 // away from zero (the largest finite becomes an infinity)
        };
        bytes.extend_from_slice(&next.to_le_bytes()[..w]);
    }
    HostTensor {
        shape: t.shape.clone(),
        dtype: t.dtype,
        bytes,
    }
}

/// Dims and dtype of a fresh input of any dtype.
pub fn any_input(rng: &mut Rng) -> (Vec<usize>, DType) {
    (random_dims(rng), random_dtype(rng))
}

/// Dims and dtype of a fresh numeric input (bool becomes i32).
pub fn numeric_input(rng: &mut Rng) -> (Vec<usize>, DType) {
    let d = random_dtype(rng);
    (
        random_dims(rng),
        if d.is_numeric() { d } else { DType::I32 },
    )
}

/// Dims and dtype of a fresh float input (other dtypes become f32).
pub fn float_input(rng: &mut Rng) -> (Vec<usize>, DType) {
    let d = random_dtype(rng);
    (random_dims(rng), if d.is_float() { d } else { DType::F32 })
}
