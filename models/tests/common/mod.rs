//! What the model tests share: fixture directories (made by the scripts in
//! `scripts/`, committed under `tests/fixtures/`), their `io.safetensors`,
//! and comparison relative to the expected values' scale.

#![allow(dead_code)] // each test binary uses its own subset

use lazyfuse::nn::load_tensors;
use lazyfuse::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::PathBuf;

/// `tests/fixtures/<family>/<name>`.
pub fn fixture(family: &str, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(family)
        .join(name)
}

/// The tensors of `dir/io.safetensors` by name.
pub fn io(dir: &std::path::Path, dev: &Device) -> HashMap<String, Tensor> {
    load_tensors(dir.join("io.safetensors"), dev)
        .unwrap()
        .into_iter()
        .collect()
}

/// A tensor's values as f32.
pub fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
}

/// Within `tol` relative to the expected values' largest magnitude.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * scale,
            "{what}: element {i}: got {g}, expected {w} (scale {scale})"
        );
    }
}
