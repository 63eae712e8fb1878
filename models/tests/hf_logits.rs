//! Checkpoints made by transformers (`scripts/make_hf_fixtures.py`, committed
//! under `tests/fixtures/hf/`): lazyfuse's prompt logits and greedy tokens
//! against transformers', fused and unfused, and bad checkpoints as `Err`s.

use lazyfuse::{Device, FusionGuard};
use lazyfuse_models::{GenerateOptions, Llama, ModelError};
use serde_json::Value;
use std::path::PathBuf;

const FIXTURES: &[&str] = &[
    "llama_gqa",
    "llama_tied_llama3",
    "qwen2",
    "llama_bf16",
    "llama_sharded",
    "qwen3",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
];

/// The tests run one at a time: one counts compiles, and the metrics are
/// process-wide.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static L: std::sync::Mutex<()> = std::sync::Mutex::new(());
    L.lock().unwrap_or_else(|e| e.into_inner())
}

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/hf")
        .join(name)
}

fn expected(name: &str) -> Value {
    let text = std::fs::read_to_string(dir(name).join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn prompt_logits_match_transformers_fused_and_unfused() {
    let _serial = serial();
    let dev = Device::cpu().unwrap();
    for name in FIXTURES {
        let e = expected(name);
        let prompt = ids(&e["prompt_ids"]);
        let want: Vec<f32> = e["logits"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
            })
            .collect();
        let model = Llama::load(dir(name), &dev).unwrap_or_else(|e| panic!("{name}: {e}"));
        for fuse in [true, false] {
            let _g = FusionGuard::new(fuse);
            let got: Vec<f32> = model
                .forward(std::slice::from_ref(&prompt))
                .unwrap()
                .to_vec()
                .unwrap();
            assert_eq!(got.len(), want.len(), "{name}");
            let worst = got
                .iter()
                .zip(&want)
                .map(|(g, w)| (g - w).abs())
                .fold(0f32, f32::max);
            eprintln!("{name} fused={fuse}: max |logit - transformers| = {worst:e}");
            assert!(
                worst <= 1e-4,
                "{name} fused={fuse}: max abs difference {worst}"
            );
        }
    }
}

#[test]
fn bad_checkpoints_are_errs_naming_the_tensor() {
    let _serial = serial();
    let dev = Device::interpreter();
    let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bad_checkpoints");
    let _ = std::fs::remove_dir_all(&scratch);
    let copy = |tag: &str| -> PathBuf {
        let d = scratch.join(tag);
        std::fs::create_dir_all(&d).unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(dir("llama_gqa").join(f), d.join(f)).unwrap();
        }
        d
    };
    let err = |d: &PathBuf| match Llama::load(d, &dev) {
        Ok(_) => panic!("{} loaded", d.display()),
        Err(e) => e,
    };
    let edit_config = |d: &PathBuf, f: &dyn Fn(&mut Value)| {
        let p = d.join("config.json");
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(&p, v.to_string()).unwrap();
    };

    // A shape that disagrees with the config names the tensor.
    let d = copy("shape");
    edit_config(&d, &|v| v["intermediate_size"] = 96.into());
    let e = err(&d);
    assert!(matches!(e, ModelError::Checkpoint(_)), "{e}");
    assert!(
        e.to_string()
            .contains("model.layers.0.mlp.gate_proj.weight"),
        "{e}"
    );
    assert!(e.to_string().contains("[96, 64]"), "{e}");

    // A layer the checkpoint does not have.
    let d = copy("missing");
    edit_config(&d, &|v| v["num_hidden_layers"] = 3.into());
    let e = err(&d);
    assert!(
        e.to_string()
            .contains("model.layers.2.input_layernorm.weight"),
        "{e}"
    );

    // A misnamed tensor (renamed in the file).
    let d = copy("misnamed");
    let p = d.join("model.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    let from = b"model.norm.weight";
    let pos = bytes.windows(from.len()).position(|w| w == from).unwrap();
    bytes[pos..pos + from.len()].copy_from_slice(b"model.norm.weighx");
    std::fs::write(&p, bytes).unwrap();
    let e = err(&d);
    assert!(e.to_string().contains("\"model.norm.weight\""), "{e}");

    // No weights at all, and configs that cannot describe a model.
    let d = copy("noweights");
    std::fs::remove_file(d.join("model.safetensors")).unwrap();
    assert!(err(&d).to_string().contains("neither model.safetensors"));
    let d = copy("gqa");
    edit_config(&d, &|v| v["num_key_value_heads"] = 3.into());
    assert!(err(&d).to_string().contains("does not divide"));
    let d = copy("act");
    edit_config(&d, &|v| v["hidden_act"] = "gelu".into());
    assert!(err(&d).to_string().contains("hidden_act"));
    let d = copy("noconfig");
    std::fs::remove_file(d.join("config.json")).unwrap();
    assert!(matches!(err(&d), ModelError::Config(_)));
}

#[test]
fn greedy_tokens_match_transformers_and_decoding_compiles_once() {
    let _serial = serial();
    let dev = Device::cpu().unwrap();
    for name in FIXTURES {
        let e = expected(name);
        let prompt = ids(&e["prompt_ids"]);
        let want = ids(&e["greedy_ids"]);
        let model = Llama::load(dir(name), &dev).unwrap();
        let got = model.generate_greedy(&prompt, want.len()).unwrap();
        assert_eq!(got, want, "{name}: greedy tokens differ from transformers'");
    }
    // A long decode: after the first few tokens nothing compiles. Fused,
    // whatever LAZYFUSE_FUSION says: unfused runs never donate.
    let _fused = lazyfuse::FusionGuard::new(true);
    let model = Llama::load(dir("llama_gqa"), &dev).unwrap();
    let mut cache = model.new_cache(1, 140).unwrap();
    let mut logits = model
        .forward_cached(&[vec![3, 17, 101]], &mut cache)
        .unwrap();
    let mut compiles_after_warmup = 0;
    let mut donated_after_warmup = 0;
    for step in 0..128 {
        let next = logits.argmax(-1, false).unwrap().to_vec::<i64>().unwrap();
        let before = lazyfuse::metrics::snapshot();
        logits = model
            .forward_cached(&[vec![*next.last().unwrap() as u32]], &mut cache)
            .unwrap();
        logits.realize().unwrap();
        if step >= 3 {
            let after = lazyfuse::metrics::snapshot();
            compiles_after_warmup += after.compiles - before.compiles;
            donated_after_warmup += after.buffers_donated - before.buffers_donated;
        }
    }
    assert_eq!(compiles_after_warmup, 0, "decoding 128 tokens recompiled");
    // The cache grows in place: every step's write of each layer's keys and
    // values reuses the buffer of the cache it replaces.
    let layers = model.config.num_hidden_layers as u64;
    assert!(
        donated_after_warmup >= 125 * 2 * layers,
        "{donated_after_warmup} buffers donated over 125 steps of {layers} layers"
    );
    assert_eq!(cache.len(), 131);
    let e = model.forward_cached(&[vec![1]; 1], &mut model.new_cache(1, 0).unwrap());
    assert!(e.is_err());
}

#[test]
fn batched_prompts_of_different_lengths_equal_one_by_one() {
    let _serial = serial();
    let dev = Device::cpu().unwrap();
    for name in ["llama_gqa", "qwen2"] {
        let model = Llama::load(dir(name), &dev).unwrap();
        let prompts = vec![
            vec![3, 17, 101, 5, 42, 9, 77],
            vec![64, 1],
            vec![23, 88, 12, 7],
        ];
        let opts = GenerateOptions {
            max_new_tokens: 12,
            ignore_eos: true,
            ..GenerateOptions::default()
        };
        let batched = model.generate(&prompts, &opts).unwrap();
        for (p, got) in prompts.iter().zip(&batched) {
            let alone = model
                .generate(std::slice::from_ref(p), &opts)
                .unwrap()
                .remove(0);
            assert_eq!(got, &alone, "{name}: prompt {p:?} batched vs alone");
        }
        // The same for the logits of each prompt's last position.
        let mut cache = model.new_padded_cache(&[0, 5, 3], 7).unwrap();
        let padded: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| {
                std::iter::repeat_n(0, 7 - p.len())
                    .chain(p.iter().copied())
                    .collect()
            })
            .collect();
        let batch: Vec<f32> = model
            .forward_cached(&padded, &mut cache)
            .unwrap()
            .to_vec()
            .unwrap();
        let vocab = model.config.vocab_size;
        for (i, p) in prompts.iter().enumerate() {
            let alone: Vec<f32> = model
                .forward(std::slice::from_ref(p))
                .unwrap()
                .to_vec()
                .unwrap();
            let last_alone = &alone[(p.len() - 1) * vocab..p.len() * vocab];
            let last_batch = &batch[(i * 7 + 6) * vocab..(i * 7 + 7) * vocab];
            let worst = last_alone
                .iter()
                .zip(last_batch)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst <= 1e-4, "{name}: prompt {i}: {worst}");
        }
    }
}

