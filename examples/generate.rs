//! Text generation with a Hugging Face Llama-family checkpoint (Llama,
//! Qwen2) on lazyfuse:
//!
//! ```text
//! cargo run --release --example generate -- --model DIR (--prompt TEXT | --prompt-ids 3,17,101)...
//!     --max-new-tokens N [--temperature T --top-k K --top-p P --seed S] [--ignore-eos]
//!     [--logits-json FILE] [--device cpu|cuda] [--fusion on|off] [--warmup N] [--runs N]
//! ```
//!
//! Each `--prompt`/`--prompt-ids` adds one prompt to the batch. Prints one
//! `generated:` line per prompt (ids, and the text when the checkpoint has
//! a `tokenizer.json`), then tokens/s, compiles and the time per token split
//! into record, plan and execute. `--logits-json FILE` writes the first
//! prompt's logits: one row of `vocab_size` floats per prompt position.
//! `--warmup N` generates N times untimed first (compiles included there);
//! `--runs N` times N generations and reports the median.

#[path = "support/progress.rs"]
mod progress;

use lazyfuse::metrics::{self, Phase};
use lazyfuse::{Device, FusionGuard};
use lazyfuse_models::{generate::eos_token_ids, GenerateOptions, Llama, Tokenizer};
use std::path::PathBuf;
use std::time::Instant;

enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

struct Args {
    model: PathBuf,
    prompts: Vec<Prompt>,
    opts: GenerateOptions,
    logits_json: Option<PathBuf>,
    device: String,
    fusion: bool,
    warmup: usize,
    runs: usize,
}

