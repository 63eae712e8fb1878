//! Training ops composed from primitives: softmax and friends, cross-entropy,
//! gather, layer norm, dropout, masked fill, clamp and exact GELU (convolution
//! and pooling are in `conv.rs`).
//!
//! Composites need no lowering or gradient rule of their own: they record
//! primitive ops, which fuse with their neighbours and which autograd already
//! differentiates. Each is `#[track_caller]`, so errors and recorded origins
//! name the user's line, and validates its own arguments up front.

use super::create::literal_for;
use super::Tensor;
use crate::{Error, Key, Result};
use lazyfuse_ir::{BinaryOp, DType, Op, Shape};

#[track_caller]
fn op_err(op: &'static str, detail: impl std::fmt::Display, operands: String) -> Error {
    Error::op(op, detail, operands, crate::site::caller())
}

impl Tensor {
    /// Checks what a softmax-family composite needs (a float tensor, a valid
    /// axis) before it records anything, so an `Err` leaves no node behind.
    #[track_caller]
    fn check_softmax(&self, op: &'static str, axis: isize) -> Result<()> {
        self.axis(op, axis, self.rank(), crate::site::caller())?;
        if !self.dtype().is_float() {
            return Err(op_err(op, "needs a float tensor", self.describe()));
        }
        Ok(())
    }

    /// The maximum along `axis` (kept), recorded untracked: the composites
    /// below subtract it only for range, and are shift-invariant in it.
    /// Non-finite maxima become 0 so all-`-inf` rows do not turn into NaN.
    #[track_caller]
    fn stable_shift(&self, axis: isize) -> Result<Tensor> {
        let m = self
            .stop_gradient(crate::site::caller())?
            .max([axis], true)?;
        let finite = m.abs()?.lt(f64::INFINITY)?;
        let zero = Tensor::zeros(&[], self.dtype(), self.device())?;
        finite.where_cond(&m, &zero)
    }

    /// `exp(x) / sum(exp(x))` along `axis`, computed stably.
    #[track_caller]
    pub fn softmax(&self, axis: isize) -> Result<Tensor> {
        self.check_softmax("softmax", axis)?;
        let e = self.sub(&self.stable_shift(axis)?)?.exp()?;
        e.div(&e.sum([axis], true)?)
    }

    /// `log(softmax(x))` along `axis`, computed stably.
    #[track_caller]
    pub fn log_softmax(&self, axis: isize) -> Result<Tensor> {
        self.check_softmax("log_softmax", axis)?;
        let s = self.sub(&self.stable_shift(axis)?)?;
        s.sub(&s.exp()?.sum([axis], true)?.log()?)
    }

    /// `log(sum(exp(x)))` along `axis`, computed stably.
    #[track_caller]
    pub fn logsumexp(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.check_softmax("logsumexp", axis)?;
        let m = self.stable_shift(axis)?;
        let r = self.sub(&m)?.exp()?.sum([axis], true)?.log()?.add(&m)?;
        if keepdim {
            Ok(r)
        } else {
            r.squeeze(axis)
        }
    }

    /// Mean binary cross-entropy of probabilities `self` against `targets`
    /// of the same shape and dtype (`F.binary_cross_entropy`): each log is
    /// clamped at -100, as PyTorch does, so a probability of exactly 0 or 1
    /// gives a finite loss.
    #[track_caller]
    pub fn binary_cross_entropy(&self, targets: &Tensor) -> Result<Tensor> {
        if targets.shape() != self.shape()
            || targets.dtype() != self.dtype()
            || !self.dtype().is_float()
        {
            return Err(op_err(
                "binary_cross_entropy",
                "probabilities and targets must be float tensors of one shape and dtype",
                format!("{}, {}", self.describe(), targets.describe()),
            ));
        }
        let log_p = self.log()?.maximum(-100.0)?;
        let log_q = (1.0 - self)?.log()?.maximum(-100.0)?;
        let ll = targets.mul(&log_p)?.add(&(1.0 - targets)?.mul(&log_q)?)?;
        ll.mean(.., false)?.neg()
    }

