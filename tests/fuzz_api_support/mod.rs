//! The lockstep machinery of `fuzz_api.rs`: the calls (`calls.rs`), one
//! device's side (pool, modules, optimizer) that runs them, and the checks
//! of one call.

use lazyfuse::ir::SplitMix64;
use lazyfuse::nn::{Block, Dropout, Embedding, LayerNorm, Linear, Module, Param};
use lazyfuse::optim::{AdamW, Optimizer, Sgd};
use lazyfuse::{no_grad, pending_ops, DType, Device, HostTensor, Result, Shape, Tensor};
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};

mod calls;
mod spatial;

pub use calls::*;

/// What a call returned (beyond `Ok`).
pub enum Out {
    T(Tensor),
    Grad(Option<Tensor>),
    Host(HostTensor),
    Unit,
}

/// One device's half of the lockstep run.
pub struct Side {
    pub dev: Device,
    pub pool: Vec<Tensor>,
    pub lin: Linear,
    pub ln: LayerNorm,
    pub emb: Embedding,
    pub drop: Dropout,
    pub block: Block,
    pub params: Vec<Param>,
    pub opt: Box<dyn Optimizer>,
    /// `pending_ops` just before the checked call.
    pub before: usize,
}

/// The shapes of a case's modules and its optimizer.
#[derive(Clone, Copy, Debug)]
pub struct Cfg {
    pub d_in: usize,
    pub d_out: usize,
    pub vocab: usize,
    pub adamw: bool,
    pub momentum: f64,
    pub seed: u64,
}

impl Side {
    pub fn new(dev: Device, c: Cfg) -> Result<Side> {
        let lin = Linear::new(c.d_in, c.d_out, c.seed % 2 == 0, c.seed, &dev)?;
        let ln = LayerNorm::new(c.d_out, &dev)?;
        let emb = Embedding::new(c.vocab, c.d_out, 1.0, c.seed + 1, &dev)?;
        let block = Block::new(4, 2, 0.0, c.seed + 2, &dev)?;
        let mut named = lin.parameters();
        named.extend(ln.parameters());
        named.extend(emb.parameters());
        named.extend(block.parameters());
        let params = lazyfuse::optim::params_of(&named);
        let opt: Box<dyn Optimizer> = if c.adamw {
            Box::new(AdamW::with_betas(
                params.clone(),
                0.01,
                (0.9, 0.999),
                1e-2,
                0.01,
            )?)
        } else {
            Box::new(Sgd::new(params.clone(), 0.05, c.momentum, 0.01)?)
        };
        let drop = Dropout::new(0.5, c.seed + 3);
        Ok(Side {
            dev,
            pool: Vec::new(),
            lin,
            ln,
            emb,
            drop,
            block,
            params,
            opt,
            before: 0,
        })
    }

    /// Marks the start of the call whose `Err` must leave the graph unchanged.
    pub fn mark(&mut self) {
        self.before = pending_ops(&self.dev);
    }

    pub fn t(&self, i: usize) -> &Tensor {
        &self.pool[i]
    }

