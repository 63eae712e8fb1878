//! Dense host arrays: the currency of transfers and of the reference interpreter.

use crate::{DType, Element, Shape};

/// A dense row-major array in host memory, stored as little-endian bytes of its dtype
/// (the exact layout PJRT transfers use).
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Dimensions.
    pub shape: Shape,
    /// Element type of `bytes`.
    pub dtype: DType,
    /// `shape.numel() * dtype.size_in_bytes()` bytes, row-major, little-endian.
    pub bytes: Vec<u8>,
}

impl HostTensor {
    /// Copies typed values into a host tensor. `data.len()` must equal the shape's numel.
    pub fn from_slice<T: Element>(data: &[T], shape: Shape) -> Self {
        assert_eq!(
            data.len(),
            shape.numel(),
            "data length does not match shape"
        );
        let mut bytes = Vec::with_capacity(data.len() * T::DTYPE.size_in_bytes());
        for &v in data {
            v.write_le(&mut bytes);
        }
        HostTensor {
            shape,
            dtype: T::DTYPE,
            bytes,
        }
    }

    /// Reads the values as `T`, which must be this tensor's dtype.
    pub fn to_vec<T: Element>(&self) -> Option<Vec<T>> {
        if T::DTYPE != self.dtype {
            return None;
        }
        let n = self.dtype.size_in_bytes();
        Some(self.bytes.chunks_exact(n).map(T::read_le).collect())
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }

    /// Every element widened to f64 (bools as 0/1; i64 beyond 2^53 rounds).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        let n = self.dtype.size_in_bytes();
        let it = self.bytes.chunks_exact(n);
        match self.dtype {
            DType::F32 => it.map(|b| f32::read_le(b) as f64).collect(),
            DType::F64 => it.map(f64::read_le).collect(),
            DType::BF16 => it.map(|b| half::bf16::read_le(b).to_f64()).collect(),
            DType::F16 => it.map(|b| half::f16::read_le(b).to_f64()).collect(),
            DType::I32 => it.map(|b| i32::read_le(b) as f64).collect(),
            DType::I64 => it.map(|b| i64::read_le(b) as f64).collect(),
            DType::U8 => it.map(|b| b[0] as f64).collect(),
            DType::Bool => it.map(|b| (b[0] != 0) as u8 as f64).collect(),
        }
    }

    /// Every element of an integer or bool tensor as i64 (floats truncate, saturating).
    pub fn to_i64_vec(&self) -> Vec<i64> {
        let n = self.dtype.size_in_bytes();
        let it = self.bytes.chunks_exact(n);
        match self.dtype {
            DType::I32 => it.map(|b| i32::read_le(b) as i64).collect(),
            DType::I64 => it.map(i64::read_le).collect(),
            DType::U8 => it.map(|b| b[0] as i64).collect(),
            DType::Bool => it.map(|b| (b[0] != 0) as i64).collect(),
            _ => self.to_f64_vec().into_iter().map(|v| v as i64).collect(),
        }
    }

    /// Encodes f64 values into `dtype`, rounding once to nearest-even for floats
    /// (bf16/f16 included: no double rounding through f32);
    /// for integer dtypes the value is truncated toward zero and saturated, bool is `v != 0`.
    pub fn from_f64(values: &[f64], shape: Shape, dtype: DType) -> Self {
        assert_eq!(
            values.len(),
            shape.numel(),
            "data length does not match shape"
        );
        let mut bytes = Vec::with_capacity(values.len() * dtype.size_in_bytes());
        for &v in values {
            match dtype {
                DType::F32 => (v as f32).write_le(&mut bytes),
                DType::F64 => v.write_le(&mut bytes),
                DType::BF16 => {
                    half::bf16::from_bits(f64_to_narrow_bits(v, 7, 8)).write_le(&mut bytes)
                }
                DType::F16 => {
                    half::f16::from_bits(f64_to_narrow_bits(v, 10, 5)).write_le(&mut bytes)
                }
                DType::I32 => (v as i32).write_le(&mut bytes),
                DType::I64 => (v as i64).write_le(&mut bytes),
                DType::U8 => bytes.push(v as u8),
                DType::Bool => bytes.push((v != 0.0) as u8),
            }
        }
        HostTensor {
            shape,
            dtype,
            bytes,
        }
    }

    /// Encodes i64 values into an integer or bool `dtype`, wrapping like two's
    /// complement hardware (i32/u8 keep the low bits); bool is `v != 0`.
    /// A float `dtype` gets the value rounded once to nearest-even (no double
    /// rounding through f64 for integers beyond 2^53).
    pub fn from_i64(values: &[i64], shape: Shape, dtype: DType) -> Self {
        assert_eq!(
            values.len(),
            shape.numel(),
            "data length does not match shape"
        );
        let mut bytes = Vec::with_capacity(values.len() * dtype.size_in_bytes());
        for &v in values {
            let (neg, mag) = (v < 0, v.unsigned_abs());
            match dtype {
                DType::F32 => (v as f32).write_le(&mut bytes),
                DType::F64 => (v as f64).write_le(&mut bytes),
                DType::BF16 => half::bf16::from_bits(round_to_bits(neg, mag, 0, 7, 8) as u16)
                    .write_le(&mut bytes),
                DType::F16 => half::f16::from_bits(round_to_bits(neg, mag, 0, 10, 5) as u16)
                    .write_le(&mut bytes),
                DType::I32 => (v as i32).write_le(&mut bytes),
                DType::I64 => v.write_le(&mut bytes),
                DType::U8 => bytes.push(v as u8),
                DType::Bool => bytes.push((v != 0) as u8),
            }
        }
        HostTensor {
            shape,
            dtype,
            bytes,
        }
    }
}