    /// Mean cross-entropy of `self` (logits `[..., C]`) against integer class
    /// indices `targets` (`[...]`). Targets equal to `ignore_index` count
    /// neither in the sum nor in the mean (all ignored gives NaN, as in
    /// PyTorch). Indices outside `0..C` cannot be checked on the device and
    /// select no class (their term is 0); use [`Tensor::cross_entropy_ids`]
    /// for targets known on the host, which are range-checked.
    #[track_caller]
    pub fn cross_entropy(&self, targets: &Tensor, ignore_index: Option<i64>) -> Result<Tensor> {
        let describe = || format!("{}, {}", self.describe(), targets.describe());
        if !self.dtype().is_float() {
            return Err(op_err(
                "cross_entropy",
                "logits must be a float tensor",
                describe(),
            ));
        }
        if !targets.dtype().is_int() {
            return Err(op_err(
                "cross_entropy",
                format!(
                    "targets must be integer class indices, got {}",
                    targets.dtype()
                ),
                describe(),
            ));
        }
        let r = self.rank();
        if r == 0 || targets.dims() != &self.dims()[..r - 1] {
            return Err(op_err(
                "cross_entropy",
                "targets must have the logits' shape without the last (class) dim",
                describe(),
            ));
        }
        let c = self.dims()[r - 1];
        let logp = self.log_softmax(-1)?;
        let classes = Tensor::arange(0.0, c as f64, targets.dtype(), self.device())?;
        let onehot = targets.unsqueeze(-1)?.eq(&classes)?;
        let zero = Tensor::zeros(&[], self.dtype(), self.device())?;
        let picked = onehot.where_cond(&logp, &zero)?.sum([-1], false)?;
        match ignore_index {
            None => picked.mean(.., false)?.neg(),
            Some(ig) => {
                let valid = targets.ne(ig as f64)?.to_dtype(self.dtype())?;
                picked
                    .mul(&valid)?
                    .sum(.., false)?
                    .div(&valid.sum(.., false)?)?
                    .neg()
            }
        }
    }

    /// [`Tensor::cross_entropy`] with targets given on the host: every target
    /// must be in `0..C` or equal `ignore_index`, else an `Err` naming it.
    #[track_caller]
    pub fn cross_entropy_ids(&self, targets: &[i64], ignore_index: Option<i64>) -> Result<Tensor> {
        let c = self.dims().last().copied().unwrap_or(0) as i64;
        if let Some((i, &t)) = targets
            .iter()
            .enumerate()
            .find(|(_, &t)| !(0..c).contains(&t) && Some(t) != ignore_index)
        {
            return Err(op_err(
                "cross_entropy",
                format!("target {i} is class {t}, outside 0..{c}"),
                self.describe(),
            ));
        }
        let r = self.rank().max(1);
        let t = Tensor::from_slice(targets, &self.dims()[..r - 1], self.device())?;
        self.cross_entropy(&t, ignore_index)
    }

    /// `out[..., j, ...] = self[..., idx[..., j, ...], ...]` along `axis`
    /// (`torch.gather`); `idx` is integer with `self`'s shape except along
    /// `axis`. Indices clamp into range, like [`Tensor::index_select`].
    #[track_caller]
    pub fn gather(&self, axis: isize, idx: &Tensor) -> Result<Tensor> {
        let a = self.axis("gather", axis, self.rank(), crate::site::caller())?;
        let same_rest = idx.rank() == self.rank()
            && (0..self.rank()).all(|d| d == a || idx.dims()[d] == self.dims()[d]);
        if !idx.dtype().is_int() || !same_rest {
            return Err(op_err(
                "gather",
                format!("indices must be integer with the source's shape except along axis {a}"),
                format!("{}, {}", self.describe(), idx.describe()),
            ));
        }
        let n = self.dims()[a];
        let idx = idx.maximum(0.0)?.minimum(n.saturating_sub(1) as f64)?;
        let plain = |t: &Tensor| {
            t.0.autograd().is_none() && t.0.logical().is_none() && t.0.mesh().is_none()
        };
        if plain(self) && plain(&idx) {
            return self.gather_flat(a, &idx);
        }
        let mut cls = vec![1; self.rank() + 1];
        cls[a + 1] = n;
        let classes = Tensor::arange(0.0, n as f64, idx.dtype(), self.device())?.reshape(&cls)?;
        let onehot = idx.unsqueeze(a as isize + 1)?.eq(&classes)?;
        let zero = Tensor::zeros(&[], self.dtype(), self.device())?;
        onehot
            .where_cond(&self.unsqueeze(a as isize)?, &zero)?
            .sum([a as isize + 1], false)
    }

    /// [`Tensor::gather`] of in-range indices `idx` along `axis` as one
    /// `index_select` from `self` flattened, at the flat offsets of the
    /// picked elements: work in the output's size. The one-hot form `gather`
    /// keeps for values with autograd state, dynamic axes or a mesh (whose
    /// gradient, padding and placement it gets from the ops it is made of)
    /// compares every index with every position along `axis`: 7 to 27 times
    /// jax.jit with `[1024, 1]` indices into `[1024, 1024]`, and a billion
    /// compares with indices as large as the source. (Its sum also turns a
    /// gathered `-0.0` into `+0.0`; this form copies the bits.)
    fn gather_flat(&self, axis: usize, idx: &Tensor) -> Result<Tensor> {
        let (dims, dev) = (idx.dims().to_vec(), self.device());
        // Row-major strides of `self`; the offset sums each coordinate
        // (the index along `axis`, a broadcast iota elsewhere) times its stride.
        let mut strides = vec![1usize; dims.len()];
        for d in (0..dims.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * self.dims()[d + 1];
        }
        let mut flat = idx.to_dtype(DType::I64)?.mul(strides[axis] as f64)?;
        for (d, &n) in dims.iter().enumerate().filter(|&(d, _)| d != axis) {
            let mut along = vec![1; dims.len()];
            along[d] = n;
            let coord = Tensor::arange(0.0, n as f64, DType::I64, dev)?.reshape(&along)?;
            flat = flat.add(&coord.mul(strides[d] as f64)?)?;
        }
        self.reshape(&[self.numel()])?
            .index_select(0, &flat.reshape(&[idx.numel()])?)?
            .reshape(&dims)
    }

