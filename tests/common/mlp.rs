//! A tiny MLP classifier and a fixed synthetic batch, shared by the training tests.

use super::dev;
use lazyfuse::nn::{Linear, Module, Param};
use lazyfuse::{Result, Tensor};

/// `4 -> 16 (relu) -> 3` with cross-entropy.
pub struct Mlp {
    pub l1: Linear,
    pub l2: Linear,
}

impl Mlp {
    pub fn new(seed: u64) -> Mlp {
        Mlp {
            l1: Linear::new(4, 16, true, seed, &dev()).unwrap(),
            l2: Linear::new(16, 3, true, seed + 1, &dev()).unwrap(),
        }
    }
    pub fn loss(&self, x: &Tensor, y: &[i64]) -> Result<Tensor> {
        let h = self.l1.forward(x)?.relu()?;
        self.l2.forward(&h)?.cross_entropy_ids(y, None)
    }
    pub fn params(&self) -> Vec<(String, Param)> {
        let mut v = Vec::new();
        self.l1.visit_params("l1", &mut v);
        self.l2.visit_params("l2", &mut v);
        v
    }
}

/// A fixed 3-class batch: class = index of the largest of the first 3 features.
pub fn batch(n: usize, seed: u64) -> (Tensor, Vec<i64>) {
    let x = Tensor::randn(&[n, 4], seed, &dev()).unwrap();
    let v = x.to_vec::<f32>().unwrap();
    let y = v
        .chunks(4)
        .map(|r| (0..3).max_by(|&a, &b| r[a].total_cmp(&r[b])).unwrap() as i64)
        .collect();
    (x, y)
}
