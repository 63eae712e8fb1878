//! The calls of `fuzz_api.rs`: a small deterministic RNG and the call
//! set (ops, layers, autograd, optimizer steps, reads), each call a value
//! both devices run the same way.

use lazyfuse::ir::SplitMix64;
use lazyfuse::DType;

pub struct Rng(pub SplitMix64);
impl Rng {
    pub fn below(&mut self, n: usize) -> usize {
        self.0.below(n.max(1))
    }
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
    pub fn pick<T: Clone>(&mut self, v: &[T]) -> T {
        v[self.below(v.len())].clone()
    }
    pub fn axis(&mut self) -> isize {
        self.below(9) as isize - 4
    }
    pub fn dims(&mut self) -> Vec<usize> {
        (0..self.below(4)).map(|_| 1 + self.below(4)).collect()
    }
}

#[derive(Clone, Copy, Debug)]
pub enum U {
    Neg,
    Abs,
    Exp,
    Tanh,
    Sigmoid,
    Relu,
    Gelu,
    GeluExact,
    Sin,
    Cos,
    Erf,
    Floor,
    Log1Abs,
    SqrtAbs,
    Rsqrt1Abs,
}
#[derive(Clone, Copy, Debug)]
pub enum B {
    Add,
    Sub,
    Mul,
    Max,
    Min,
    DivSafe,
    OpAdd,
}
#[derive(Clone, Copy, Debug)]
pub enum Sc {
    Add,
    Mul,
    Div,
    Pow,
    Max,
    Lhs,
}
#[derive(Clone, Copy, Debug)]
pub enum R {
    Sum,
    Mean,
    Max,
    Min,
}
#[derive(Clone, Copy, Debug)]
pub enum Sm {
    Softmax,
    LogSoftmax,
    LogSumExp(bool),
}
#[derive(Clone, Copy, Debug)]
pub enum Layer {
    Linear,
    Norm,
    Embedding,
    Dropout,
    Block,
}

/// Spatial ops of vision models, on an entry viewed as NCHW.
#[derive(Clone, Copy, Debug)]
pub enum Sp {
    /// `max_pool2d` (kernel, stride, padding), square.
    MaxPool(usize, usize, usize),
    /// `avg_pool2d` (kernel, stride, padding), square.
    AvgPool(usize, usize, usize),
    /// `upsample_nearest` to (h, w).
    Nearest(usize, usize),
    /// `upsample_bilinear` to (h, w), with `align_corners`.
    Bilinear(usize, usize, bool),
    /// `nn::BatchNorm` in training mode; with the flag, then its running
    /// variance after that step (the statistics update).
    BatchNorm(bool),
    /// `nn::GroupNorm` with this many groups.
    GroupNorm(usize),
}

/// One public API call on pool entries (indices), with its arguments.
#[derive(Clone, Debug)]
pub enum Call {
    Leaf {
        dims: Vec<usize>,
        dtype: DType,
        seed: u64,
        grad: bool,
    },
    Unary(U, usize),
    Binary(B, usize, usize),
    Scalar(Sc, usize, f64),
    Compare(usize, usize),
    CompareScalar(usize, f64),
    Where(usize, usize, usize),
    Reduce(R, usize, Vec<isize>, bool),
    ReduceAll(R, usize),
    Argmax(usize, isize, bool),
    Softmax(Sm, usize, isize),
    Reshape(usize, Vec<usize>),
    Permute(usize, Vec<usize>),
    Transpose(usize, isize, isize),
    Narrow(usize, isize, usize, usize),
    Squeeze(usize, isize),
    Unsqueeze(usize, isize),
    Cat(usize, usize, isize),
    Matmul(usize, usize),
    BroadcastTo(usize, Vec<usize>),
    ToDtype(usize, DType),
    Clamp(usize, f64, f64),
    MaskedFill(usize, usize, f64),
    LayerNormFn(usize, Option<usize>, Option<usize>),
    CrossEntropy(usize, Vec<i64>, Option<i64>),
    Gather(usize, isize, Vec<i64>, Vec<usize>),
    Cumsum(usize, isize),
    /// `topk(k)`: the values, or the indices when the flag is set.
    Topk(usize, usize, bool),
    /// `ragged_dot` of a `[m, k]` entry with a `[sizes.len(), k, n]` leaf
    /// made from the seed (requiring grad when the flag is set).
    RaggedDot(usize, usize, Vec<i64>, u64, bool),
    DropoutFn(usize, f64, i64, bool),
    /// A spatial op on an entry viewed as NCHW (see `spatial.rs`).
    Spatial(Sp, usize),
    Forward(Layer, usize),
    EmbeddingIds(Vec<i64>, Vec<usize>),
    ParamTensor(usize),
    SetRequiresGrad(usize, bool),
    WithGrad(usize),
    Detach(usize),
    NoGrad(Box<Call>),
    Backward(usize, bool),
    /// `mean(.., false)` then `backward` (or `backward_retain_graph`).
    Loss(usize, bool),
    Grad(usize),
    ZeroGrad(usize),
    Step,
    OptZeroGrad,
    Read(usize),
    Item(usize),
    Sync,
}
