//! API-level differential fuzzing: random short programs of public API calls,
//! autograd, `nn` layers and optimizer steps included, run in lockstep on the
//! XLA device (fusion on) and on `Device::interpreter()` as the reference.
//!
//! Why: the op-level fuzzer (`fuzz_ops.rs`) checks single IR ops and fused
//! graphs of them; this one checks what users actually call. Composites,
//! the autograd tape, `Param` slots and optimizers add their own validation
//! and recording, and each of them must keep the contract of the API:
//!
//! - every call is `Ok` or an `Err` at the call site, never a panic (each call
//!   runs under `catch_unwind`);
//! - an `Err` records nothing (`pending_ops` of the device is unchanged);
//! - both devices agree: both `Err`, or both `Ok` with the same shape, dtype
//!   and autograd state, and values (read mid-program and at the end of each
//!   case: tensors, gradients, parameters) within `1e-3 * (1 + |ref|)` for
//!   floats (NaN matches NaN), exactly for integers and bools.
//!
//! Data is tame (uniform in [-2, 2], dims 1..=4, rank <= 3), ops that could
//! blow up are applied in safe forms (`log(|x| + 1)`, `x / (|y| + 1)`) and
//! discontinuous ops (comparisons, argmax, floor, float-to-int) only read
//! values that are bit-identical on both devices, so a tolerance failure
//! means a real disagreement. Bad arguments (wrong axes, shapes, dtypes,
//! backward on a non-scalar or untracked tensor, out-of-range ids, ...) are
//! mixed in.
//!
//! Knobs: `FUZZ_SEED` (u64, decimal or 0x hex; default fixed),
//! `FUZZ_API_CASES` (default 60 in release, 15 in debug builds),
//! `FUZZ_API_LOG=1` (print every case's call log) and
//! `FUZZ_API_KEEP_GOING=1` (report every failing case, then fail, instead of
//! stopping at the first: for triage). A failure prints the seed, the case
//! and its full call log. Needs both backends (`LAZYFUSE_TEST_BACKENDS`);
//! skipped otherwise. Run as `cargo test --release --test fuzz_api --
//! --nocapture` for the statistics line. The call set and the per-device
//! machinery are in `fuzz_api_support/`; the regressions the fuzzer found
//! are the named tests at the end of this file.

mod common;
mod fuzz_api_support;

use common::Backend;
use fuzz_api_support::*;
use lazyfuse::ir::SplitMix64;
use lazyfuse::nn::{Block, CausalSelfAttention, Embedding, Module};
use lazyfuse::{pending_ops, DType, Device, FusionGuard, Result, Tensor};
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};

