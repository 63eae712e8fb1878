//! The closed op set. Every variant carries its attributes, so shape/dtype
//! inference, hashing, lowering and the reference interpreter each see the
//! whole meaning of a node from `(op, inputs)` alone.

use crate::{ConvSpec, CustomKernel, DType, Shape};
use smallvec::SmallVec;
use std::hash::{Hash, Hasher};

/// Axis lists (permutations, reduced axes), inline up to rank 4.
pub type Axes = SmallVec<[usize; 4]>;

/// Per dimension of a value, the index of the device-mesh axis it is split
/// over, or `None`: the layout a [`Op::ShardingConstraint`] asks for. The
/// IR knows meshes only as these indices; what an index names is the
/// runtime's business.
pub type SplitAxes = SmallVec<[Option<u8>; 6]>;

/// A host scalar literal (for `full`, scalar operands and constants).
/// Floats compare and hash by bit pattern so NaN and -0.0 are distinct literals.
#[derive(Clone, Copy, Debug)]
pub enum Literal {
    /// A float value (also used for integral values meant for float dtypes).
    Float(f64),
    /// An integer value, exact for every integer dtype.
    Int(i64),
    /// A boolean value.
    Bool(bool),
    /// A run-time integer the program computes on the host: a dynamic
    /// axis's logical length or a run-time slice start. Always a region
    /// parameter (never baked into code, whatever its value, 0 and 1
    /// included), so one executable serves every length in a bucket.
    Dim(i64),
}

impl Literal {
    /// The literal as f64 (ints may round beyond 2^53).
    pub fn as_f64(self) -> f64 {
        match self {
            Literal::Float(v) => v,
            Literal::Int(v) | Literal::Dim(v) => v as f64,
            Literal::Bool(b) => b as u8 as f64,
        }
    }

    /// The literal as i64 (floats truncate toward zero, saturating).
    pub fn as_i64(self) -> i64 {
        match self {
            Literal::Float(v) => v as i64,
            Literal::Int(v) | Literal::Dim(v) => v,
            Literal::Bool(b) => b as i64,
        }
    }

    /// Bits used for equality and hashing.
    fn key(self) -> (u8, u64) {
        match self {
            Literal::Float(v) => (0, v.to_bits()),
            Literal::Int(v) => (1, v as u64),
            Literal::Bool(b) => (2, b as u64),
            Literal::Dim(v) => (3, v as u64),
        }
    }
}

impl PartialEq for Literal {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for Literal {}
impl Hash for Literal {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state)
    }
}

macro_rules! op_family {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $v:ident => $s:literal),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($(#[$vdoc])* #[doc = concat!("The `", $s, "` op.")] $v),* }
        impl $name {
            /// Every member of the family, for sweeping tests.
            pub const ALL: &'static [$name] = &[$($name::$v),*];
            /// The user-facing op name.
            pub fn name(self) -> &'static str {
                match self { $($name::$v => $s),* }
            }
        }
    };
}

op_family!(
    /// Elementwise unary ops. All but `Neg` and `Abs` need a float dtype.
    UnaryOp {
        Neg => "neg", Abs => "abs", Exp => "exp", Log => "log", Sqrt => "sqrt",
        Rsqrt => "rsqrt", Tanh => "tanh", Sigmoid => "sigmoid",
        /// max(x, 0); defined for every numeric dtype.
        Relu => "relu",
        /// tanh approximation: 0.5x(1+tanh(0.7978845608028654(x+0.044715x^3))).
        Gelu => "gelu",
        Sin => "sin", Cos => "cos", Floor => "floor",
        /// The Gauss error function (exact GELU and normal CDFs need it).
        Erf => "erf",
    }
);

