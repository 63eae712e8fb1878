//! Mixture-of-experts MLPs: Mixtral's and Qwen2-MoE's / Qwen3-MoE's sparse
//! blocks, loaded from either layout transformers writes (one tensor per
//! expert, as checkpoints on the Hub ship, or transformers 5's fused
//! `experts.gate_up_proj` / `experts.down_proj`).
//!
//! Routing follows transformers exactly: a softmax over all experts, the
//! `top_k` largest probabilities (ties to the lower expert index),
//! renormalised when the config says so. The experts then run as one
//! grouped product per projection ([`Tensor::ragged_dot`]) over the
//! token-expert pairs sorted by expert, so a token costs `top_k` experts'
//! work, whatever the batch's mix; shapes depend only on the token count,
//! so a decode step compiles once.

use crate::config::MoeConfig;
use crate::weights::Loader;
use crate::{ModelError, Result};
use lazyfuse::nn::{Linear, Module};
use lazyfuse::{DType, Tensor};

/// Qwen2-MoE's shared expert: a dense SwiGLU MLP on every token, scaled by
/// a per-token sigmoid gate.
pub(crate) struct SharedExpert {
    /// `[hidden, 2 * inter]`: gate, then up.
    gate_up: Linear,
    down: Linear,
    /// `[hidden, 1]`.
    gate: Linear,
    inter: usize,
}

/// One sparse MLP block.
pub(crate) struct Moe {
    /// `[hidden, experts]`.
    router: Linear,
    /// `[experts, hidden, 2 * inter]`: each expert's gate, then up, as `[in, out]`.
    gate_up: Tensor,
    /// `[experts, inter, hidden]`.
    down: Tensor,
    shared: Option<SharedExpert>,
    config: MoeConfig,
}

/// `silu(gate) * up` of a `[.., 2 * inter]` gate-up product.
pub(crate) fn swiglu(gu: &Tensor, inter: usize) -> Result<Tensor> {
    let (g, up) = (gu.narrow(-1, 0, inter)?, gu.narrow(-1, inter, inter)?);
    Ok(g.mul(&g.sigmoid()?)?.mul(&up)?)
}

impl Moe {
    /// Loads layer `layer`'s block (`prefix` is `model.layers.{layer}`).
    pub(crate) fn load(l: &Loader<'_>, prefix: &str, hidden: usize, c: &MoeConfig) -> Result<Moe> {
        let (e, inter) = (c.num_experts, c.expert_intermediate_size);
        // Mixtral's checkpoints call the block `block_sparse_moe`;
        // transformers 5 and the Qwen MoE families call it `mlp`.
        let block = [
            format!("{prefix}.mlp"),
            format!("{prefix}.block_sparse_moe"),
        ]
        .into_iter()
        .find(|b| l.ck.contains(&format!("{b}.gate.weight")))
        .ok_or_else(|| {
            ModelError::Checkpoint(format!(
                "{prefix}.mlp.gate.weight (the router of a mixture-of-experts layer) is missing"
            ))
        })?;
        let router = l.linear(&format!("{block}.gate"), hidden, e, false)?;
        let (gate_up, down) = expert_weights(l, &format!("{block}.experts"), e, hidden, inter)?;
        let shared = match c.shared_expert_intermediate_size {
            None => None,
            Some(si) => {
                let s = format!("{block}.shared_expert");
                Some(SharedExpert {
                    gate_up: l.linears(
                        &[
                            (&format!("{s}.gate_proj"), si),
                            (&format!("{s}.up_proj"), si),
                        ],
                        hidden,
                        false,
                    )?,
                    down: l.linear(&format!("{s}.down_proj"), si, hidden, false)?,
                    gate: l.linear(&format!("{block}.shared_expert_gate"), hidden, 1, false)?,
                    inter: si,
                })
            }
        };
        Ok(Moe {
            router,
            gate_up: Tensor::from_slice(&gate_up, &[e, hidden, 2 * inter], l.dev)?,
            down: Tensor::from_slice(&down, &[e, inter, hidden], l.dev)?,
            shared,
            config: c.clone(),
        })
    }