impl Case {
    /// A random call on the current pool: mostly well-typed (operands picked
    /// to fit), with wrong axes, shapes and dtypes mixed in.
    fn gen(&mut self) -> Call {
        let dt = |r: &mut Rng| {
            r.pick(&[
                DType::F32,
                DType::F32,
                DType::F32,
                DType::F32,
                DType::F64,
                DType::I64,
                DType::I32,
                DType::Bool,
            ])
        };
        let (din, dout) = (self.cfg.d_in, self.cfg.d_out);
        let rg = |t: &Tensor| t.requires_grad();
        let r = &mut self.rng;
        match r.below(47) {
            0..=2 => Call::Leaf {
                dims: r.dims(),
                dtype: dt(r),
                seed: r.0.next_u64(),
                grad: r.one_in(2),
            },
            3..=5 => {
                let u = r.pick(&[
                    U::Neg,
                    U::Abs,
                    U::Exp,
                    U::Tanh,
                    U::Sigmoid,
                    U::Relu,
                    U::Gelu,
                    U::GeluExact,
                    U::Sin,
                    U::Cos,
                    U::Erf,
                    U::Floor,
                    U::Log1Abs,
                    U::SqrtAbs,
                    U::Rsqrt1Abs,
                ]);
                let i = if matches!(u, U::Floor) {
                    self.exact()
                } else {
                    self.entry(rg)
                };
                Call::Unary(u, i)
            }
            6..=8 => {
                let b = r.pick(&[B::Add, B::Sub, B::Mul, B::Max, B::Min, B::DivSafe, B::OpAdd]);
                let i = self.entry(rg);
                let di = self.dims_of(i);
                let j = self.entry(|t| t.dims() == di || t.rank() <= 1);
                Call::Binary(b, i, j)
            }
            9 | 10 => {
                let s = r.pick(&[Sc::Add, Sc::Mul, Sc::Div, Sc::Pow, Sc::Max, Sc::Lhs]);
                let v = if matches!(s, Sc::Pow) {
                    r.pick(&[2.0, 3.0, 0.5])
                } else {
                    r.pick(&[0.5, -1.5, 2.0, 0.25])
                };
                Call::Scalar(s, self.entry(rg), v)
            }
            11 => Call::Compare(self.exact(), self.exact()),
            12 => Call::CompareScalar(self.exact(), self.rng.pick(&[0.0, 0.5, -1.0])),
            13 => Call::Where(self.exact(), self.any(), self.any()),
            14..=16 => {
                let red = r.pick(&[R::Sum, R::Mean, R::Max, R::Min]);
                if r.one_in(2) {
                    Call::ReduceAll(red, self.entry(rg))
                } else {
                    let axes = (0..r.below(3)).map(|_| r.axis()).collect();
                    let k = r.one_in(2);
                    Call::Reduce(red, self.entry(rg), axes, k)
                }
            }
            17 => Call::Argmax(self.exact(), self.rng.axis(), self.rng.one_in(2)),
            18 => {
                let s = r.pick(&[
                    Sm::Softmax,
                    Sm::LogSoftmax,
                    Sm::LogSumExp(true),
                    Sm::LogSumExp(false),
                ]);
                Call::Softmax(s, self.entry(rg), self.rng.axis())
            }
            19 => {
                let i = self.any();
                let n: usize = self.dims_of(i).iter().product();
                let d = match self.rng.below(3) {
                    0 => vec![n],
                    1 => vec![1, n],
                    _ => self.rng.dims(),
                };
                Call::Reshape(i, d)
            }
            20 => {
                let i = self.any();
                let mut p: Vec<usize> = (0..self.dims_of(i).len()).rev().collect();
                if self.rng.one_in(3) {
                    p.push(0);
                }
                Call::Permute(i, p)
            }
            21 => Call::Transpose(self.entry(rg), self.rng.axis(), self.rng.axis()),
            22 => Call::Narrow(
                self.any(),
                self.rng.axis(),
                self.rng.below(3),
                1 + self.rng.below(2),
            ),
            23 => match r.below(2) {
                0 => Call::Squeeze(self.any(), self.rng.axis()),
                _ => Call::Unsqueeze(self.any(), self.rng.axis()),
            },
            24 => {
                let i = self.entry(rg);
                let di = self.dims_of(i);
                let j = self.entry(|t| t.rank() == di.len());
                Call::Cat(i, j, self.rng.axis())
            }
            25 | 26 => {
                let i = self.entry(|t| t.rank() >= 1 && t.requires_grad());
                let k = self.dims_of(i).last().copied().unwrap_or(0);
                let j = self.entry(|t| t.rank() >= 1 && t.dims()[0] == k && t.rank() <= 2);
                Call::Matmul(i, j)
            }
            27 => {
                let i = self.any();
                let mut d = self.dims_of(i);
                d.insert(0, 1 + self.rng.below(3));
                if self.rng.one_in(3) {
                    d = self.rng.dims();
                }
                Call::BroadcastTo(i, d)
            }
            28 => {
                let to = dt(&mut self.rng);
                let i = if to.is_float() {
                    self.any()
                } else {
                    self.exact()
                };
                Call::ToDtype(i, to)
            }
            29 => match r.below(4) {
                0 => Call::Clamp(
                    self.entry(rg),
                    self.rng.pick(&[-0.5, -1.0]),
                    self.rng.pick(&[1.0, 0.5, -2.0]),
                ),
                1 => Call::MaskedFill(self.any(), self.exact(), -1.0),
                2 => {
                    let i = self.entry(rg);
                    let c = self.dims_of(i).last().copied().unwrap_or(1);
                    let w = self.entry(|t| t.dims() == [c]);
                    let b = if self.rng.one_in(2) {
                        Some(self.any())
                    } else {
                        None
                    };
                    Call::LayerNormFn(i, Some(w), b)
                }
                _ => {
                    let i = self.entry(rg);
                    let s = self.rng.0.next_u64() as i64 & 0xffff;
                    Call::DropoutFn(
                        i,
                        self.rng.pick(&[0.0, 0.5, 0.25, 1.0, 1.5]),
                        s,
                        !self.rng.one_in(4),
                    )
                }
            },
            30 => {
                let i = self.entry(|t| t.rank() >= 1 && t.requires_grad());
                let d = self.dims_of(i);
                let (n, c) = (
                    d.iter().rev().skip(1).product::<usize>(),
                    d.last().copied().unwrap_or(1) as i64,
                );
                let mut ids: Vec<i64> = (0..n).map(|_| self.rng.below(c as usize) as i64).collect();
                if self.rng.one_in(5) {
                    ids.push(0);
                } else if self.rng.one_in(5) && n > 0 {
                    ids[0] = c;
                }
                let ig = if self.rng.one_in(3) { Some(0) } else { None };
                Call::CrossEntropy(i, ids, ig)
            }
            31 => {
                let i = self.entry(rg);
                let mut d = self.dims_of(i);
                let a = self.rng.axis();
                let ax = a.rem_euclid(d.len().max(1) as isize) as usize;
                let n = d.get(ax).copied().unwrap_or(1);
                if let Some(x) = d.get_mut(ax) {
                    *x = 1 + self.rng.below(3);
                }
                let ids = (0..d.iter().product())
                    .map(|_| self.rng.below(n + 1) as i64)
                    .collect();
                Call::Gather(i, a, ids, d)
            }
            32 | 33 => {
                let l = r.pick(&[
                    Layer::Linear,
                    Layer::Linear,
                    Layer::Norm,
                    Layer::Embedding,
                    Layer::Dropout,
                    Layer::Block,
                ]);
                let i = match l {
                    Layer::Linear => self.entry(|t| t.dims().last() == Some(&din)),
                    Layer::Norm | Layer::Dropout => self.entry(|t| t.dims().last() == Some(&dout)),
                    Layer::Embedding => self.exact(),
                    Layer::Block => self.entry(|t| t.rank() == 3 && t.dims()[2] == 4),
                };
                Call::Forward(l, i)
            }
            34 => {
                let dims = self.rng.dims();
                let v = self.cfg.vocab as i64;
                let n = dims.iter().product::<usize>();
                let ids = (0..n)
                    .map(|_| self.rng.below(v as usize + 1) as i64 - (self.rng.one_in(6) as i64))
                    .collect();
                Call::EmbeddingIds(ids, dims)
            }
            35 => match r.below(5) {
                0 => Call::ParamTensor(self.rng.below(self.sides[0].params.len())),
                1 => Call::SetRequiresGrad(self.any(), self.rng.one_in(3)),
                2 => Call::WithGrad(self.any()),
                3 => Call::Detach(self.any()),
                _ => Call::ZeroGrad(self.any()),
            },
            36 => {
                let inner = loop {
                    let c = self.gen();
                    if !matches!(
                        c,
                        Call::Step
                            | Call::Backward(..)
                            | Call::Read(_)
                            | Call::Sync
                            | Call::NoGrad(_)
                    ) {
                        break c;
                    }
                };
                Call::NoGrad(Box::new(inner))
            }
            37 => {
                let i = self.entry(|t| t.numel() == 1 && t.requires_grad());
                Call::Backward(i, self.rng.one_in(3))
            }
            43 => Call::Cumsum(self.any(), self.rng.axis()),
            44 => {
                let i = self.entry(|t| t.rank() >= 1);
                let last = self.dims_of(i).last().copied().unwrap_or(1);
                // Now and then an invalid k (0 or past the axis): both sides must Err.
                let k = if self.rng.one_in(8) {
                    self.rng.below(2) * (last + 1)
                } else {
                    1 + self.rng.below(last.max(1))
                };
                Call::Topk(i, k, self.rng.one_in(2))
            }
            45 => {
                let i = self.entry(|t| t.rank() == 2);
                let m = self.dims_of(i).first().copied().unwrap_or(0);
                let groups = 1 + self.rng.below(4);
                // Sizes that cover the rows, fall short of them, or overrun them.
                let sizes = (0..groups)
                    .map(|_| self.rng.below(m.max(1) * 2 / groups + 1) as i64)
                    .collect();
                let n = 1 + self.rng.below(4);
                let seed = self.rng.below(1 << 20) as u64;
                Call::RaggedDot(i, n, sizes, seed, self.rng.one_in(2))
            }
            46 => {
                let i = self.entry(|t| (2..=3).contains(&t.rank()) && t.dtype().is_float());
                let d = self.dims_of(i);
                let c = if d.len() == 3 { d[0] } else { 1 };
                let r = &mut self.rng;
                let (k, s) = (1 + r.below(3), 1 + r.below(2));
                // Padding up to half the kernel; now and then past it (an Err).
                let over = usize::from(r.one_in(8));
                let p = r.below(k / 2 + 1 + over);
                let sp = match r.below(6) {
                    0 => Sp::MaxPool(k, s, p),
                    1 => Sp::AvgPool(k, s, p),
                    2 => Sp::Nearest(1 + r.below(6), 1 + r.below(6)),
                    3 => Sp::Bilinear(1 + r.below(6), 1 + r.below(6), r.one_in(2)),
                    4 => Sp::BatchNorm(r.one_in(3)),
                    // Groups that divide the channels, or not (an Err).
                    _ => Sp::GroupNorm(1 + r.below(c)),
                };
                Call::Spatial(sp, i)
            }
            40 | 41 => Call::Loss(self.entry(rg), self.rng.one_in(4)),
            42 => Call::Step,
            38 => match r.below(3) {
                0 => Call::Grad(self.entry(|t| t.grad().is_some())),
                1 => Call::Step,
                _ => Call::OptZeroGrad,
            },
            _ => match r.below(4) {
                0 => Call::Item(self.any()),
                1 => Call::Sync,
                _ => Call::Read(self.any()),
            },
        }
    }
}