op_family!(
    /// Elementwise binary ops with NumPy broadcasting; both operands share a dtype.
    BinaryOp {
        Add => "add", Sub => "sub", Mul => "mul",
        /// Float division, or integer division truncating toward zero (x/0 = -1 as in XLA).
        Div => "div",
        Pow => "pow",
        /// NaN-propagating maximum.
        Maximum => "maximum",
        /// NaN-propagating minimum.
        Minimum => "minimum",
    }
);

op_family!(
    /// Elementwise comparisons with broadcasting, producing bool. NaN compares unequal.
    CmpOp { Eq => "eq", Ne => "ne", Lt => "lt", Le => "le", Gt => "gt", Ge => "ge" }
);

op_family!(
    /// Reductions over a set of axes.
    ReduceOp { Sum => "sum", Mean => "mean", Max => "max", Min => "min" }
);

impl ReduceOp {
    /// The identity element of the reduction in `dt` (what an empty
    /// reduction gives, and what padding becomes before one): 0 for sums,
    /// the lowest value for `max`, the highest for `min`.
    pub fn identity(self, dt: DType) -> Literal {
        match (self, dt) {
            (ReduceOp::Sum | ReduceOp::Mean, DType::Bool) => Literal::Bool(false),
            (ReduceOp::Sum | ReduceOp::Mean, _) => Literal::Int(0),
            (ReduceOp::Max, d) if d.is_float() => Literal::Float(f64::NEG_INFINITY),
            (ReduceOp::Min, d) if d.is_float() => Literal::Float(f64::INFINITY),
            (ReduceOp::Max, DType::I32) => Literal::Int(i32::MIN as i64),
            (ReduceOp::Min, DType::I32) => Literal::Int(i32::MAX as i64),
            (ReduceOp::Max, DType::I64) => Literal::Int(i64::MIN),
            (ReduceOp::Min, DType::I64) => Literal::Int(i64::MAX),
            (ReduceOp::Max, DType::Bool) => Literal::Bool(false),
            (ReduceOp::Min, DType::Bool) => Literal::Bool(true),
            (ReduceOp::Max, _) => Literal::Int(0),
            (ReduceOp::Min, _) => Literal::Int(255),
        }
    }
}