    /// Runs `call`. Helper calls that are not under test (building a safe
    /// operand, uploading indices) run before the last `mark`.
    pub fn apply(&mut self, call: &Call) -> Result<Out> {
        self.mark();
        let t = |s: &Side, i: usize| s.pool[i].clone();
        Ok(Out::T(match call {
            Call::Leaf {
                dims,
                dtype,
                seed,
                grad,
            } => {
                let h = host_data(dims, *dtype, *seed);
                let x = Tensor::from_host(&h, &self.dev)?;
                if *grad {
                    x.with_grad()?
                } else {
                    x
                }
            }
            Call::Unary(u, i) => {
                let x = t(self, *i);
                let safe = |s: &mut Side, one: bool| -> Result<Tensor> {
                    let a = x.abs()?;
                    let a = if one { a.add(1.0)? } else { a };
                    s.mark();
                    Ok(a)
                };
                match u {
                    U::Neg => (-&x)?,
                    U::Abs => x.abs()?,
                    U::Exp => x.exp()?,
                    U::Tanh => x.tanh()?,
                    U::Sigmoid => x.sigmoid()?,
                    U::Relu => x.relu()?,
                    U::Gelu => x.gelu()?,
                    U::GeluExact => x.gelu_exact()?,
                    U::Sin => x.sin()?,
                    U::Cos => x.cos()?,
                    U::Erf => x.erf()?,
                    U::Floor => x.floor()?,
                    U::Log1Abs => safe(self, true)?.log()?,
                    U::SqrtAbs => safe(self, false)?.sqrt()?,
                    U::Rsqrt1Abs => safe(self, true)?.rsqrt()?,
                }
            }
            Call::Binary(b, i, j) => {
                let (x, y) = (t(self, *i), t(self, *j));
                match b {
                    B::Add => x.add(&y)?,
                    B::Sub => x.sub(&y)?,
                    B::Mul => x.mul(&y)?,
                    B::Max => x.maximum(&y)?,
                    B::Min => x.minimum(&y)?,
                    B::OpAdd => (&x + &y)?,
                    B::DivSafe => {
                        let d = y.abs()?.add(1.0)?;
                        self.mark();
                        x.div(&d)?
                    }
                }
            }
            Call::Scalar(s, i, v) => {
                let x = t(self, *i);
                match s {
                    Sc::Add => x.add(*v)?,
                    Sc::Mul => x.mul(*v)?,
                    Sc::Div => x.div(*v)?,
                    Sc::Pow => x.pow(*v)?,
                    Sc::Max => x.maximum(*v)?,
                    Sc::Lhs => (*v - &x)?,
                }
            }
            Call::Compare(i, j) => t(self, *i).lt(self.t(*j))?,
            Call::CompareScalar(i, v) => t(self, *i).ge(*v)?,
            Call::Where(c, i, j) => t(self, *c).where_cond(self.t(*i), self.t(*j))?,
            Call::Reduce(r, i, axes, k) => {
                let x = t(self, *i);
                match r {
                    R::Sum => x.sum(axes, *k)?,
                    R::Mean => x.mean(axes, *k)?,
                    R::Max => x.max(axes, *k)?,
                    R::Min => x.min(axes, *k)?,
                }
            }
            Call::ReduceAll(r, i) => {
                let x = t(self, *i);
                match r {
                    R::Sum => x.sum(.., false)?,
                    R::Mean => x.mean(.., false)?,
                    R::Max => x.max(.., false)?,
                    R::Min => x.min(.., false)?,
                }
            }
            Call::Argmax(i, a, k) => t(self, *i).argmax(*a, *k)?,
            Call::Softmax(s, i, a) => match s {
                Sm::Softmax => t(self, *i).softmax(*a)?,
                Sm::LogSoftmax => t(self, *i).log_softmax(*a)?,
                Sm::LogSumExp(k) => t(self, *i).logsumexp(*a, *k)?,
            },
            Call::Reshape(i, d) => t(self, *i).reshape(d)?,
            Call::Permute(i, p) => {
                // Every other axis spelled negative: both forms are the API.
                let r = p.len() as isize;
                let signed: Vec<isize> = p
                    .iter()
                    .enumerate()
                    .map(|(k, &a)| {
                        if k % 2 == 1 {
                            a as isize - r
                        } else {
                            a as isize
                        }
                    })
                    .collect();
                t(self, *i).permute(&signed)?
            }
            Call::Transpose(i, a, b) => t(self, *i).transpose(*a, *b)?,
            Call::Narrow(i, a, s, l) => t(self, *i).narrow(*a, *s, *l)?,
            Call::Squeeze(i, a) => t(self, *i).squeeze(*a)?,
            Call::Unsqueeze(i, a) => t(self, *i).unsqueeze(*a)?,
            Call::Cat(i, j, a) => Tensor::cat(&[self.t(*i), self.t(*j)], *a)?,
            Call::Matmul(i, j) => t(self, *i).matmul(self.t(*j))?,
            Call::BroadcastTo(i, d) => t(self, *i).broadcast_to(d)?,
            Call::ToDtype(i, d) => t(self, *i).to_dtype(*d)?,
            Call::Clamp(i, lo, hi) => t(self, *i).clamp(*lo, *hi)?,
            Call::MaskedFill(i, m, v) => t(self, *i).masked_fill(self.t(*m), *v)?,
            Call::LayerNormFn(i, w, b) => {
                let (w, b) = (w.map(|w| t(self, w)), b.map(|b| t(self, b)));
                t(self, *i).layer_norm(w.as_ref(), b.as_ref(), 1e-5)?
            }
            Call::CrossEntropy(i, ids, ig) => t(self, *i).cross_entropy_ids(ids, *ig)?,
            Call::Gather(i, a, ids, dims) => {
                let idx = Tensor::from_slice(ids, dims, &self.dev)?;
                self.mark();
                t(self, *i).gather(*a, &idx)?
            }
            Call::Cumsum(i, a) => t(self, *i).cumsum(*a)?,
            Call::Topk(i, k, idx) => {
                let (v, ix) = t(self, *i).topk(*k)?;
                if *idx {
                    ix
                } else {
                    v
                }
            }
            Call::RaggedDot(i, n, sizes, seed, grad) => {
                let x = t(self, *i);
                let k = x.dims().get(1).copied().unwrap_or(1);
                let h = host_data(&[sizes.len(), k, *n], DType::F32, *seed);
                let w = Tensor::from_host(&h, &self.dev)?;
                let w = if *grad { w.with_grad()? } else { w };
                let s = Tensor::from_slice(sizes, &[sizes.len()], &self.dev)?;
                self.mark();
                x.ragged_dot(&w, &s)?
            }
            Call::DropoutFn(i, p, seed, train) => t(self, *i).dropout(*p, *seed as u64, *train)?,
            Call::Spatial(sp, i) => {
                let (x, dev) = (t(self, *i), self.dev.clone());
                spatial::spatial(*sp, &x, &dev, || self.mark())?
            }
            Call::Forward(l, i) => {
                let x = t(self, *i);
                match l {
                    Layer::Linear => self.lin.forward(&x)?,
                    Layer::Norm => self.ln.forward(&x)?,
                    Layer::Embedding => self.emb.forward(&x)?,
                    Layer::Dropout => self.drop.forward(&x)?,
                    Layer::Block => self.block.forward(&x)?,
                }
            }
            Call::EmbeddingIds(ids, dims) => self.emb.forward_ids(ids, dims)?,
            Call::ParamTensor(k) => self.params[*k].tensor(),
            Call::SetRequiresGrad(i, on) => {
                self.t(*i).set_requires_grad(*on)?;
                return Ok(Out::Unit);
            }
            Call::WithGrad(i) => t(self, *i).with_grad()?,
            Call::Detach(i) => t(self, *i).detach()?,
            Call::NoGrad(c) => return no_grad(|| self.apply(c)),
            Call::Backward(i, retain) => {
                if *retain {
                    self.t(*i).backward_retain_graph()?
                } else {
                    self.t(*i).backward()?
                }
                return Ok(Out::Unit);
            }
            Call::Loss(i, retain) => {
                let l = t(self, *i).mean(.., false)?;
                self.mark();
                if *retain {
                    l.backward_retain_graph()?
                } else {
                    l.backward()?
                }
                return Ok(Out::Unit);
            }
            Call::Grad(i) => return Ok(Out::Grad(self.t(*i).grad())),
            Call::ZeroGrad(i) => {
                self.t(*i).zero_grad();
                return Ok(Out::Unit);
            }
            Call::Step => {
                self.opt.step()?;
                return Ok(Out::Unit);
            }
            Call::OptZeroGrad => {
                self.opt.zero_grad();
                return Ok(Out::Unit);
            }
            Call::Read(i) => return Ok(Out::Host(self.t(*i).to_host()?)),
            Call::Item(i) => {
                let v = self.t(*i).item::<f32>()?;
                return Ok(Out::Host(HostTensor::from_f64(
                    &[v as f64],
                    Shape::scalar(),
                    DType::F32,
                )));
            }
            Call::Sync => {
                lazyfuse::sync();
                return Ok(Out::Unit);
            }
        }))
    }
}