#[test]
fn api_differential() {
    for b in [Backend::Xla, Backend::Interp] {
        if !common::backends().contains(&b) {
            eprintln!("skipped api_differential: needs the {b:?} backend, not selected by LAZYFUSE_TEST_BACKENDS");
            return;
        }
    }
    let seed = common::env_u64("FUZZ_SEED").unwrap_or(0xA91_F022);
    let cases =
        common::env_u64("FUZZ_API_CASES").unwrap_or(if cfg!(debug_assertions) { 15 } else { 60 });
    let verbose = std::env::var_os("FUZZ_API_LOG").is_some();
    let keep_going = std::env::var_os("FUZZ_API_KEEP_GOING").is_some();
    let mut failures = 0;
    let _f = FusionGuard::new(true);
    let start = std::time::Instant::now();
    let mut st = Stats::default();
    let mut rng = Rng(SplitMix64::new(seed));
    for case in 0..cases {
        let cfg = Cfg {
            d_in: 1 + rng.below(4),
            d_out: 1 + rng.below(4),
            vocab: 2 + rng.below(4),
            adamw: rng.one_in(2),
            momentum: rng.pick(&[0.0, 0.9]),
            seed: rng.0.next_u64() % 1000,
        };
        let sides = [
            Side::new(common::xla_dev(), cfg).unwrap(),
            Side::new(Device::interpreter(), cfg).unwrap(),
        ];
        let mut c = Case {
            rng: Rng(SplitMix64::new(rng.0.next_u64())),
            sides,
            exact: Vec::new(),
            log: String::new(),
            ncall: 0,
            cfg,
        };
        let _ = writeln!(c.log, "  {cfg:?}");
        let mut calls: Vec<Call> = (0..3)
            .map(|k| Call::Leaf {
                dims: vec![1 + k, cfg.d_in],
                dtype: DType::F32,
                seed: cfg.seed + k as u64,
                grad: k != 1,
            })
            .collect();
        calls.push(Call::Leaf {
            dims: vec![2],
            dtype: DType::I64,
            seed: cfg.seed,
            grad: false,
        });
        let n = 5 + c.rng.below(11);
        let mut result = Ok(());
        for k in 0..4 + n {
            let call = match calls.get(k) {
                Some(call) => call.clone(),
                None => c.gen(),
            };
            result = c.step(&call, &mut st);
            if result.is_err() {
                break;
            }
        }
        if result.is_ok() {
            result = c.check_all();
        }
        st.cases += 1;
        if verbose {
            eprintln!("case {case}:\n{}", c.log);
        }
        if let Err(e) = result {
            if keep_going {
                failures += 1;
                eprintln!("FAILURE case {case}: {e}\ncall log:\n{}", c.log);
                continue;
            }
            panic!(
                "fuzz_api: FUZZ_SEED={seed:#x}, case {case} failed: {e}\ncall log:\n{}",
                c.log
            );
        }
        drop(c);
        lazyfuse::sync();
    }
    eprintln!(
        "fuzz_api: seed {seed:#x}: {} cases, {} calls, {} Ok, {} Err, {} backward, {} optimizer steps, {:.1} s",
        st.cases, st.calls, st.ok, st.err, st.backward, st.steps, start.elapsed().as_secs_f64()
    );
    assert_eq!(
        failures, 0,
        "fuzz_api: {failures} failing cases (FUZZ_SEED={seed:#x})"
    );
}