/// One node's operation. The set is closed: lowering and the interpreter match
/// on it exhaustively, so adding an op is a compile error everywhere it matters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// A materialised tensor entering the graph (a region parameter).
    Input {
        /// Shape of the buffer.
        shape: Shape,
        /// Dtype of the buffer.
        dtype: DType,
    },
    /// `value` converted to `dtype` and broadcast to `shape`.
    Constant {
        /// The value before conversion.
        value: Literal,
        /// Result shape.
        shape: Shape,
        /// Result dtype.
        dtype: DType,
    },
    /// 1-D `start + i * step` for `i in 0..len`, computed in `dtype`.
    Arange {
        /// First value.
        start: Literal,
        /// Increment between consecutive values.
        step: Literal,
        /// Number of values.
        len: usize,
        /// Result dtype.
        dtype: DType,
    },
    /// An elementwise unary op.
    Unary(UnaryOp),
    /// An elementwise binary op with broadcasting.
    Binary(BinaryOp),
    /// An elementwise comparison with broadcasting, producing bool.
    Compare(CmpOp),
    /// `where(cond, on_true, on_false)`, all three broadcast together.
    Select,
    /// Element type conversion. Float to int truncates toward zero.
    Convert(DType),
    /// Reduce `axes` (sorted, unique). Mean needs a float dtype.
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// Reduced axes, sorted and unique.
        axes: Axes,
        /// Keep reduced axes as size 1.
        keepdim: bool,
    },
    /// Index (i64) of the first maximum along `axis`; NaN counts as the maximum.
    ArgMax {
        /// The axis searched.
        axis: usize,
        /// Keep the axis as size 1.
        keepdim: bool,
    },
    /// Same elements, new shape (row-major order).
    Reshape(Shape),
    /// Output dim `i` is input dim `perm[i]`.
    Permute(Axes),
    /// The operand with the element order along each listed axis (sorted,
    /// unique) reversed: `flip`, and the kernel flip of a convolution's
    /// input gradient.
    Reverse(Axes),
    /// NumPy-style broadcast to the given shape.
    BroadcastTo(Shape),
    /// The operand itself (an identity), declared laid out over a device
    /// mesh as the split says: one entry per dimension. It changes no
    /// value; a program partitioned over many devices keeps the value
    /// split that way there (XLA's sharding constraint). A program on one
    /// device ignores it.
    ShardingConstraint(SplitAxes),
    /// `len` elements from `start` along `axis`.
    Slice {
        /// The sliced axis.
        axis: usize,
        /// First index taken.
        start: usize,
        /// Number of indices taken.
        len: usize,
    },
    /// Concatenation of all inputs along `axis`.
    Concat {
        /// The axis joined along.
        axis: usize,
    },
    /// `len` elements along `axis` from a run-time start: operands `x` and
    /// an integer scalar `start`. As in XLA, the start is clamped into
    /// `0..=dim - len`. Dynamic shapes use it for `narrow` at a start that
    /// changes every step, so the start is data, not code.
    DynamicSlice {
        /// The sliced axis.
        axis: usize,
        /// Number of indices taken.
        len: usize,
    },
    /// `x` with `update` written along `axis` from a run-time start:
    /// operands `x`, `update` (x's shape but a shorter `axis`) and an
    /// integer scalar `start`, clamped into `0..=dim - update_dim` as in
    /// XLA. A growing cache's `cat` is this op into its capacity buffer,
    /// which XLA can do in place when the old buffer is donated.
    DynamicUpdateSlice {
        /// The axis written along.
        axis: usize,
    },
    /// Batched matrix product `[..., m, k] x [..., k, n]` with broadcast batch dims.
    MatMul,
    /// A convolution `lhs [n, c, spatial..] x rhs [o, c / groups, taps..]`
    /// (channels first), with the attributes of StableHLO's convolution.
    Conv(Box<ConvSpec>),
    /// `index_select(x, axis, idx)`: operands `x` and a 1-D integer `idx` of
    /// length `k`; the result is `x` with dim `axis` replaced by `k`, slice `j`
    /// being `x`'s slice `idx[j]`. Indices are clamped into `0..dim` (as XLA's
    /// gather does), so an out-of-range index reads the nearest edge slice.
    /// Embedding lookups are this op on axis 0.
    IndexSelect {
        /// The axis indexed.
        axis: usize,
    },
    /// `x` with `src`'s slices added along `axis` at the indices: operands
    /// `x`, a 1-D integer `idx` of length `k` and `src` (`x`'s shape with
    /// dim `axis` of `k`); slice `j` of `src` is added to slice `idx[j]`
    /// (clamped into `0..dim`, as [`Op::IndexSelect`] reads), repeats
    /// accumulating. The transpose of `index_select`: its gradient, and the
    /// sparse update of a large table.
    ScatterAdd {
        /// The axis indexed.
        axis: usize,
    },
    /// Uniform `[0, 1)` values of float `dtype` and `shape` from a counter-based
    /// generator: element `i` (row-major) is a pure function of `(seed, i)`, so
    /// fused, unfused and interpreted runs draw the same numbers. The single
    /// operand is the seed, an i64 scalar tensor (a tensor, not an attribute,
    /// so a new seed each step never recompiles). See `interp` for the hash.
    RandomUniform {
        /// Result shape.
        shape: Shape,
        /// Result dtype (float).
        dtype: DType,
    },
    /// A user's StableHLO function applied to the operands (see
    /// [`CustomKernel`]).
    Custom(std::sync::Arc<CustomKernel>),
}

