//! Reading a checkpoint's tensors by name: one `model.safetensors`, or the
//! shards a `model.safetensors.index.json` maps names to. Every tensor is
//! checked against the shape the config implies before it is used, and a
//! missing, misnamed or misshapen tensor is an `Err` that names it.
//! [`Loader`] turns them into the model's device tensors and layers.

use crate::{ModelError, Result};
use half::{bf16, f16};
use lazyfuse::nn::{Linear, Param};
use lazyfuse::{Device, Tensor};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The tensors of a checkpoint directory, read lazily by name.
pub struct Checkpoint {
    /// Each file's bytes.
    files: HashMap<PathBuf, Vec<u8>>,
    /// Tensor name to the file holding it.
    index: HashMap<String, PathBuf>,
}

fn ck(msg: impl Into<String>) -> ModelError {
    ModelError::Checkpoint(msg.into())
}

impl Checkpoint {
    /// Opens `dir`: `model.safetensors.index.json` if present, else
    /// `model.safetensors`.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        Checkpoint::open_stem(dir, "model")
    }

    /// Opens `dir` with another file stem: `{stem}.safetensors.index.json`
    /// if present, else `{stem}.safetensors` (diffusers names its weights
    /// `diffusion_pytorch_model`).
    pub fn open_stem(dir: &Path, stem: &str) -> Result<Checkpoint> {
        let index_path = dir.join(format!("{stem}.safetensors.index.json"));
        let mut index = HashMap::new();
        let mut files = HashMap::new();
        let mut read = |p: &Path| -> Result<()> {
            if !files.contains_key(p) {
                let bytes = std::fs::read(p)
                    .map_err(|e| ck(format!("cannot read {}: {e}", p.display())))?;
                files.insert(p.to_path_buf(), bytes);
            }
            Ok(())
        };
        if index_path.is_file() {
            let text = std::fs::read_to_string(&index_path)
                .map_err(|e| ck(format!("cannot read {}: {e}", index_path.display())))?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| ck(format!("{}: {e}", index_path.display())))?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ck(format!("{}: no weight_map object", index_path.display())))?;
            for (name, file) in map {
                let file = file.as_str().ok_or_else(|| {
                    ck(format!(
                        "{}: weight_map[{name:?}] is not a file name",
                        index_path.display()
                    ))
                })?;
                let p = dir.join(file);
                read(&p)?;
                index.insert(name.clone(), p);
            }
        } else {
            let p = dir.join(format!("{stem}.safetensors"));
            if !p.is_file() {
                return Err(ck(format!(
                    "{} has neither {stem}.safetensors nor {stem}.safetensors.index.json",
                    dir.display()
                )));
            }
            read(&p)?;
            let st = SafeTensors::deserialize(&files[&p])
                .map_err(|e| ck(format!("{}: not a safetensors file: {e}", p.display())))?;
            for name in st.names() {
                index.insert(name.to_string(), p.clone());
            }
        }
        Ok(Checkpoint { files, index })
    }

    /// Whether the checkpoint holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The shape of tensor `name`, if the checkpoint holds it (models
    /// whose architecture is implied by their weights read it, ResNet's).
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        let file = self.index.get(name)?;
        let st = SafeTensors::deserialize(&self.files[file]).ok()?;
        st.tensor(name).ok().map(|t| t.shape().to_vec())
    }

    /// Tensor `name` as f32 (f32, bf16 and f16 are converted exactly),
    /// which must have shape `dims`.
    pub fn f32(&self, name: &str, dims: &[usize]) -> Result<Vec<f32>> {
        let file = self.index.get(name).ok_or_else(|| {
            ck(format!(
                "checkpoint has no tensor {name:?} (the config implies it with shape {dims:?})"
            ))
        })?;
        let st = SafeTensors::deserialize(&self.files[file])
            .map_err(|e| ck(format!("{}: not a safetensors file: {e}", file.display())))?;
        let t = st
            .tensor(name)
            .map_err(|e| ck(format!("{}: tensor {name:?}: {e}", file.display())))?;
        if t.shape() != dims {
            return Err(ck(format!(
                "tensor {name:?} has shape {:?}, but the config implies {dims:?}",
                t.shape()
            )));
        }
        let b = t.data();
        let out: Vec<f32> = match t.dtype() {
            Dtype::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::BF16 => b
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::F16 => b
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => {
                return Err(ck(format!(
                    "tensor {name:?} is {other:?}; weights must be F32, BF16 or F16"
                )))
            }
        };
        Ok(out)
    }
}

/// Loads weights by name with the shapes the config implies.
pub(crate) struct Loader<'a> {
    pub(crate) ck: &'a Checkpoint,
    pub(crate) dev: &'a Device,
}

impl Loader<'_> {
    pub(crate) fn vector(&self, name: &str, n: usize) -> Result<Tensor> {
        let v = self.ck.f32(name, &[n])?;
        Ok(Tensor::from_slice(&v, &[n], self.dev)?)
    }

    /// A PyTorch `[out, in]` weight, stored transposed as `[in, out]`.
    pub(crate) fn linear(
        &self,
        prefix: &str,
        inp: usize,
        out: usize,
        bias: bool,
    ) -> Result<Linear> {
        self.linears(&[(prefix, out)], inp, bias)
    }

    /// PyTorch `[out_j, in]` weights `prefix_j.weight` of one input width,
    /// stored transposed side by side as `[in, sum of out_j]` (and their
    /// biases, `prefix_j.bias`, concatenated likewise).
    pub(crate) fn linears(
        &self,
        parts: &[(&str, usize)],
        inp: usize,
        bias: bool,
    ) -> Result<Linear> {
        let total: usize = parts.iter().map(|&(_, out)| out).sum();
        let mut t = vec![0f32; inp * total];
        let mut b = Vec::with_capacity(total);
        let mut at = 0;
        for &(prefix, out) in parts {
            let w = self.ck.f32(&format!("{prefix}.weight"), &[out, inp])?;
            for o in 0..out {
                for i in 0..inp {
                    t[i * total + at + o] = w[o * inp + i];
                }
            }
            if bias {
                b.extend(self.ck.f32(&format!("{prefix}.bias"), &[out])?);
            }
            at += out;
        }
        // Frozen: loaded weights serve inference and record no tape.
        let b = if bias {
            Some(Param::frozen(Tensor::from_slice(&b, &[total], self.dev)?)?)
        } else {
            None
        };
        Ok(Linear {
            weight: Param::frozen(Tensor::from_slice(&t, &[inp, total], self.dev)?)?,
            bias: b,
        })
    }
}