// Regressions found by `api_differential` (fixed in src/): each call returned
// `Err` after recording nodes, or panicked.
test_device!(composite_errors_record_nothing, attention_needs_rank_3);

/// `f` must return `Err` without a panic and without recording a node.
fn rejects_cleanly(what: &str, f: impl FnOnce() -> Result<Tensor>) {
    let dev = common::dev();
    let before = pending_ops(&dev);
    let r = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| panic!("{what}: panicked"));
    assert!(r.is_err(), "{what}: accepted");
    assert_eq!(
        pending_ops(&dev),
        before,
        "{what}: Err left nodes in the graph"
    );
}

fn composite_errors_record_nothing() {
    let dev = common::dev();
    let x = Tensor::from_slice(&[1.0f32, -2.0, 0.5, 3.0, 0.0, -1.0], &[2, 3], &dev).unwrap();
    let y = x.with_grad().unwrap().mul(2.0).unwrap(); // pending, tracked
    let ids = Tensor::from_slice(&[1i64, 0], &[2], &dev).unwrap();
    let w4 = Tensor::from_slice(&[1.0f32; 4], &[4], &dev).unwrap();
    let seed = lazyfuse::Key::new(7);
    let emb = Embedding::new(4, 3, 1.0, 0, &dev).unwrap();
    rejects_cleanly("layer_norm, weight [4] on [2, 3]", || {
        y.layer_norm(Some(&w4), None, 1e-5)
    });
    rejects_cleanly("layer_norm, i64 bias", || {
        y.layer_norm(None, Some(&ids), 1e-5)
    });
    rejects_cleanly("masked_fill, f32 mask", || y.masked_fill(&y, 0.0));
    rejects_cleanly("softmax, axis 2 of rank 2", || y.softmax(2));
    rejects_cleanly("log_softmax, axis -3", || y.log_softmax(-3));
    rejects_cleanly("logsumexp, i64", || ids.logsumexp(0, false));
    rejects_cleanly("Embedding::forward, f32 ids", || emb.forward(&y));
    rejects_cleanly("clamp, i64 to 0.5", || ids.clamp(-1.0, 0.5));
    rejects_cleanly("dropout 0.25, i64", || ids.dropout(0.25, seed, true));
    let b = ids.lt(1.0).unwrap();
    rejects_cleanly("dropout 0.5, bool", || b.dropout(0.5, seed, true));
    let loss = y.sum(.., false).unwrap();
    loss.backward().unwrap();
    rejects_cleanly("backward through a released graph", || {
        loss.backward().map(|_| loss.clone())
    });
}

fn attention_needs_rank_3() {
    let dev = common::dev();
    let x = Tensor::rand(&[2, 4], 0, &dev).unwrap();
    let block = Block::new(4, 2, 0.0, 1, &dev).unwrap();
    let attn = CausalSelfAttention::new(4, 2, 0.0, 1, &dev).unwrap();
    rejects_cleanly("Block::forward on [2, 4]", || block.forward(&x));
    rejects_cleanly("CausalSelfAttention::forward on [2, 4]", || {
        attn.forward(&x)
    });
}
