//! A checkpoint's `tokenizer.json`, read with Hugging Face's `tokenizers`
//! crate (the same library transformers' fast tokenizers are), so text is
//! split exactly as transformers splits it.

use crate::{ModelError, Result};
use std::path::Path;

/// Text to token ids and back.
pub struct Tokenizer(tokenizers::Tokenizer);

impl Tokenizer {
    /// `dir/tokenizer.json` if the checkpoint has one.
    pub fn from_dir(dir: &Path) -> Result<Option<Tokenizer>> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Ok(None);
        }
        tokenizers::Tokenizer::from_file(&path)
            .map(|t| Some(Tokenizer(t)))
            .map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))
    }

    /// The ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.0
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| ModelError::Config(format!("cannot tokenize {text:?}: {e}")))
    }

    /// The text of `ids` (special tokens skipped).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.0
            .decode(ids, true)
            .map_err(|e| ModelError::Config(format!("cannot decode {ids:?}: {e}")))
    }
}