/// Bit pattern of `v` rounded to nearest-even in a narrow IEEE binary format with
/// `man_bits` explicit mantissa bits and `exp_bits` exponent bits (bf16: 7, 8;
/// f16: 10, 5). NaNs stay NaN (quieted, top payload bits kept), signs and
/// infinities are preserved. `half`'s own f64 conversions are not used because
/// they ignore the low 32 mantissa bits (or go through f32), which double-rounds.
pub(crate) fn f64_to_narrow_bits(v: f64, man_bits: u32, exp_bits: u32) -> u16 {
    let bits = v.to_bits();
    let neg = bits >> 63 == 1;
    let field = ((bits >> 52) & 0x7ff) as i32;
    let frac = bits & ((1 << 52) - 1);
    if field == 0x7ff {
        let sign = (neg as u32) << (man_bits + exp_bits);
        let inf = ((1u32 << exp_bits) - 1) << man_bits;
        let nan = if frac == 0 {
            0
        } else {
            (1 << (man_bits - 1)) | (frac >> (52 - man_bits)) as u32
        };
        return (sign | inf | nan) as u16;
    }
    let (mant, exp) = if field == 0 {
        (frac, -1074)
    } else {
        (frac | 1 << 52, field - 1075)
    };
    round_to_bits(neg, mant, exp, man_bits, exp_bits) as u16
}

