//! Mixture-of-experts routing for training: top-k choice of experts per
//! token, an optional per-expert capacity (tokens past it are dropped, as
//! in GShard and the Switch Transformer), and the load-balancing loss that
//! keeps a router from sending everything to a few experts.
//!
//! Everything stays on the device and in static shapes: who was chosen
//! and who was dropped are data, so a training loop compiles once however
//! the router's choices move. Pair the result with `Tensor::group_by` and
//! `Tensor::ragged_dot` for the experts' products.

use crate::{Error, Result, Tensor};
use lazyfuse_ir::DType;

/// How [`route`] routes.
#[derive(Clone, Copy, Debug)]
pub struct RouteOptions {
    /// Experts per token.
    pub top_k: usize,
    /// Renormalise each token's chosen probabilities to sum to one
    /// (Mixtral, Qwen3-MoE), rather than keep the softmax's (Qwen2-MoE).
    pub normalize: bool,
    /// Most tokens an expert takes; `None`: no limit. Choices are served
    /// in priority order (every token's first choice, in token order,
    /// then every second choice, ...) and those past an expert's capacity
    /// are dropped: their weight is 0 and `kept` says so.
    pub capacity: Option<usize>,
}

/// What [`route`] decided, per token and choice (`[tokens, top_k]`).
#[derive(Clone, Debug)]
pub struct Routing {
    /// The chosen experts (i64), in descending probability.
    pub experts: Tensor,
    /// Their weights: the (renormalised) probabilities, 0 where dropped.
    pub weights: Tensor,
    /// 1 where the choice is served, 0 where capacity dropped it (the
    /// logits' dtype).
    pub kept: Tensor,
    /// The load-balancing loss of these logits ([`load_balancing_loss`]),
    /// a scalar to add to the training loss with a small coefficient.
    pub aux_loss: Tensor,
}

/// Routes tokens with router `logits` `[tokens, experts]`: softmax, top-k,
/// optional renormalisation and capacity, and the auxiliary loss.
#[track_caller]
pub fn route(logits: &Tensor, opts: RouteOptions) -> Result<Routing> {
    let experts = check(logits, opts.top_k)?;
    let probs = logits.softmax(-1)?;
    let (weights, chosen) = probs.topk(opts.top_k)?;
    let weights = if opts.normalize {
        weights.div(&weights.sum([-1], true)?)?
    } else {
        weights
    };
    let kept = match opts.capacity {
        Some(c) => capacity_mask(&chosen, experts, c)?.to_dtype(logits.dtype())?,
        None => weights.ones_like()?,
    };
    let aux_loss = balance(&probs, &chosen, experts)?;
    Ok(Routing {
        weights: weights.mul(&kept)?,
        experts: chosen,
        kept,
        aux_loss,
    })
}

/// The load-balancing loss of router `logits` `[tokens, experts]` with
/// `top_k` choices, as Switch Transformer and transformers' Mixtral
/// (`load_balancing_loss_func`) define it: `experts * Σ_e f_e · P_e`,
/// where `f_e` is the fraction of (token, choice) slots that chose `e`
/// (per choice rank, summed over ranks) and `P_e` the mean router
/// probability of `e`. It is 1·top_k for a perfectly even router and
/// grows as the load concentrates; its gradient reaches the logits
/// through `P_e`.
#[track_caller]
pub fn load_balancing_loss(logits: &Tensor, top_k: usize) -> Result<Tensor> {
    let experts = check(logits, top_k)?;
    let probs = logits.softmax(-1)?;
    let (_, chosen) = probs.topk(top_k)?;
    balance(&probs, &chosen, experts)
}

/// `experts * Σ_{k,e} mean_t(onehot(chosen)[t,k,e]) * mean_t(probs[t,e])`.
fn balance(probs: &Tensor, chosen: &Tensor, experts: usize) -> Result<Tensor> {
    let onehot = one_hot(chosen, experts, probs.dtype())?; // [t, k, e]
    let tokens_per_expert = onehot.mean([0], false)?; // [k, e]
    let prob_per_expert = probs.mean([0], true)?; // [1, e]
    tokens_per_expert
        .mul(&prob_per_expert)?
        .sum([0, 1], false)?
        .mul(experts as f64)
}

/// Which (token, choice) pairs of `chosen` `[tokens, top_k]` (expert ids)
/// an expert with room for `capacity` tokens serves: a bool `[tokens,
/// top_k]`. Priority: all first choices in token order, then all second
/// choices, and so on.
#[track_caller]
pub fn capacity_mask(chosen: &Tensor, experts: usize, capacity: usize) -> Result<Tensor> {
    if chosen.rank() != 2 || !chosen.dtype().is_int() || experts == 0 {
        return Err(Error::op(
            "capacity_mask",
            "needs integer expert ids [tokens, top_k] and at least one expert",
            chosen.describe(),
            crate::site::caller(),
        ));
    }
    let (t, k) = (chosen.dims()[0], chosen.dims()[1]);
    // Pairs in priority order: [k * t] (choice rank major).
    let order = chosen.transpose(0, 1)?.reshape(&[k * t, 1])?;
    let onehot = one_hot(&order.reshape(&[k * t])?, experts, DType::I64)?; // [k*t, e]
                                                                           // Pairs before each one that chose the same expert.
    let before = onehot.cumsum(0)?.sub(&onehot)?;
    let position = before.mul(&onehot)?.sum([1], false)?; // [k*t]
    position
        .lt(capacity as f64)?
        .reshape(&[k, t])?
        .transpose(0, 1)
}

/// `onehot[..., e] = (ids[...] == e)` in `dtype`.
fn one_hot(ids: &Tensor, experts: usize, dtype: DType) -> Result<Tensor> {
    let range = Tensor::arange(0.0, experts as f64, DType::I64, ids.device())?;
    ids.to_dtype(DType::I64)?
        .unsqueeze(-1)?
        .eq(&range)?
        .to_dtype(dtype)
}

/// Checks router logits `[tokens, experts]` and `top_k`; the expert count.
#[track_caller]
fn check(logits: &Tensor, top_k: usize) -> Result<usize> {
    let ok =
        logits.rank() == 2 && logits.dtype().is_float() && top_k >= 1 && top_k <= logits.dims()[1];
    if !ok {
        return Err(Error::op(
            "route",
            format!("needs float router logits [tokens, experts] and 1 <= top_k <= experts (top_k {top_k})"),
            logits.describe(),
            crate::site::caller(),
        ));
    }
    Ok(logits.dims()[1])
}
