//! diffusers' UNet2DModel (`scripts/make_unet_fixtures.py`, committed under
//! `tests/fixtures/unet/`: the default block recipe and a variant with
//! every less common switch this port builds) against diffusers on
//! PyTorch's CPU eager: the denoiser output (fused and unfused), DDIM and
//! DDPM sampling chains (the DDPM noise replayed from PyTorch's
//! generator), the parameter names, and bad input as an `Err`.

mod common;

use common::{assert_close, f32s};
use lazyfuse::nn::{load_tensors, Module};
use lazyfuse::optim::{params_of, Optimizer, Sgd};
use lazyfuse::{DType, Device, FusionGuard, Tensor};
use lazyfuse_models::diffusion::{Ddim, Ddpm, Scheduler, SchedulerConfig};
use lazyfuse_models::{ModelError, UNet2DConfig, UNet2DModel};
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

fn dir(name: &str) -> PathBuf {
    common::fixture("unet", name)
}

fn io(name: &str, dev: &Device) -> HashMap<String, Tensor> {
    common::io(&dir(name), dev)
}

#[test]
fn denoiser_output_matches_diffusers_fused_and_unfused() {
    let _inference = lazyfuse::NoGradGuard::new();
    let dev = Device::cpu().unwrap();
    for name in ["small", "variant"] {
        let data = io(name, &dev);
        let mut runs = Vec::new();
        for fuse in [true, false] {
            let _g = FusionGuard::new(fuse);
            let m = UNet2DModel::load(&dir(name), &dev).unwrap();
            let y = m
                .forward_with_class(
                    &data["sample"],
                    &data["timesteps"],
                    data.get("class_labels"),
                )
                .unwrap();
            let got = f32s(&y);
            assert_close(
                &format!("{name} fuse={fuse}"),
                &got,
                &f32s(&data["out"]),
                1e-4,
            );
            runs.push(got);
        }
        assert_close(
            &format!("{name} fused vs unfused"),
            &runs[0],
            &runs[1],
            1e-5,
        );
    }
}

#[test]
fn parameters_carry_the_checkpoint_names_and_fresh_models_their_shapes() {
    let dev = Device::cpu().unwrap();
    for name in ["small", "variant"] {
        let m = UNet2DModel::load(&dir(name), &dev).unwrap();
        let ours: BTreeSet<String> = m.parameters().into_iter().map(|(n, _)| n).collect();
        let file = dir(name).join("diffusion_pytorch_model.safetensors");
        let theirs: BTreeSet<String> = load_tensors(file, &dev)
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(ours, theirs, "{name}");
        // A fresh model of the same config has the same names and shapes.
        let fresh = UNet2DModel::random(UNet2DConfig::load(&dir(name)).unwrap(), 9, &dev).unwrap();
        let shapes = |m: &UNet2DModel| -> Vec<(String, Vec<usize>)> {
            let mut v: Vec<_> = m
                .parameters()
                .into_iter()
                .map(|(n, p)| (n, p.tensor().dims().to_vec()))
                .collect();
            v.sort();
            v
        };
        assert_eq!(shapes(&fresh), shapes(&m), "{name}: fresh vs loaded");
    }
}

#[test]
fn ddim_and_ddpm_chains_match_diffusers() {
    let _inference = lazyfuse::NoGradGuard::new();
    let dev = Device::cpu().unwrap();
    let data = io("small", &dev);
    let m = UNet2DModel::load(&dir("small"), &dev).unwrap();
    let run = |s: &dyn Scheduler, x: &Tensor, noise: Option<&Tensor>| -> Tensor {
        let mut x = x.clone();
        for (i, &t) in s.timesteps().iter().enumerate() {
            let ts = Tensor::from_slice(&[t as i64], &[], &dev).unwrap();
            let out = m.forward(&x, &ts).unwrap();
            // Each step's noise uploaded on its own (a slice of the stack at
            // a moving offset would be a different program per step).
            let n = noise.map(|n| {
                let per = n.numel() / n.dims()[0];
                let host = f32s(n)[i * per..(i + 1) * per].to_vec();
                Tensor::from_slice(&host, x.dims(), &dev).unwrap()
            });
            let n = n.filter(|_| s.needs_noise(t));
            x = s.step(&out, t, &x, n.as_ref()).unwrap();
            x.realize().unwrap();
        }
        x
    };
    // Fused only: the unfused UNet is checked above, and a step's update
    // is elementwise arithmetic the op fuzzer covers.
    {
        let ddim = Ddim::new(
            SchedulerConfig::load(&dir("small").join("ddim")).unwrap(),
            6,
        )
        .unwrap();
        assert_eq!(ddim.timesteps(), &[830, 664, 498, 332, 166, 0]);
        let x = run(&ddim, &data["ddim_x"], None);
        assert_close("ddim", &f32s(&x), &f32s(&data["ddim_out"]), 1e-4);
        let ddpm = Ddpm::new(
            SchedulerConfig::load(&dir("small").join("ddpm")).unwrap(),
            5,
        )
        .unwrap();
        let x = run(&ddpm, &data["ddpm_x"], Some(&data["ddpm_noise"]));
        assert_close("ddpm", &f32s(&x), &f32s(&data["ddpm_out"]), 1e-4);
    }
}

