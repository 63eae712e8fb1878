//! The paged forward step against the fixed-cache one: a prompt run in
//! block-aligned chunks over scattered blocks, then decoded beside a
//! padding row, gives the same logits.

use lazyfuse::Device;
use lazyfuse_models::{Llama, PagedKv, PagedStep};
use std::path::PathBuf;

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/hf")
        .join(name)
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1f32, |m, x| m.max(x.abs()));
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-5 * scale, "logit {i}: {x} vs {y}");
    }
}

#[test]
fn chunked_prefill_and_decode_over_scattered_blocks_match_the_fixed_cache() {
    let dev = Device::cpu().unwrap();
    for name in ["llama_gqa", "qwen2", "mixtral", "qwen2_moe", "qwen3_moe"] {
        let model = Llama::load(dir(name), &dev).unwrap();
        let vocab = model.config.vocab_size;
        let prompt: Vec<u32> = (0..37).map(|k| (3 + k * 11 % 100) as u32).collect();
        let mut cache = model.new_cache(1, 64).unwrap();
        let full = model
            .forward_cached(std::slice::from_ref(&prompt), &mut cache)
            .unwrap();
        let want_last = full.narrow(1, 36, 1).unwrap().to_vec::<f32>().unwrap();

        let bs = 16;
        let mut kv = PagedKv::new(&model, bs, 9).unwrap();
        // Blocks out of order, none of them the scratch block 0.
        let blocks = vec![7u32, 2, 5, 8];
        let mut got = vec![];
        for (start, len) in [(0, 16), (16, 16), (32, 5)] {
            let mut toks = prompt[start..start + len].to_vec();
            toks.resize(16, 0);
            let step = PagedStep {
                tokens: vec![toks],
                starts: vec![start],
                lens: vec![len],
                tables: vec![blocks.clone()],
            };
            got = model
                .forward_paged(&step, &mut kv)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
        }
        close(&got, &want_last);

        // Decode: the real row second, a padding row first.
        let mut tok = 5u32;
        for next in prompt.len()..prompt.len() + 4 {
            let want = model
                .forward_cached(&[vec![tok]], &mut cache)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            let step = PagedStep {
                tokens: vec![vec![0], vec![tok]],
                starts: vec![0, next],
                lens: vec![0, 1],
                tables: vec![vec![0; 4], blocks.clone()],
            };
            let got = model
                .forward_paged(&step, &mut kv)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            close(&got[vocab..], &want);
            tok = (tok * 7 + 3) % vocab as u32;
        }

        // Malformed steps are errors, not panics.
        let bad = PagedStep {
            tokens: vec![vec![1, 2]],
            starts: vec![3],
            lens: vec![2],
            tables: vec![blocks.clone()],
        };
        assert!(model.forward_paged(&bad, &mut kv).is_err());
        let outside = PagedStep {
            tokens: vec![vec![1]],
            starts: vec![0],
            lens: vec![1],
            tables: vec![vec![99]],
        };
        assert!(model.forward_paged(&outside, &mut kv).is_err());
    }
}
