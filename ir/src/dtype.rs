//! Element types. The set is closed and small on purpose: every dtype must be
//! lowerable to StableHLO, transferable through PJRT and evaluable by the
//! reference interpreter.

use std::fmt;

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE single precision: the default for model data.
    F32,
    /// IEEE double precision: gradient checks and reference-grade math.
    F64,
    /// bfloat16: f32's range with 8 bits of mantissa (training on accelerators).
    BF16,
    /// IEEE half precision.
    F16,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer: indices, argmax results, class labels.
    I64,
    /// 8-bit unsigned integer (image data).
    U8,
    /// Boolean: comparison results and masks (one byte per element).
    Bool,
}

impl DType {
    /// Every dtype, for tests and fuzzers that sweep the set.
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F64,
        DType::BF16,
        DType::F16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::Bool,
    ];

    /// Bytes per element in the dense little-endian host layout used for transfers.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// Floating-point types (arithmetic like `exp` and `mean` needs one of these).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::BF16 | DType::F16)
    }

    /// Signed or unsigned integer types (not bool).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64 | DType::U8)
    }

    /// Types with ordinary arithmetic: everything except bool.
    pub fn is_numeric(self) -> bool {
        self != DType::Bool
    }

    /// The MLIR element type spelling used by the StableHLO lowering.
    pub fn mlir_name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "ui8",
            DType::Bool => "i1",
        }
    }

    /// Short user-facing name (`f32`, `i64`, `bool`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Rust element types that can cross the host boundary (`from_slice`, `to_vec`).
///
/// Implemented for the primitive types that map one-to-one onto a [`DType`].
pub trait Element: Copy + Send + Sync + 'static + fmt::Debug {
    /// The dtype this Rust type stores.
    const DTYPE: DType;
    /// Appends the little-endian bytes of `self`.
    fn write_le(self, out: &mut Vec<u8>);
    /// Reads one value from exactly `size_in_bytes` little-endian bytes.
    fn read_le(bytes: &[u8]) -> Self;
    /// Converts to f64 (lossless for every type except i64 beyond 2^53).
    fn to_f64(self) -> f64;
}

macro_rules! impl_element {
    ($t:ty, $dt:expr, $n:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dt;
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Self {
                let mut b = [0u8; $n];
                b.copy_from_slice(&bytes[..$n]);
                <$t>::from_le_bytes(b)
            }
            fn to_f64(self) -> f64 {
                f64::from(self)
            }
        }
    };
}

impl_element!(f32, DType::F32, 4);
impl_element!(f64, DType::F64, 8);
impl_element!(half::bf16, DType::BF16, 2);
impl_element!(half::f16, DType::F16, 2);
impl_element!(i32, DType::I32, 4);
impl_element!(u8, DType::U8, 1);

impl Element for i64 {
    const DTYPE: DType = DType::I64;
    fn write_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn read_le(bytes: &[u8]) -> Self {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[..8]);
        i64::from_le_bytes(b)
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
    fn read_le(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
    fn to_f64(self) -> f64 {
        if self {
            1.0
        } else {
            0.0
        }
    }
}