/// Uniform data in [-2, 2] (integers in -2..=2, bools 0/1), from `seed`.
pub fn host_data(dims: &[usize], dtype: DType, seed: u64) -> HostTensor {
    let mut r = SplitMix64::new(seed);
    let n: usize = dims.iter().product();
    let shape = Shape::new(dims);
    if dtype.is_float() {
        HostTensor::from_f64(
            &(0..n).map(|_| r.range(-2.0, 2.0)).collect::<Vec<_>>(),
            shape,
            dtype,
        )
    } else if dtype == DType::Bool {
        HostTensor::from_i64(
            &(0..n).map(|_| r.below(2) as i64).collect::<Vec<_>>(),
            shape,
            dtype,
        )
    } else {
        HostTensor::from_i64(
            &(0..n).map(|_| r.below(5) as i64 - 2).collect::<Vec<_>>(),
            shape,
            dtype,
        )
    }
}

/// Whether a call on bit-identical inputs gives bit-identical outputs on
/// both devices (data movement, sign and order ops, integer arithmetic).
pub fn exact_call(c: &Call, out_dtype: DType) -> bool {
    match c {
        Call::Leaf { .. } | Call::Compare(..) | Call::CompareScalar(..) | Call::Where(..) => true,
        Call::Argmax(..) | Call::Reshape(..) | Call::Permute(..) | Call::Transpose(..) => true,
        Call::Narrow(..) | Call::Squeeze(..) | Call::Unsqueeze(..) | Call::Cat(..) => true,
        Call::BroadcastTo(..) | Call::ToDtype(..) | Call::Clamp(..) | Call::MaskedFill(..) => true,
        Call::Detach(..) | Call::WithGrad(..) | Call::Gather(..) | Call::Topk(..) => true,
        Call::Unary(u, _) => matches!(u, U::Neg | U::Abs | U::Relu | U::Floor),
        Call::Binary(b, ..) => matches!(b, B::Max | B::Min) || !out_dtype.is_float(),
        Call::Scalar(s, ..) => matches!(s, Sc::Max) || !out_dtype.is_float(),
        Call::Reduce(r, ..) | Call::ReduceAll(r, _) => {
            matches!(r, R::Max | R::Min) || !out_dtype.is_float()
        }
        Call::NoGrad(c) => exact_call(c, out_dtype),
        _ => false,
    }
}