/// Rounds the exact value `±mant * 2^exp` to nearest-even in the binary format
/// described at [`f64_to_narrow_bits`] (subnormals, overflow to infinity) and
/// returns its bit pattern. Works for formats up to 32 bits wide.
pub(crate) fn round_to_bits(neg: bool, mant: u64, exp: i32, man_bits: u32, exp_bits: u32) -> u32 {
    let sign = (neg as u32) << (man_bits + exp_bits);
    let inf = ((1u32 << exp_bits) - 1) << man_bits;
    if mant == 0 {
        return sign;
    }
    let emin = 2 - (1i32 << (exp_bits - 1)); // 1 - bias
    let log2 = exp + 63 - mant.leading_zeros() as i32;
    // The result is q * 2^ulp_exp with q < 2^(man_bits + 1) (before carry).
    let ulp_exp = log2.max(emin) - man_bits as i32;
    let shift = ulp_exp - exp;
    let q = if shift <= 0 {
        mant << -shift // exact: mant has at most man_bits + 1 significant bits here
    } else if shift > 64 {
        0 // below half an ulp
    } else {
        let (m, s) = (mant as u128, shift as u32);
        let (q, rem, half) = ((m >> s) as u64, m & ((1 << s) - 1), 1u128 << (s - 1));
        q + (rem > half || (rem == half && q & 1 == 1)) as u64
    };
    // Biased exponent and mantissa in one addition: a carry out of the mantissa
    // bumps the exponent, and q < 2^man_bits in the lowest binade is a subnormal.
    let mag = (((ulp_exp - (emin - man_bits as i32)) as u64) << man_bits) + q;
    if mag >= inf as u64 {
        sign | inf
    } else {
        sign | mag as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny deterministic generator for bit patterns.
    fn lcg(state: &mut u64) -> u64 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *state ^ (*state >> 29)
    }

    #[test]
    fn narrow_rounding_matches_hardware_f32() {
        // The generic rounding with f32's parameters must agree with `as f32`.
        let mut s = 1;
        for i in 0..200_000 {
            let v = match i % 3 {
                0 => f64::from_bits(lcg(&mut s)),
                1 => (lcg(&mut s) as i64 as f64) * 2f64.powi((lcg(&mut s) % 300) as i32 - 150),
                _ => f64::from_bits(lcg(&mut s) & !0xffff_ffff) * 1.0000000000000002,
            };
            if v.is_nan() {
                continue;
            }
            let bits = v.to_bits();
            let field = ((bits >> 52) & 0x7ff) as i32;
            let frac = bits & ((1 << 52) - 1);
            let (mant, exp) = if field == 0 {
                (frac, -1074)
            } else {
                (frac | 1 << 52, field - 1075)
            };
            let got = if field == 0x7ff {
                (v as f32).to_bits()
            } else {
                round_to_bits(v < 0.0, mant, exp, 23, 8)
            };
            assert_eq!(got, (v as f32).to_bits(), "{v:e}");
        }
        for v in [
            i64::MAX,
            i64::MIN,
            (1 << 62) + (1 << 38) + 1,
            -(1 << 40) - 1,
            3,
            0,
        ] {
            assert_eq!(
                round_to_bits(v < 0, v.unsigned_abs(), 0, 23, 8),
                (v as f32).to_bits()
            );
        }
    }

    #[test]
    fn narrow_rounding_is_single() {
        // 1 + 2^-11 + 2^-40 is just above the f16 tie between 1 and 1 + 2^-10.
        let v = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        let t = HostTensor::from_f64(
            &[v, 1.0 + 2f64.powi(-11), 65520.0, -1e-9],
            Shape::new(&[4]),
            DType::F16,
        );
        assert_eq!(
            t.to_f64_vec(),
            vec![1.0 + 2f64.powi(-10), 1.0, f64::INFINITY, -0.0]
        );
        assert!(t.to_f64_vec()[3].is_sign_negative());
        // bf16: 2^62 + 2^54 + 1 is above the tie, f64 alone would round it onto the tie.
        let v = (1i64 << 62) + (1 << 54) + 1;
        let t = HostTensor::from_i64(&[v, -3, 257], Shape::new(&[3]), DType::BF16);
        assert_eq!(
            t.to_f64_vec(),
            vec![2f64.powi(62) + 2f64.powi(55), -3.0, 256.0]
        );
        let t = HostTensor::from_f64(
            &[
                f64::NAN,
                f64::NEG_INFINITY,
                2f64.powi(-133),
                2f64.powi(-134) * 1.5,
            ],
            Shape::new(&[4]),
            DType::BF16,
        );
        let v = t.to_f64_vec();
        assert!(v[0].is_nan());
        assert_eq!(
            &v[1..],
            &[f64::NEG_INFINITY, 2f64.powi(-133), 2f64.powi(-133)]
        );
    }
}
