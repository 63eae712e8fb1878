//! `config.json` of a Llama-architecture checkpoint, as transformers writes
//! it: both the older top-level `rope_theta` / `rope_scaling` and
//! transformers 5's `rope_parameters` object.

use crate::{ModelError, Result};
use serde_json::Value;
use std::path::Path;

/// Rotary-embedding frequency scaling.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain `theta^(-2i/d)` frequencies.
    Default,
    /// Llama 3's: long wavelengths divided by `factor`, short ones kept,
    /// the band between interpolated.
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context length the model was trained at.
        original_max_position_embeddings: f64,
    },
}

/// The hyper-parameters of a Llama-family model.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// `model_type`, one of [`MODEL_TYPES`].
    pub model_type: String,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention; equal to the query heads without GQA).
    pub num_key_value_heads: usize,
    /// Width of one head (`head_dim` when given, else hidden / heads).
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Rotary base.
    pub rope_theta: f64,
    /// Rotary frequency scaling.
    pub rope_scaling: RopeScaling,
    /// The output projection is the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Biases on the q, k and v projections (Qwen2, or Llama's `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on the output projection (Llama's `attention_bias`).
    pub o_bias: bool,
    /// Biases on the MLP's projections (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// Longest context the model supports.
    pub max_position_embeddings: usize,
    /// Tokens that end generation (`eos_token_id`, a number or a list).
    pub eos_token_ids: Vec<u32>,
    /// RMSNorm of each query and key head before the rotary embedding
    /// (Qwen3's `q_norm` / `k_norm`).
    pub qk_norm: bool,
    /// The mixture-of-experts MLPs of Mixtral, Qwen2-MoE and Qwen3-MoE;
    /// `None` for a dense model.
    pub moe: Option<MoeConfig>,
}

/// How a mixture-of-experts layer routes and what it holds.
///
/// Every token picks its `top_k` experts by router probability (a softmax
/// over all experts), and the layer's output is the experts' outputs
/// weighted by those probabilities, renormalised to sum to one when
/// `norm_topk_prob` is set.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Experts per sparse layer (`num_local_experts` or `num_experts`).
    pub num_experts: usize,
    /// Experts each token is sent to (`num_experts_per_tok`).
    pub top_k: usize,
    /// Width of one expert's SwiGLU MLP (`moe_intermediate_size`, or
    /// Mixtral's `intermediate_size`).
    pub expert_intermediate_size: usize,
    /// Renormalise the chosen probabilities (always for Mixtral).
    pub norm_topk_prob: bool,
    /// Qwen2-MoE's shared expert, run on every token behind a sigmoid gate.
    pub shared_expert_intermediate_size: Option<usize>,
    /// Layer `i` is sparse when `(i + 1) % decoder_sparse_step == 0` and it
    /// is not in `mlp_only_layers`; other layers have a dense MLP of
    /// `intermediate_size`.
    pub decoder_sparse_step: usize,
    /// Layers that keep a dense MLP.
    pub mlp_only_layers: Vec<usize>,
}

impl MoeConfig {
    /// Whether decoder layer `layer` has a mixture-of-experts MLP.
    pub fn is_sparse(&self, layer: usize) -> bool {
        !self.mlp_only_layers.contains(&layer) && (layer + 1) % self.decoder_sparse_step == 0
    }
}

/// The expert count: `num_local_experts` (Mixtral, and what transformers 5
/// writes for every family) or `num_experts` (older Qwen MoE configs).
fn experts(v: &Value) -> Result<usize> {
    match v.get("num_local_experts") {
        Some(Value::Number(_)) => usize_field(v, "num_local_experts"),
        _ => usize_field(v, "num_experts"),
    }
}