/// Pool entries a call reads.
pub fn inputs(c: &Call) -> Vec<usize> {
    match c {
        Call::Unary(_, i) | Call::Scalar(_, i, _) | Call::CompareScalar(i, _) => vec![*i],
        Call::Reduce(_, i, ..) | Call::ReduceAll(_, i) | Call::Argmax(i, ..) => vec![*i],
        Call::Softmax(_, i, _) | Call::Reshape(i, _) | Call::Permute(i, _) => vec![*i],
        Call::Transpose(i, ..) | Call::Narrow(i, ..) | Call::Squeeze(i, _) => vec![*i],
        Call::Unsqueeze(i, _) | Call::BroadcastTo(i, _) | Call::ToDtype(i, _) => vec![*i],
        Call::Clamp(i, ..) | Call::CrossEntropy(i, ..) | Call::Gather(i, ..) => vec![*i],
        Call::Cumsum(i, _) | Call::Topk(i, ..) | Call::RaggedDot(i, ..) => vec![*i],
        Call::Spatial(_, i) => vec![*i],
        Call::Loss(i, _) | Call::Backward(i, _) | Call::Grad(i) | Call::ZeroGrad(i) => vec![*i],
        Call::SetRequiresGrad(i, _) | Call::Read(i) | Call::Item(i) => vec![*i],
        Call::DropoutFn(i, ..) | Call::Forward(_, i) | Call::Detach(i) | Call::WithGrad(i) => {
            vec![*i]
        }
        Call::Binary(_, i, j) | Call::Compare(i, j) | Call::Cat(i, j, _) => vec![*i, *j],
        Call::Matmul(i, j) | Call::MaskedFill(i, j, _) => vec![*i, *j],
        Call::Where(a, b, c) => vec![*a, *b, *c],
        Call::LayerNormFn(i, w, b) => [Some(*i), *w, *b].into_iter().flatten().collect(),
        Call::NoGrad(c) => inputs(c),
        _ => vec![],
    }
}