fn parse() -> Result<Args, String> {
    let mut model = None;
    let mut prompts = Vec::new();
    let mut opts = GenerateOptions::default();
    let (mut logits_json, mut device, mut fusion) = (None, "cpu".to_string(), true);
    let (mut warmup, mut runs) = (0, 1);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or(format!("{a} needs a value"));
        fn num<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String> {
            v.parse().map_err(|_| format!("{flag}: cannot parse {v:?}"))
        }
        match a.as_str() {
            "--model" => model = Some(PathBuf::from(val()?)),
            "--prompt" => prompts.push(Prompt::Text(val()?)),
            "--prompt-ids" => {
                let ids = val()?
                    .split(',')
                    .map(|s| num::<u32>("--prompt-ids", s.trim().to_string()))
                    .collect::<Result<Vec<_>, _>>()?;
                prompts.push(Prompt::Ids(ids));
            }
            "--max-new-tokens" => opts.max_new_tokens = num(&a, val()?)?,
            "--temperature" => opts.temperature = num(&a, val()?)?,
            "--top-k" => opts.top_k = Some(num(&a, val()?)?),
            "--top-p" => opts.top_p = Some(num(&a, val()?)?),
            "--seed" => opts.seed = num(&a, val()?)?,
            "--ignore-eos" => opts.ignore_eos = true,
            "--logits-json" => logits_json = Some(PathBuf::from(val()?)),
            "--device" => device = val()?,
            "--warmup" => warmup = num(&a, val()?)?,
            "--runs" => runs = num::<usize>(&a, val()?)?.max(1),
            "--fusion" => {
                fusion = match val()?.as_str() {
                    "on" => true,
                    "off" => false,
                    o => return Err(format!("--fusion takes on|off, not {o}")),
                }
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let model = model.ok_or("--model DIR is required")?;
    if prompts.is_empty() {
        return Err("give --prompt TEXT or --prompt-ids 3,17,101".into());
    }
    Ok(Args {
        model,
        prompts,
        opts,
        logits_json,
        device,
        fusion,
        warmup,
        runs,
    })
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let dev = match args.device.as_str() {
        "cuda" => Device::cuda(0)?,
        "cpu" => Device::cpu()?,
        other => return Err(format!("--device takes cpu|cuda, not {other}").into()),
    };
    let _fusion = FusionGuard::new(args.fusion);
    let t_load = Instant::now();
    let model = Llama::load(&args.model, &dev)?;
    let tokenizer = Tokenizer::from_dir(&args.model)?;
    let mut opts = args.opts.clone();
    opts.eos_token_ids = eos_token_ids(&args.model, &model.config.eos_token_ids);
    let mut prompts = Vec::new();
    for p in &args.prompts {
        prompts.push(match p {
            Prompt::Ids(ids) => ids.clone(),
            Prompt::Text(t) => match &tokenizer {
                Some(tok) => tok.encode(t)?,
                None => {
                    return Err(format!(
                        "{} has no tokenizer.json: use --prompt-ids",
                        args.model.display()
                    )
                    .into())
                }
            },
        });
    }
    eprintln!(
        "loaded {} ({} layers, hidden {}, vocab {}) on {dev:?} in {:.2} s",
        model.config.model_type,
        model.config.num_hidden_layers,
        model.config.hidden_size,
        model.config.vocab_size,
        t_load.elapsed().as_secs_f64()
    );

    if let Some(path) = &args.logits_json {
        let logits: Vec<f32> = model.forward(&prompts[..1])?.to_vec()?;
        let rows: Vec<&[f32]> = logits.chunks(model.config.vocab_size).collect();
        std::fs::write(path, serde_json::to_string(&rows)?)?;
    }

    // Untimed runs first, so the timed one measures steady-state decoding
    // (its executables compiled and cached).
    for _ in 0..args.warmup {
        model.generate(&prompts, &opts)?;
    }
    let phases = [
        Phase::Record,
        Phase::Plan,
        Phase::Launch,
        Phase::Await,
        Phase::Compile,
    ];
    metrics::set_timing(true);
    let before: Vec<u64> = phases
        .iter()
        .map(|&p| metrics::distribution(p).sum)
        .collect();
    let m0 = metrics::snapshot();
    let mut times = Vec::new();
    let mut out = Vec::new();
    for _ in 0..args.runs {
        let mut bar = progress::Progress::with_unit(opts.max_new_tokens, "tokens");
        let t0 = Instant::now();
        out = model.generate_with(&prompts, &opts, &mut |n| bar.advance(n))?;
        times.push(t0.elapsed().as_secs_f64());
        bar.advance(opts.max_new_tokens);
    }
    times.sort_by(f64::total_cmp);
    let secs = times[times.len() / 2];
    let m1 = metrics::snapshot();
    let spent: Vec<f64> = phases
        .iter()
        .zip(&before)
        .map(|(&p, b)| (metrics::distribution(p).sum - b) as f64 / 1e6)
        .collect();

    let mut tokens = 0;
    for row in &out {
        tokens += row.len();
        let ids: Vec<String> = row.iter().map(u32::to_string).collect();
        match &tokenizer {
            Some(tok) => println!("generated: {} | {}", ids.join(" "), tok.decode(row)?),
            None => println!("generated: {}", ids.join(" ")),
        }
    }
    let steps = (out.iter().map(Vec::len).max().unwrap_or(0).max(1) * args.runs) as f64;
    println!(
        "{tokens} tokens in {secs:.3} s (median of {} runs): {:.1} tokens/s, {} compiles; per token (ms): record {:.3}, plan {:.3}, execute {:.3} (launch + await), compile {:.3}",
        args.runs,
        tokens as f64 / secs,
        m1.compiles - m0.compiles,
        spent[0] / steps,
        spent[1] / steps,
        (spent[2] + spent[3]) / steps,
        spent[4] / steps,
    );
    Ok(())
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}\nusage: generate --model DIR (--prompt TEXT | --prompt-ids 3,17,101)... --max-new-tokens N [--temperature T --top-k K --top-p P --seed S] [--ignore-eos] [--logits-json FILE] [--device cpu|cuda] [--fusion on|off] [--warmup N] [--runs N]");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