#[test]
fn sampling_is_reproducible_from_a_seed_and_stops_at_eos() {
    let _serial = serial();
    let dev = Device::cpu().unwrap();
    let model = Llama::load(dir("llama_tied_llama3"), &dev).unwrap();
    let prompts = vec![vec![3, 17, 101], vec![5, 42]];
    let opts = |seed| GenerateOptions {
        max_new_tokens: 24,
        temperature: 0.9,
        top_k: Some(40),
        top_p: Some(0.95),
        seed,
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    let a = model.generate(&prompts, &opts(11)).unwrap();
    let b = model.generate(&prompts, &opts(11)).unwrap();
    let c = model.generate(&prompts, &opts(12)).unwrap();
    assert_eq!(a, b, "the same seed gives the same tokens");
    assert_ne!(a, c, "another seed gives other tokens");
    assert_ne!(
        a[0],
        model.generate_greedy(&prompts[0], 24).unwrap(),
        "sampling is not greedy"
    );

    // An end token stops its sequence (and is kept); the other goes on.
    let greedy = model.generate_greedy(&prompts[0], 24).unwrap();
    let eos = greedy[5];
    let stop = GenerateOptions {
        max_new_tokens: 24,
        eos_token_ids: vec![eos],
        ..GenerateOptions::default()
    };
    let out = model.generate(&prompts[..1], &stop).unwrap();
    let first = greedy.iter().position(|&t| t == eos).unwrap();
    assert_eq!(out[0], greedy[..=first].to_vec());
    let eos_ids = lazyfuse_models::generate::eos_token_ids(&dir("llama_gqa"), &[]);
    assert_eq!(eos_ids, vec![2]);
}

#[test]
fn text_prompts_go_through_the_checkpoints_tokenizer() {
    let _serial = serial();
    let e = expected("llama_gqa");
    let tok = lazyfuse_models::Tokenizer::from_dir(&dir("llama_gqa"))
        .unwrap()
        .unwrap();
    let ids_text = tok.encode(e["prompt_text"].as_str().unwrap()).unwrap();
    assert_eq!(ids_text, ids(&e["prompt_text_ids"]));
    let model = Llama::load(dir("llama_gqa"), &Device::cpu().unwrap()).unwrap();
    let want = ids(&e["text_greedy_ids"]);
    let got = model.generate_greedy(&ids_text, want.len()).unwrap();
    assert_eq!(got, want);
    assert_eq!(
        tok.decode(&got).unwrap(),
        e["text_greedy"].as_str().unwrap()
    );
    assert!(lazyfuse_models::Tokenizer::from_dir(&dir("qwen2"))
        .unwrap()
        .is_none());
}