/// Floats within `1e-3 * (1 + |ref|)`, NaN = NaN, infinities exact;
/// integers and bools exact.
pub fn compare(what: &str, a: &HostTensor, b: &HostTensor) -> std::result::Result<(), String> {
    if a.shape != b.shape || a.dtype != b.dtype {
        return Err(format!(
            "{what}: {}{} vs {}{}",
            a.dtype, a.shape, b.dtype, b.shape
        ));
    }
    let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
    for (k, (p, q)) in x.iter().zip(&y).enumerate() {
        let ok = if !a.dtype.is_float() {
            p == q
        } else {
            (p.is_nan() && q.is_nan())
                || p == q
                || (p.is_finite() && q.is_finite() && (p - q).abs() <= 1e-3 * (1.0 + q.abs()))
        };
        if !ok {
            return Err(format!(
                "{what}: element {k}: {p} vs reference {q}\n  got {x:?}\n  ref {y:?}"
            ));
        }
    }
    Ok(())
}

pub fn meta(t: &Tensor) -> String {
    format!(
        "{}{:?} rg={} leaf={}",
        t.dtype(),
        t.dims(),
        t.requires_grad(),
        t.is_leaf()
    )
}

#[derive(Default)]
pub struct Stats {
    pub cases: usize,
    pub calls: usize,
    pub ok: usize,
    pub err: usize,
    pub backward: usize,
    pub steps: usize,
}

/// The lockstep driver of one case.
pub struct Case {
    pub rng: Rng,
    pub sides: [Side; 2],
    pub exact: Vec<bool>,
    pub log: String,
    pub ncall: usize,
    pub cfg: Cfg,
}

impl Case {
    pub fn entry(&mut self, pred: impl Fn(&Tensor) -> bool) -> usize {
        let hits: Vec<usize> = (0..self.sides[0].pool.len())
            .filter(|&i| pred(&self.sides[0].pool[i]))
            .collect();
        if hits.is_empty() || self.rng.one_in(6) {
            self.rng.below(self.sides[0].pool.len())
        } else {
            self.rng.pick(&hits)
        }
    }
    pub fn any(&mut self) -> usize {
        self.rng.below(self.sides[0].pool.len())
    }
    /// An entry whose values are bit-identical on both devices.
    pub fn exact(&mut self) -> usize {
        let hits: Vec<usize> = (0..self.exact.len()).filter(|&i| self.exact[i]).collect();
        if hits.is_empty() {
            self.any()
        } else {
            self.rng.pick(&hits)
        }
    }
    pub fn dims_of(&self, i: usize) -> Vec<usize> {
        self.sides[0].pool[i].dims().to_vec()
    }

