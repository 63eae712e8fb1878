//! DLRM in the reference layout (`scripts/make_dlrm_fixture.py`, committed
//! under `tests/fixtures/dlrm/`): probabilities and five SGD steps (sparse
//! tables, dense MLPs) against PyTorch's CPU eager, fused and unfused.

use lazyfuse::nn::load_tensors;
use lazyfuse::optim::{params_of, Optimizer, Sgd, SparseSgd};
use lazyfuse::{DType, Device, FusionGuard, Tensor};
use lazyfuse_models::Dlrm;
use std::collections::HashMap;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/dlrm")
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
}

fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

#[test]
fn dlrm_matches_pytorch_forward_and_training() {
    let dev = Device::cpu().unwrap();
    let io: HashMap<String, Tensor> = load_tensors(dir().join("io.safetensors"), &dev)
        .unwrap()
        .into_iter()
        .collect();
    let sparse: Vec<(Tensor, Tensor)> = (0..4)
        .map(|k| {
            (
                io[&format!("ids.{k}")].clone(),
                io[&format!("offsets.{k}")].clone(),
            )
        })
        .collect();
    for fuse in [true, false] {
        let _g = FusionGuard::new(fuse);
        let m = Dlrm::load(&dir(), &dev).unwrap();
        let p = m.forward(&io["dense"], &sparse).unwrap();
        close(
            &format!("probabilities fuse={fuse}"),
            &f32s(&p),
            &f32s(&io["probs"]),
            1e-5,
        );
        let mut dense_opt = Sgd::new(params_of(&m.dense_parameters()), 0.1, 0.0, 0.0).unwrap();
        let sparse_opt = SparseSgd::new(0.1);
        let y = &io["labels"];
        let mut losses = Vec::new();
        for _ in 0..5 {
            dense_opt.zero_grad();
            let p = m.forward(&io["dense"], &sparse).unwrap();
            let loss = p.binary_cross_entropy(y).unwrap();
            loss.backward().unwrap();
            dense_opt.step().unwrap();
            let tables: Vec<&_> = m.tables.iter().collect();
            sparse_opt.step(&tables).unwrap();
            losses.push(loss.item::<f32>().unwrap());
        }
        close(
            &format!("losses fuse={fuse}"),
            &losses,
            &f32s(&io["losses"]),
            1e-5,
        );
        let t0 = m.tables[0].weight.tensor();
        close(
            &format!("table 0 fuse={fuse}"),
            &f32s(&t0),
            &f32s(&io["table0_after"]),
            1e-5,
        );
    }
}