#[test]
fn bad_input_and_unsupported_configs_are_errors() {
    let dev = Device::cpu().unwrap();
    let m = UNet2DModel::load(&dir("small"), &dev).unwrap();
    let t = Tensor::from_slice(&[5f32], &[1], &dev).unwrap();
    let wrong_channels = Tensor::zeros(&[1, 4, 16, 16], DType::F32, &dev).unwrap();
    assert!(matches!(
        m.forward(&wrong_channels, &t),
        Err(ModelError::Input(_))
    ));
    let odd = Tensor::zeros(&[1, 3, 15, 16], DType::F32, &dev).unwrap();
    assert!(matches!(m.forward(&odd, &t), Err(ModelError::Input(_))));
    let x = Tensor::zeros(&[2, 3, 16, 16], DType::F32, &dev).unwrap();
    let three = Tensor::from_slice(&[1f32, 2.0, 3.0], &[3], &dev).unwrap();
    assert!(matches!(m.forward(&x, &three), Err(ModelError::Input(_))));
    let labels = Tensor::from_slice(&[0i64, 1], &[2], &dev).unwrap();
    assert!(matches!(
        m.forward_with_class(&x, &t, Some(&labels)),
        Err(ModelError::Input(_))
    ));
    let v = UNet2DModel::load(&dir("variant"), &dev).unwrap();
    let x2 = Tensor::zeros(&[2, 2, 16, 16], DType::F32, &dev).unwrap();
    assert!(matches!(v.forward(&x2, &t), Err(ModelError::Input(_))));
    for (json, key) in [
        (
            r#"{"down_block_types": ["SkipDownBlock2D"], "up_block_types": ["UpBlock2D"], "block_out_channels": [32]}"#,
            "SkipDownBlock2D",
        ),
        (r#"{"time_embedding_type": "fourier"}"#, "fourier"),
        (r#"{"act_fn": "mish"}"#, "mish"),
        (
            r#"{"block_out_channels": [32, 48], "down_block_types": ["DownBlock2D", "DownBlock2D"], "up_block_types": ["UpBlock2D", "UpBlock2D"]}"#,
            "norm_num_groups",
        ),
    ] {
        match UNet2DConfig::from_json(json) {
            Err(ModelError::Config(msg)) => assert!(msg.contains(key), "{msg}"),
            other => panic!(
                "{json}: expected a config error, got {:?}",
                other.map(|_| ())
            ),
        }
    }
    assert!(SchedulerConfig::from_json(r#"{"beta_schedule": "sigmoid"}"#).is_err());
    // diffusers' other spacings (numpy rounds half to even).
    let spaced = |s: &str| {
        let c = SchedulerConfig::from_json(&format!(r#"{{"timestep_spacing": "{s}"}}"#)).unwrap();
        c.timesteps(7).unwrap()
    };
    assert_eq!(spaced("linspace"), [999, 832, 666, 500, 333, 166, 0]);
    assert_eq!(spaced("trailing"), [999, 856, 713, 570, 428, 285, 142]);
    assert!(Ddim::new(SchedulerConfig::default(), 0).is_err());
    assert!(Ddim::new(SchedulerConfig::default(), 1001).is_err());
}

#[test]
fn sgd_training_follows_diffusers() {
    let dev = Device::cpu().unwrap();
    let data = io("small", &dev);
    let m = UNet2DModel::load(&dir("small"), &dev).unwrap();
    let mut opt = Sgd::new(params_of(&m.parameters()), 0.05, 0.9, 0.0).unwrap();
    let want = f32s(&data["train_losses"]);
    let t_all = data["train_t"].to_vec::<i64>().unwrap();
    let mut got = Vec::new();
    for (i, _) in want.iter().enumerate() {
        // Each step's batch uploaded on its own, as a data loader would.
        let pick = |k: &str| {
            let all = f32s(&data[k]);
            let per = all.len() / want.len();
            Tensor::from_slice(&all[i * per..(i + 1) * per], &[2, 3, 16, 16], &dev).unwrap()
        };
        let t = Tensor::from_slice(&t_all[2 * i..2 * i + 2], &[2], &dev).unwrap();
        opt.zero_grad();
        let pred = m.forward(&pick("train_noisy"), &t).unwrap();
        let d = pred.sub(pick("train_noise")).unwrap();
        let loss = d.mul(&d).unwrap().mean(.., false).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        got.push(loss.item::<f32>().unwrap());
    }
    assert_close("losses", &got, &want, 1e-4);
    let w = m
        .parameters()
        .into_iter()
        .find(|(n, _)| n == "conv_in.weight")
        .unwrap()
        .1;
    assert_close(
        "conv_in.weight after training",
        &f32s(&w.tensor()),
        &f32s(&data["train_conv_in_weight"]),
        1e-4,
    );
}