impl Op {
    /// A short name for errors, dumps and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Constant { .. } => "constant",
            Op::Arange { .. } => "arange",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Compare(c) => c.name(),
            Op::Select => "where_cond",
            Op::Convert(_) => "to_dtype",
            Op::Reduce { op, .. } => op.name(),
            Op::ArgMax { .. } => "argmax",
            Op::Reshape(_) => "reshape",
            Op::Permute(_) => "permute",
            Op::Reverse(_) => "flip",
            Op::BroadcastTo(_) => "broadcast_to",
            Op::ShardingConstraint(_) => "sharding_constraint",
            Op::Slice { .. } => "narrow",
            Op::Concat { .. } => "cat",
            Op::DynamicSlice { .. } => "dynamic_slice",
            Op::DynamicUpdateSlice { .. } => "dynamic_update_slice",
            Op::MatMul => "matmul",
            Op::Conv(_) => "conv",
            Op::IndexSelect { .. } => "index_select",
            Op::ScatterAdd { .. } => "index_add",
            Op::RandomUniform { .. } => "rand_uniform",
            Op::Custom(_) => "custom",
        }
    }

    /// Relative compile cost used by the planner's region size cap: XLA's
    /// compile time grows much faster with contractions and reductions than
    /// with elementwise ops.
    pub fn compile_cost(&self) -> usize {
        match self {
            Op::Input { .. } | Op::Constant { .. } => 0,
            Op::Reduce { .. } | Op::ArgMax { .. } | Op::ScatterAdd { .. } => 4,
            Op::MatMul | Op::Conv(_) | Op::Custom(_) => 8,
            _ => 1,
        }
    }

    /// Ops that must run as a region of their own (never fused with
    /// neighbours), e.g. ops with side effects or host callbacks. None of
    /// today's ops need it; the planner honours it so such ops are marked
    /// here, not special-cased in the planner.
    pub fn must_stand_alone(&self) -> bool {
        false
    }

    /// True for a rank-0 constant whose value the planner turns into a region
    /// parameter ("scalar lifting"), so a changing learning rate or
    /// bias-correction factor never recompiles. Every value is lifted, 0, 1
    /// and -1 included: a host scalar that reaches one of them (Adam's bias
    /// correction `1 - 0.9^t` is exactly 1 from step 356; a warm-up factor
    /// `min(1, step / warmup)`; a position offset of 0 or 1) would otherwise
    /// change the region's code and compile it again in the middle of a
    /// loop. Baking them in bought nothing measurable: the XLA backend
    /// compiles with its algebraic simplifier off, so `x * 1` is computed
    /// either way. Only booleans, of which there are two, stay literal.
    pub fn is_liftable_scalar(&self) -> bool {
        match self {
            Op::Constant {
                value: Literal::Dim(_),
                shape,
                ..
            } => shape.rank() == 0,
            Op::Constant { shape, dtype, .. } => shape.rank() == 0 && *dtype != DType::Bool,
            _ => false,
        }
    }

    /// True for graph leaves that read a materialised buffer.
    pub fn is_input(&self) -> bool {
        matches!(self, Op::Input { .. })
    }

    /// Number of operands the op takes (`None` = variadic, at least one).
    pub fn arity(&self) -> Option<usize> {
        Some(match self {
            Op::Input { .. } | Op::Constant { .. } | Op::Arange { .. } => 0,
            Op::Unary(_)
            | Op::Convert(_)
            | Op::Reduce { .. }
            | Op::ArgMax { .. }
            | Op::Reshape(_)
            | Op::Permute(_)
            | Op::Reverse(_)
            | Op::BroadcastTo(_)
            | Op::ShardingConstraint(_)
            | Op::Slice { .. }
            | Op::RandomUniform { .. } => 1,
            Op::Binary(_)
            | Op::Compare(_)
            | Op::MatMul
            | Op::Conv(_)
            | Op::IndexSelect { .. }
            | Op::DynamicSlice { .. } => 2,
            Op::Select | Op::DynamicUpdateSlice { .. } | Op::ScatterAdd { .. } => 3,
            Op::Concat { .. } | Op::Custom(_) => return None,
        })
    }
}