    /// Runs `call` on both sides and checks the contract.
    pub fn step(&mut self, call: &Call, st: &mut Stats) -> std::result::Result<(), String> {
        let n = self.ncall;
        self.ncall += 1;
        let args: Vec<String> = inputs(call)
            .iter()
            .map(|&i| format!("t{i}: {}", meta(&self.sides[0].pool[i])))
            .collect();
        let _ = write!(self.log, "  #{n}: {call:?} on [{}] -> ", args.join(", "));
        let mut res = Vec::new();
        for (k, s) in self.sides.iter_mut().enumerate() {
            let r = catch_unwind(AssertUnwindSafe(|| s.apply(call))).map_err(|p| {
                format!(
                    "PANIC on side {k}: {}",
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default()
                )
            })?;
            if let Err(e) = &r {
                let now = pending_ops(&s.dev);
                if now != s.before {
                    return Err(format!(
                        "Err on side {k} left {} node(s) in the graph ({} -> {now}): {e}",
                        now as isize - s.before as isize,
                        s.before
                    ));
                }
            }
            res.push(r);
        }
        st.calls += 1;
        let (b, a) = (res.pop().unwrap(), res.pop().unwrap());
        let (a, b) = match (a, b) {
            (Err(ea), Err(_)) => {
                st.err += 1;
                let _ = writeln!(
                    self.log,
                    "Err (both): {}",
                    ea.to_string().lines().next().unwrap_or("")
                );
                return Ok(());
            }
            (Ok(_), Err(e)) => {
                return Err(format!("Ok on the XLA device, Err on the interpreter: {e}"))
            }
            (Err(e), Ok(_)) => {
                return Err(format!("Err on the XLA device, Ok on the interpreter: {e}"))
            }
            (Ok(a), Ok(b)) => (a, b),
        };
        st.ok += 1;
        st.backward += matches!(call, Call::Backward(..) | Call::Loss(..)) as usize;
        st.steps += matches!(call, Call::Step) as usize;
        match (a, b) {
            (Out::T(x), Out::T(y)) | (Out::Grad(Some(x)), Out::Grad(Some(y))) => {
                if meta(&x) != meta(&y) {
                    return Err(format!("metadata differs: {} vs {}", meta(&x), meta(&y)));
                }
                let ins = inputs(call);
                let ex = matches!(call, Call::Leaf { .. })
                    || (exact_call(call, x.dtype())
                        && !ins.is_empty()
                        && ins.iter().all(|&i| self.exact[i]));
                let _ = writeln!(
                    self.log,
                    "Ok t{}: {}{}",
                    self.exact.len(),
                    meta(&x),
                    if ex { " exact" } else { "" }
                );
                self.exact.push(ex);
                self.sides[0].pool.push(x);
                self.sides[1].pool.push(y);
            }
            (Out::Grad(None), Out::Grad(None)) => {
                let _ = writeln!(self.log, "Ok: no grad");
            }
            (Out::Grad(x), Out::Grad(y)) => {
                return Err(format!(
                    "grad presence differs: {} vs {}",
                    x.is_some(),
                    y.is_some()
                ))
            }
            (Out::Host(x), Out::Host(y)) => {
                let _ = writeln!(self.log, "Ok: read");
                compare("read", &x, &y)?;
            }
            (Out::Unit, Out::Unit) => {
                let _ = writeln!(self.log, "Ok");
            }
            _ => return Err("different kinds of result".into()),
        }
        Ok(())
    }

    /// Reads every live value on both sides: pool tensors, their gradients,
    /// parameters and parameter gradients.
    pub fn check_all(&self) -> std::result::Result<(), String> {
        let [a, b] = &self.sides;
        let read = |t: &Tensor, what: &str| {
            t.to_host()
                .map_err(|e| format!("{what}: reading failed: {e}"))
        };
        let pairs = a
            .pool
            .iter()
            .zip(&b.pool)
            .enumerate()
            .map(|(i, (x, y))| (format!("t{i}"), x.clone(), y.clone()));
        let params = a
            .params
            .iter()
            .zip(&b.params)
            .enumerate()
            .map(|(i, (x, y))| (format!("param {i}"), x.tensor(), y.tensor()));
        for (what, x, y) in pairs.chain(params).collect::<Vec<_>>() {
            compare(&what, &read(&x, &what)?, &read(&y, &what)?)?;
            match (x.grad(), y.grad()) {
                (Some(gx), Some(gy)) => compare(
                    &format!("grad of {what}"),
                    &read(&gx, &what)?,
                    &read(&gy, &what)?,
                )?,
                (None, None) => {}
                _ => return Err(format!("{what}: grad presence differs")),
            }
        }
        Ok(())
    }
}