    /// `value` where the bool `mask` (broadcast) holds, `self` elsewhere.
    #[track_caller]
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Result<Tensor> {
        // Validate the select before recording the fill value.
        let scalar = Shape::scalar();
        let operands = [
            (mask.shape(), mask.dtype()),
            (&scalar, self.dtype()),
            (self.shape(), self.dtype()),
        ];
        let loc = crate::site::caller();
        lazyfuse_ir::infer(&Op::Select, &operands).map_err(|e| {
            let operands = format!("{}, {}", self.describe(), mask.describe());
            Error::op("masked_fill", e, operands, loc)
        })?;
        let v = Tensor::full(value, &[], self.dtype(), self.device())?;
        mask.where_cond(&v, self)
    }

    /// Clamps into `[lo, hi]` (NaN stays NaN).
    #[track_caller]
    pub fn clamp(&self, lo: f64, hi: f64) -> Result<Tensor> {
        if lo > hi {
            return Err(op_err(
                "clamp",
                format!("lo {lo} > hi {hi}"),
                self.describe(),
            ));
        }
        // Both bounds must be valid scalars of the dtype before either op is recorded.
        self.scalar_operand(
            "clamp",
            literal_for(lo, self.dtype()),
            crate::site::caller(),
        )?;
        self.scalar_operand(
            "clamp",
            literal_for(hi, self.dtype()),
            crate::site::caller(),
        )?;
        self.maximum(lo)?.minimum(hi)
    }

    /// Exact GELU, `0.5 x (1 + erf(x / sqrt(2)))` (see [`Tensor::gelu`] for
    /// the tanh approximation).
    #[track_caller]
    pub fn gelu_exact(&self) -> Result<Tensor> {
        let e = self.mul(std::f64::consts::FRAC_1_SQRT_2)?.erf()?;
        self.mul(&e.add(1.0)?)?.mul(0.5)
    }

    /// Layer normalisation over the last dim: `(x - mean) / sqrt(var + eps)`
    /// (biased variance), then `* weight + bias` when given (shape `[C]`).
    #[track_caller]
    pub fn layer_norm(
        &self,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        // The affine operands must fit before anything is recorded.
        let loc = crate::site::caller();
        let mut shape = self.shape().clone();
        for p in [weight, bias].into_iter().flatten() {
            let operands = [(&shape, self.dtype()), (p.shape(), p.dtype())];
            shape = lazyfuse_ir::infer(&Op::Binary(BinaryOp::Mul), &operands)
                .map_err(|e| {
                    let operands = format!("{}, {}", self.describe(), p.describe());
                    Error::op("layer_norm", e, operands, loc)
                })?
                .0;
        }
        let mu = self.mean([-1], true)?;
        let xc = self.sub(&mu)?;
        let var = xc.mul(&xc)?.mean([-1], true)?;
        let mut y = xc.mul(&var.add(eps)?.rsqrt()?)?;
        if let Some(w) = weight {
            y = y.mul(w)?;
        }
        if let Some(b) = bias {
            y = y.add(b)?;
        }
        Ok(y)
    }

    /// Inverted dropout: zeroes each element with probability `p` and scales
    /// the rest by `1/(1-p)`; identity unless `train`. The mask comes from
    /// [`Tensor::rand_uniform`] with `key`, so fused and unfused runs drop
    /// the same elements.
    #[track_caller]
    pub fn dropout(&self, p: f64, key: impl Into<Key>, train: bool) -> Result<Tensor> {
        if !(0.0..=1.0).contains(&p) {
            return Err(op_err(
                "dropout",
                format!("p = {p} is not in [0, 1]"),
                self.describe(),
            ));
        }
        if !train || p == 0.0 {
            return Ok(self.clone());
        }
        if p == 1.0 {
            return self.mul(0.0);
        }
        // The scaling must be valid for the dtype before the mask is recorded.
        let scalar = Shape::scalar();
        let operands = [(self.shape(), self.dtype()), (&scalar, self.dtype())];
        let loc = crate::site::caller();
        lazyfuse_ir::infer(&Op::Binary(BinaryOp::Mul), &operands)
            .map_err(|e| Error::op("dropout", e, self.describe(), loc))?;
        self.scalar_operand("dropout", literal_for(1.0 / (1.0 - p), self.dtype()), loc)?;
        let dt = if self.dtype().is_float() {
            self.dtype()
        } else {
            DType::F32
        };
        let keep = Tensor::rand_uniform(self.dims(), dt, key, self.device())?.ge(p)?;
        let zero = Tensor::zeros(&[], self.dtype(), self.device())?;
        keep.where_cond(&self.mul(1.0 / (1.0 - p))?, &zero)
    }
}