    /// The block's output for normed hidden states `h` `[.., hidden]`.
    pub(crate) fn forward(&self, h: &Tensor) -> Result<Tensor> {
        let dims = h.dims().to_vec();
        let hidden = *dims.last().expect("rank >= 1");
        let n: usize = dims[..dims.len() - 1].iter().product();
        let x = h.reshape(&[n, hidden])?;
        let (experts, weights) = self.route(&x)?;
        let (k, inter) = (self.config.top_k, self.config.expert_intermediate_size);
        // Token-expert pairs (row-major `[n, k]`) sorted by expert: sorted
        // row `j` is pair `order[j]`, and pair `i` went to `positions[i]`.
        let (order, positions, sizes) = experts
            .reshape(&[n * k])?
            .group_by(self.config.num_experts)?;
        let token_of_pair = Tensor::arange(0.0, n as f64, DType::I64, x.device())?
            .reshape(&[n, 1])?
            .broadcast_to(&[n, k])?
            .reshape(&[n * k])?;
        let xs = x.index_select(0, &token_of_pair.index_select(0, &order)?)?;
        let act = swiglu(&xs.ragged_dot(&self.gate_up, &sizes)?, inter)?;
        let ys = act.ragged_dot(&self.down, &sizes)?;
        // Back in pair order, weighted, and summed over each token's experts.
        let y = ys
            .index_select(0, &positions)?
            .reshape(&[n, k, hidden])?
            .mul(&weights.unsqueeze(-1)?)?
            .sum([1], false)?;
        let y = match &self.shared {
            None => y,
            Some(s) => {
                let out = s.down.forward(&swiglu(&s.gate_up.forward(&x)?, s.inter)?)?;
                y.add(&s.gate.forward(&x)?.sigmoid()?.mul(&out)?)?
            }
        };
        Ok(y.reshape(&dims)?)
    }

    /// Each token's `top_k` experts `[n, k]` (i64, in descending
    /// probability) and their weights `[n, k]`.
    fn route(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let probs = self.router.forward(x)?.softmax(-1)?;
        let (weights, experts) = probs.topk(self.config.top_k)?;
        let weights = if self.config.norm_topk_prob {
            weights.div(&weights.sum([-1], true)?)?
        } else {
            weights
        };
        Ok((experts, weights))
    }
}

/// The experts' weights as `[experts, hidden, 2 * inter]` (gate, then up,
/// `[in, out]`) and `[experts, inter, hidden]`, from transformers 5's fused
/// `experts.gate_up_proj` `[experts, 2 * inter, hidden]` and
/// `experts.down_proj` `[experts, hidden, inter]`, or from one tensor per
/// expert (`experts.{j}.gate_proj`/`up_proj`/`down_proj`, or Mixtral's
/// `w1`/`w3`/`w2`).
fn expert_weights(
    l: &Loader<'_>,
    experts: &str,
    e: usize,
    hidden: usize,
    inter: usize,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let mut gate_up = vec![0f32; e * hidden * 2 * inter];
    let mut down = vec![0f32; e * inter * hidden];
    // Writes expert `j`'s `[out, in]` matrix `w` transposed into `dst` at
    // column offset `at` of a `[in, width]` block.
    let put =
        |dst: &mut [f32], j: usize, w: &[f32], out: usize, inp: usize, width: usize, at: usize| {
            let base = j * inp * width;
            for o in 0..out {
                for i in 0..inp {
                    dst[base + i * width + at + o] = w[o * inp + i];
                }
            }
        };
    let fused = format!("{experts}.gate_up_proj");
    if l.ck.contains(&fused) {
        let gu = l.ck.f32(&fused, &[e, 2 * inter, hidden])?;
        let dn =
            l.ck.f32(&format!("{experts}.down_proj"), &[e, hidden, inter])?;
        let (gs, ds) = (2 * inter * hidden, hidden * inter);
        for j in 0..e {
            put(
                &mut gate_up,
                j,
                &gu[j * gs..(j + 1) * gs],
                2 * inter,
                hidden,
                2 * inter,
                0,
            );
            put(
                &mut down,
                j,
                &dn[j * ds..(j + 1) * ds],
                hidden,
                inter,
                hidden,
                0,
            );
        }
        return Ok((gate_up, down));
    }
    let mixtral = l.ck.contains(&format!("{experts}.0.w1.weight"));
    let (g, u, d) = if mixtral {
        ("w1", "w3", "w2")
    } else {
        ("gate_proj", "up_proj", "down_proj")
    };
    for j in 0..e {
        let w = |p: &str, dims: &[usize]| l.ck.f32(&format!("{experts}.{j}.{p}.weight"), dims);
        put(
            &mut gate_up,
            j,
            &w(g, &[inter, hidden])?,
            inter,
            hidden,
            2 * inter,
            0,
        );
        put(
            &mut gate_up,
            j,
            &w(u, &[inter, hidden])?,
            inter,
            hidden,
            2 * inter,
            inter,
        );
        put(
            &mut down,
            j,
            &w(d, &[hidden, inter])?,
            hidden,
            inter,
            hidden,
            0,
        );
    }
    Ok((gate_up, down))
}
