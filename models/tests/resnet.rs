//! ResNets in torchvision's layout (`scripts/make_resnet_fixtures.py`,
//! committed under `tests/fixtures/resnet/`: ResNet-18's and ResNet-50's
//! block structure with narrow channels): eval and training-mode logits,
//! first-step gradients, SGD losses (as many steps as float32 and float64
//! PyTorch agree on) and the running statistics after them against
//! PyTorch's CPU eager, fused and unfused; and a missing tensor as an `Err`.

mod common;

use common::{assert_close, f32s};
use lazyfuse::nn::{load_tensors, Module};
use lazyfuse::optim::{params_of, Optimizer, Sgd};
use lazyfuse::{Device, FusionGuard, Tensor};
use lazyfuse_models::{ModelError, ResNet};
use std::collections::HashMap;
use std::path::PathBuf;

const FIXTURES: &[&str] = &["resnet18_tiny", "resnet50_tiny"];

fn serial() -> std::sync::MutexGuard<'static, ()> {
    static L: std::sync::Mutex<()> = std::sync::Mutex::new(());
    L.lock().unwrap_or_else(|e| e.into_inner())
}

fn dir(name: &str) -> PathBuf {
    common::fixture("resnet", name)
}

fn io(name: &str, dev: &Device) -> HashMap<String, Tensor> {
    common::io(&dir(name), dev)
}

#[test]
fn logits_match_pytorch_in_eval_and_training_mode() {
    let _s = serial();
    let dev = Device::cpu().unwrap();
    for name in FIXTURES {
        let data = io(name, &dev);
        for fuse in [true, false] {
            let _g = FusionGuard::new(fuse);
            let m = ResNet::load(&dir(name), &dev).unwrap();
            m.set_train(false);
            let y = m.forward(&data["input"]).unwrap();
            let what = format!("{name} eval fuse={fuse}");
            assert_close(&what, &f32s(&y), &f32s(&data["logits_eval"]), 1e-4);
            m.set_train(true);
            let y = m.forward(&data["input"]).unwrap();
            let what = format!("{name} train fuse={fuse}");
            assert_close(&what, &f32s(&y), &f32s(&data["logits_train"]), 1e-4);
        }
    }
}

#[test]
fn sgd_training_follows_pytorch_gradients_losses_and_running_statistics() {
    let _s = serial();
    let dev = Device::cpu().unwrap();
    for name in FIXTURES {
        let data = io(name, &dev);
        let m = ResNet::load(&dir(name), &dev).unwrap();
        let params = m.parameters();
        let lr = f32s(&data["lr"])[0] as f64;
        let mut opt = Sgd::new(params_of(&params), lr, 0.9, 0.0).unwrap();
        let labels = &data["labels"];
        let want = f32s(&data["losses"]);
        let mut got = Vec::new();
        for step in 0..want.len() {
            opt.zero_grad();
            let loss = m
                .forward(&data["input"])
                .unwrap()
                .cross_entropy(labels, None)
                .unwrap();
            loss.backward().unwrap();
            if step == 0 {
                for (key, expected) in data.iter().filter(|(k, _)| k.starts_with("grad.")) {
                    let pname = &key["grad.".len()..];
                    let p = &params.iter().find(|(n, _)| n == pname).unwrap().1;
                    let mut g = p.grad().unwrap();
                    if pname == "fc.weight" {
                        g = g.transpose(0, 1).unwrap(); // stored [in, out]
                    }
                    let what = format!("{name} first-step gradient of {pname}");
                    assert_close(&what, &f32s(&g), &f32s(expected), 1e-4);
                }
            }
            opt.step().unwrap();
            got.push(loss.item::<f32>().unwrap());
        }
        assert_close(&format!("{name} losses"), &got, &want, 1e-4);
        let bn = m
            .batch_norms()
            .into_iter()
            .find(|(n, _)| n == "layer1.0.bn1")
            .unwrap()
            .1;
        let what = format!("{name} running mean");
        assert_close(
            &what,
            &f32s(&bn.running_mean()),
            &f32s(&data["bn_running_mean"]),
            1e-5,
        );
        let what = format!("{name} running var");
        assert_close(
            &what,
            &f32s(&bn.running_var()),
            &f32s(&data["bn_running_var"]),
            1e-5,
        );
    }
}

#[test]
fn a_missing_tensor_is_an_error_naming_it() {
    let _s = serial();
    let tmp = std::env::temp_dir().join(format!("lazyfuse-resnet-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let dev = Device::cpu().unwrap();
    let all = load_tensors(dir("resnet18_tiny").join("model.safetensors"), &dev).unwrap();
    let kept: Vec<(String, Tensor)> = all
        .into_iter()
        .filter(|(n, _)| n != "layer2.0.bn1.running_var")
        .collect();
    lazyfuse::nn::save_tensors(tmp.join("model.safetensors"), &kept).unwrap();
    match ResNet::load(&tmp, &dev) {
        Err(ModelError::Checkpoint(m)) => assert!(m.contains("layer2.0.bn1.running_var"), "{m}"),
        Err(e) => panic!("expected a checkpoint error, got {e}"),
        Ok(_) => panic!("a checkpoint without layer2.0.bn1.running_var loaded"),
    }
    std::fs::remove_dir_all(&tmp).ok();
}

#[test]
fn fresh_resnets_have_torchvisions_parameters() {
    let _s = serial();
    let dev = Device::cpu().unwrap();
    // torchvision.models.resnet18() / resnet50(): 11,689,512 and 25,557,032.
    for (m, count) in [
        (ResNet::resnet18(1000, 0, &dev).unwrap(), 11_689_512usize),
        (ResNet::resnet50(1000, 0, &dev).unwrap(), 25_557_032),
    ] {
        let params = m.parameters();
        let total: usize = params.iter().map(|(_, p)| p.tensor().numel()).sum();
        assert_eq!(total, count);
        let names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
        for n in [
            "conv1.weight",
            "bn1.bias",
            "layer2.0.downsample.0.weight",
            "layer4.1.bn2.weight",
            "fc.bias",
        ] {
            assert!(names.contains(&n), "{n} missing from {names:?}");
        }
    }
}
