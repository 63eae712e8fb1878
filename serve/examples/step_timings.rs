//! Times the engine's step shapes on a checkpoint: a decode step of `B`
//! rows attending to `n` blocks, and a prefill chunk of `t` tokens.
//!
//! ```text
//! cargo run --release -p lazyfuse-serve --example step_timings -- DIR [BLOCK_SIZE]
//! ```

use lazyfuse_models::{Llama, PagedKv, PagedStep};
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("usage: step_timings DIR [BLOCK_SIZE]");
    let bs: usize = args.next().map_or(16, |s| s.parse().expect("a block size"));
    lazyfuse::set_auto_dynamic(false);
    let dev = lazyfuse::Device::cpu().expect("the CPU device");
    let model = Llama::load(&dir, &dev).expect("a checkpoint");
    let mut kv = PagedKv::new(&model, bs, 32 * 16 + 1).expect("a cache");
    let mut time = |b: usize, t: usize, n: usize| {
        // Real rows over distinct blocks, each at the end of its span.
        let step = PagedStep {
            tokens: vec![vec![3; t]; b],
            starts: vec![if t == 1 { n * bs - 1 } else { 0 }; b],
            lens: vec![t; b],
            tables: (0..b)
                .map(|r| (0..n).map(|k| (1 + r * n + k) as u32).collect())
                .collect(),
        };
        for _ in 0..3 {
            model
                .forward_paged(&step, &mut kv)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
        }
        let reps = 10;
        let start = Instant::now();
        for _ in 0..reps {
            model
                .forward_paged(&step, &mut kv)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
        }
        let ms = start.elapsed().as_secs_f64() * 1e3 / reps as f64;
        println!(
            "rows {b:>2} tokens {t:>3} blocks {n:>2}: {ms:7.2} ms ({:.0} tok/s)",
            (b * t) as f64 / ms * 1e3
        );
    };
    for n in [4, 16] {
        for b in [1, 4, 16, 32] {
            time(b, 1, n);
        }
    }
    for t in [16, 32, 64, 128] {
        time(1, t, 16);
    }
    // The fixed-capacity cache's prefill (what `generate` runs), for scale.
    for t in [16, 32, 64, 128] {
        let ids = vec![vec![3u32; t]];
        let run = || {
            let mut cache = model.new_cache(1, 256).unwrap();
            model
                .forward_cached(&ids, &mut cache)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
        };
        for _ in 0..3 {
            run();
        }
        let start = Instant::now();
        for _ in 0..10 {
            run();
        }
        let ms = start.elapsed().as_secs_f64() * 1e2;
        println!("fixed cache, tokens {t:>3}: {ms:7.2} ms");
    }
}