/// The mixture-of-experts settings of `model_type` (`None` for the dense
/// families), read with each family's field names and defaults.
fn parse_moe(v: &Value, model_type: &str) -> Result<Option<MoeConfig>> {
    let flag = |f: &str, default: bool| v.get(f).and_then(Value::as_bool).unwrap_or(default);
    let moe = match model_type {
        "mixtral" => MoeConfig {
            num_experts: experts(v)?,
            top_k: usize_field(v, "num_experts_per_tok")?,
            expert_intermediate_size: usize_field(v, "intermediate_size")?,
            norm_topk_prob: true,
            shared_expert_intermediate_size: None,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![],
        },
        "qwen2_moe" | "qwen3_moe" => MoeConfig {
            num_experts: experts(v)?,
            top_k: usize_field(v, "num_experts_per_tok")?,
            expert_intermediate_size: usize_field(v, "moe_intermediate_size")?,
            norm_topk_prob: flag("norm_topk_prob", false),
            shared_expert_intermediate_size: match v.get("shared_expert_intermediate_size") {
                Some(Value::Number(_)) if model_type == "qwen2_moe" => {
                    Some(usize_field(v, "shared_expert_intermediate_size")?).filter(|&n| n > 0)
                }
                _ => None,
            },
            decoder_sparse_step: match v.get("decoder_sparse_step") {
                None | Some(Value::Null) => 1,
                Some(_) => usize_field(v, "decoder_sparse_step")?,
            },
            mlp_only_layers: match v.get("mlp_only_layers") {
                None | Some(Value::Null) => vec![],
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|x| x.as_u64().map(|n| n as usize))
                    .collect::<Option<_>>()
                    .ok_or_else(|| bad("mlp_only_layers", "not a list of layer indices"))?,
                Some(_) => return Err(bad("mlp_only_layers", "not a list of layer indices")),
            },
        },
        _ => return Ok(None),
    };
    if moe.num_experts == 0 || moe.top_k == 0 || moe.top_k > moe.num_experts {
        return Err(bad(
            "num_experts_per_tok",
            format!(
                "{} experts per token out of {} experts",
                moe.top_k, moe.num_experts
            ),
        ));
    }
    if moe.decoder_sparse_step == 0 {
        return Err(bad("decoder_sparse_step", "must be positive"));
    }
    Ok(Some(moe))
}

fn bad(field: &str, why: impl std::fmt::Display) -> ModelError {
    ModelError::Config(format!("config.json: {field}: {why}"))
}

fn usize_field(v: &Value, field: &str) -> Result<usize> {
    v.get(field)
        .ok_or_else(|| bad(field, "missing"))?
        .as_u64()
        .map(|n| n as usize)
        .ok_or_else(|| bad(field, "not a non-negative integer"))
}

fn opt_f64(v: &Value, field: &str) -> Result<Option<f64>> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_f64()
            .map(Some)
            .ok_or_else(|| bad(field, "not a number")),
    }
}

/// Token ids from a number or a list of numbers (`eos_token_id`).
pub(crate) fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => vec![],
    }
}

/// The `model_type`s this crate loads: the Llama architecture and the
/// relatives that differ from it only in biases, per-head norms or a
/// mixture-of-experts MLP.
pub const MODEL_TYPES: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
];

/// `model_type` (`llama` when absent), rejecting architectures whose
/// weights this crate cannot load.
fn parse_model_type(v: &Value) -> Result<String> {
    let model_type = v
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("llama")
        .to_string();
    if !MODEL_TYPES.contains(&model_type.as_str()) {
        return Err(bad(
            "model_type",
            format!(
                "{model_type:?} is not a Llama-architecture model ({})",
                MODEL_TYPES.join(", ")
            ),
        ));
    }
    Ok(model_type)
}

/// `num_key_value_heads` (`heads` when absent, i.e. no grouped-query
/// attention), which must divide the `heads` query heads.
fn parse_kv_heads(v: &Value, heads: usize) -> Result<usize> {
    let kv_heads = match v.get("num_key_value_heads") {
        None | Some(Value::Null) => heads,
        Some(_) => usize_field(v, "num_key_value_heads")?,
    };
    if kv_heads == 0 || heads % kv_heads != 0 {
        return Err(bad(
            "num_key_value_heads",
            format!("{kv_heads} does not divide num_attention_heads {heads}"),
        ));
    }
    Ok(kv_heads)
}

/// `head_dim`, else `hidden_size / heads`; it must be even, since rotary
/// embeddings rotate pairs of dimensions.
fn parse_head_dim(v: &Value, hidden_size: usize, heads: usize) -> Result<usize> {
    let head_dim = match v.get("head_dim") {
        None | Some(Value::Null) => {
            if hidden_size % heads != 0 {
                return Err(bad(
                    "hidden_size",
                    format!(
                        "{hidden_size} is not a multiple of {heads} heads and no head_dim is given"
                    ),
                ));
            }
            hidden_size / heads
        }
        Some(_) => usize_field(v, "head_dim")?,
    };
    if head_dim % 2 != 0 {
        return Err(bad(
            "head_dim",
            format!("{head_dim} is odd; rotary embeddings need pairs"),
        ));
    }
    Ok(head_dim)
}

