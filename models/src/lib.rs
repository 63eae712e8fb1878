//! # lazyfuse-models
//!
//! Model families built only on lazyfuse's public API (`Tensor`, `Device`):
//! the core stays model-agnostic. First family: the Llama architecture and
//! its close relatives (Qwen2's q/k/v biases), loaded from checkpoint
//! directories as Hugging Face transformers writes them (`config.json`,
//! `model.safetensors` or shards with `model.safetensors.index.json`; f32,
//! bf16 or f16 weights).

#![warn(missing_docs)]

pub mod config;
pub mod diffusion;
pub mod dlrm;
pub mod generate;
pub mod llama;
mod moe;
pub mod paged;
pub mod resnet;
pub mod tokenizer;
pub mod unet;
pub mod weights;

pub use config::{LlamaConfig, MoeConfig, RopeScaling, MODEL_TYPES};
pub use dlrm::{Dlrm, DlrmConfig};
pub use generate::GenerateOptions;
/// The key/value cache the models decode with: `lazyfuse::nn`'s, in its
/// fixed-capacity form ([`Llama::new_cache`]).
pub use lazyfuse::nn::KvCache;
pub use llama::Llama;
pub use paged::{PagedKv, PagedStep};
pub use resnet::ResNet;
pub use tokenizer::Tokenizer;
pub use unet::{UNet2DConfig, UNet2DModel};

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// `config.json` is missing, malformed, or describes an unsupported model.
    #[error("{0}")]
    Config(String),
    /// A checkpoint file or tensor is missing, misnamed or of the wrong shape
    /// or dtype: the message names the tensor.
    #[error("{0}")]
    Checkpoint(String),
    /// An argument to a model call has the wrong shape or kind (the
    /// message says what was expected).
    #[error("{0}")]
    Input(String),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] lazyfuse::Error),
}

/// `Result` with [`ModelError`].
pub type Result<T> = std::result::Result<T, ModelError>;
