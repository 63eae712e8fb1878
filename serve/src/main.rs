//! `lazyfuse-serve`: an OpenAI-compatible server for a Hugging Face
//! checkpoint directory, and (`lazyfuse-serve bench`) a load generator for
//! any OpenAI-compatible server.

use lazyfuse_serve::Options;
use std::path::PathBuf;
use std::time::Duration;

const USAGE: &str = "usage: lazyfuse-serve --model DIR [--host 127.0.0.1] [--port 8000] [--max-batch 32]
    [--max-queue 256] [--kv-cache-mb 256 | --kv-cache-blocks N] [--block-size 16] [--max-model-len N]
    [--prefill-chunk 256] [--prefill-budget 512] [--request-timeout SECS] [--served-model-name NAME] [--quiet]
       lazyfuse-serve bench --help";

fn parse(args: Vec<String>) -> Result<Options, String> {
    let mut o = Options::default();
    let mut model = None;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or(format!("{a} needs a value"));
        fn num<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String> {
            v.parse().map_err(|_| format!("{flag}: cannot parse {v:?}"))
        }
        match a.as_str() {
            "--model" => model = Some(PathBuf::from(val()?)),
            "--host" => o.host = val()?,
            "--port" => o.port = num(&a, val()?)?,
            "--max-batch" => o.max_batch = num(&a, val()?)?,
            "--max-queue" => o.max_queue = num(&a, val()?)?,
            "--kv-cache-mb" => o.kv_cache_mb = num(&a, val()?)?,
            "--kv-cache-blocks" => o.kv_cache_blocks = Some(num(&a, val()?)?),
            "--block-size" => o.block_size = num(&a, val()?)?,
            "--max-model-len" => o.max_model_len = Some(num(&a, val()?)?),
            "--prefill-chunk" => o.prefill_chunk = num(&a, val()?)?,
            "--prefill-budget" => o.prefill_budget = num(&a, val()?)?,
            "--request-timeout" => o.request_timeout = Duration::from_secs_f64(num(&a, val()?)?),
            "--served-model-name" => o.served_model_name = Some(val()?),
            "--quiet" => o.quiet = true,
            "-h" | "--help" => return Err(USAGE.into()),
            _ => return Err(format!("unknown argument {a}\n{USAGE}")),
        }
    }
    o.model = model.ok_or(format!("--model DIR is required\n{USAGE}"))?;
    Ok(o)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    if args.first().map(String::as_str) == Some("bench") {
        std::process::exit(rt.block_on(lazyfuse_serve::bench::main(args[1..].to_vec())));
    }
    let opts = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    rt.block_on(async {
        match lazyfuse_serve::start(opts).await {
            Ok(r) => {
                eprintln!("lazyfuse-serve: ready on http://{}", r.addr);
                r.wait().await;
            }
            Err(e) => {
                eprintln!("lazyfuse-serve: {e}");
                std::process::exit(1);
            }
        }
    });
}