/// The rotary base and scaling, from either spelling transformers writes:
/// transformers 5's `rope_parameters { rope_type, rope_theta, ... }`, or
/// (before) a top-level `rope_theta` and an optional `rope_scaling` object.
fn parse_rope(v: &Value) -> Result<(f64, RopeScaling)> {
    let params = v.get("rope_parameters").filter(|p| p.is_object());
    let scaling_obj = params.or_else(|| v.get("rope_scaling").filter(|p| p.is_object()));
    let rope_theta = match params
        .map(|p| opt_f64(p, "rope_theta"))
        .transpose()?
        .flatten()
    {
        Some(t) => t,
        None => opt_f64(v, "rope_theta")?.unwrap_or(10000.0),
    };
    let rope_scaling = match scaling_obj {
        None => RopeScaling::Default,
        Some(s) => parse_rope_scaling(s)?,
    };
    Ok((rope_theta, rope_scaling))
}

/// The scaling a rope parameters object `s` names by `rope_type` (or the
/// older `type`): only `default` and `llama3`, whose factors are required.
fn parse_rope_scaling(s: &Value) -> Result<RopeScaling> {
    let kind = s
        .get("rope_type")
        .or_else(|| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    match kind {
        "default" => Ok(RopeScaling::Default),
        "llama3" => {
            let need = |f: &str| {
                opt_f64(s, f)?.ok_or_else(|| bad(&format!("rope scaling {f}"), "missing"))
            };
            Ok(RopeScaling::Llama3 {
                factor: need("factor")?,
                low_freq_factor: need("low_freq_factor")?,
                high_freq_factor: need("high_freq_factor")?,
                original_max_position_embeddings: need("original_max_position_embeddings")?,
            })
        }
        other => Err(bad(
            "rope_type",
            format!("{other:?} is not supported (default, llama3)"),
        )),
    }
}

/// Rejects a `hidden_act` other than `silu`: the MLP is always SwiGLU.
fn check_hidden_act(v: &Value) -> Result<()> {
    if let Some(act) = v.get("hidden_act").and_then(Value::as_str) {
        if act != "silu" {
            return Err(bad(
                "hidden_act",
                format!("{act:?} is not supported (the SwiGLU MLP uses silu)"),
            ));
        }
    }
    Ok(())
}

impl LlamaConfig {
    /// Reads `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<LlamaConfig> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| ModelError::Config(format!("cannot read {}: {e}", path.display())))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))?;
        LlamaConfig::from_json(&v)
    }

    /// Parses a `config.json` value.
    pub fn from_json(v: &Value) -> Result<LlamaConfig> {
        let model_type = parse_model_type(v)?;
        let hidden_size = usize_field(v, "hidden_size")?;
        let heads = usize_field(v, "num_attention_heads")?;
        if heads == 0 || hidden_size == 0 {
            return Err(bad(
                "num_attention_heads",
                "heads and hidden_size must be positive",
            ));
        }
        let kv_heads = parse_kv_heads(v, heads)?;
        let head_dim = parse_head_dim(v, hidden_size, heads)?;
        let (rope_theta, rope_scaling) = parse_rope(v)?;
        let attention_bias = v
            .get("attention_bias")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        check_hidden_act(v)?;
        // Qwen2 and Qwen2-MoE always have q/k/v biases; Qwen3 has none
        // unless `attention_bias` says so, and normalises q and k per head.
        let qwen = model_type == "qwen2" || model_type == "qwen2_moe";
        let qk_norm = model_type == "qwen3" || model_type == "qwen3_moe";
        let moe = parse_moe(v, &model_type)?;
        let vocab_size = usize_field(v, "vocab_size")?;
        if vocab_size == 0 {
            return Err(bad("vocab_size", "must be positive"));
        }
        Ok(LlamaConfig {
            vocab_size,
            hidden_size,
            intermediate_size: usize_field(v, "intermediate_size")?,
            num_hidden_layers: usize_field(v, "num_hidden_layers")?,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rms_norm_eps: opt_f64(v, "rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            tie_word_embeddings: v
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            qkv_bias: v.get("qkv_bias").and_then(Value::as_bool).unwrap_or(qwen) || attention_bias,
            o_bias: attention_bias,
            mlp_bias: v.get("mlp_bias").and_then(Value::as_bool).unwrap_or(false),
            max_position_embeddings: v
                .get("max_position_embeddings")
                .and_then(Value::as_u64)
                .unwrap_or(4096) as usize,
            eos_token_ids: token_ids(v.get("eos_token_id")),
            qk_norm,
            moe,
            model_type,
        })
    }

    /// The rotary inverse frequencies, one per pair of a head's dimensions,
    /// with the configured scaling (computed in f64 as transformers does in f32).
    pub fn inv_freq(&self) -> Vec<f64> {
        let d = self.head_dim as f64;
        let base: Vec<f64> = (0..self.head_dim / 2)
            .map(|i| 1.0 / self.rope_theta.powf(2.0 * i as f64 / d))
            .collect();
        match self.rope_scaling {
            RopeScaling::Default => base,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                base.into_iter()
                    .map(|f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
        }
    }
}
