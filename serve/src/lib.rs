//! # lazyfuse-serve
//!
//! An OpenAI-compatible server for the `lazyfuse-models` causal LMs:
//! `/v1/completions` and `/v1/chat/completions` (streamed or not),
//! `/v1/models`, `/health` and Prometheus `/metrics`.
//!
//! One engine thread owns the model (lazyfuse records per thread) and runs
//! continuous batching over a paged KV cache with a fixed memory budget
//! and prefix caching ([`engine`]); HTTP handlers on tokio check requests,
//! apply backpressure and turn the engine's token events into response
//! bodies or server-sent events ([`server`]).

#![warn(missing_docs)]

pub mod api;

pub mod bench;
pub mod bench_report;
pub mod blocks;
pub mod buckets;
pub mod engine;
pub mod metrics;
pub mod respond;
pub mod sampling;
pub mod seq;
pub mod server;
pub mod template;
pub mod text;

use api::Limits;
use buckets::Buckets;
use engine::{Cmd, Engine};
use lazyfuse_models::{generate::eos_token_ids, Llama, PagedKv, Tokenizer};
use metrics::Metrics;
use server::AppState;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// How to serve.
#[derive(Clone, Debug)]
pub struct Options {
    /// A Hugging Face checkpoint directory.
    pub model: PathBuf,
    /// Address to listen on.
    pub host: String,
    /// Port (0: any free one).
    pub port: u16,
    /// Most sequences decoded in one step.
    pub max_batch: usize,
    /// Most sequences waiting beyond the running batch; more is a 429.
    pub max_queue: usize,
    /// Memory for the KV cache, in MiB (the blocks it holds bound the
    /// running sequences).
    pub kv_cache_mb: usize,
    /// Exact number of KV-cache blocks, overriding `kv_cache_mb`.
    pub kv_cache_blocks: Option<usize>,
    /// Positions per KV-cache block.
    pub block_size: usize,
    /// Longest sequence served (default: the model's, at most 2048).
    pub max_model_len: Option<usize>,
    /// Most prompt tokens run in one prefill step.
    pub prefill_chunk: usize,
    /// Prompt tokens run (in chunks) between two decode steps.
    pub prefill_budget: usize,
    /// Longest a request may take.
    pub request_timeout: Duration,
    /// Largest request body, in bytes (more is a 413).
    pub max_body_bytes: usize,
    /// Name requests use (default: the directory's name).
    pub served_model_name: Option<String>,
    /// No warm-up progress on stderr.
    pub quiet: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            model: PathBuf::new(),
            host: "127.0.0.1".into(),
            port: 8000,
            max_batch: 32,
            max_queue: 256,
            kv_cache_mb: 256,
            kv_cache_blocks: None,
            block_size: 16,
            max_model_len: None,
            prefill_chunk: 256,
            prefill_budget: 512,
            request_timeout: Duration::from_secs(600),
            max_body_bytes: 4 << 20,
            served_model_name: None,
            quiet: false,
        }
    }
}

/// A started server.
pub struct Running {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its metrics.
    pub metrics: Arc<Metrics>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops accepting, finishes open responses, and returns.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
    }

    /// Serves until the process is interrupted (Ctrl-C).
    pub async fn wait(self) {
        let _ = tokio::signal::ctrl_c().await;
        self.stop().await;
    }
}

/// What the engine thread reports once warm.
struct Ready {
    vocab: usize,
    max_model_len: usize,
    capacity: usize,
}

/// Loads the model on a new engine thread, warms every bucket up, then
/// listens. `Err` says what is wrong with the options or the checkpoint.
pub async fn start(opts: Options) -> Result<Running, String> {
    let dir = opts.model.clone();
    let tokenizer = Tokenizer::from_dir(&dir)
        .map_err(|e| e.to_string())?
        .map(Arc::new);
    let template = template::ChatTemplate::from_dir(&dir)?;
    let metrics = Arc::new(Metrics::new());
    let (cmd_tx, cmd_rx) = mpsc::channel::<Cmd>();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<Result<Ready, String>>();
    let (m, o) = (metrics.clone(), opts.clone());
    std::thread::Builder::new()
        .name("lazyfuse-engine".into())
        .spawn(move || {
            // The engine pads every shape into its own buckets.
            lazyfuse::set_auto_dynamic(false);
            match build_engine(&o, m) {
                Ok((engine, ready)) => {
                    let _ = ready_tx.send(Ok(ready));
                    engine.run(cmd_rx);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })
        .map_err(|e| format!("cannot start the engine thread: {e}"))?;
    let ready = ready_rx
        .await
        .map_err(|_| "the engine thread died while loading".to_string())??;
    let name = opts.served_model_name.clone().unwrap_or_else(|| {
        dir.file_name()
            .map_or("model".into(), |n| n.to_string_lossy().into_owned())
    });
    let state = Arc::new(AppState {
        cmd: Mutex::new(cmd_tx),
        tokenizer,
        template,
        model_name: name,
        metrics: metrics.clone(),
        max_model_len: ready.max_model_len,
        vocab: ready.vocab,
        capacity: ready.capacity + opts.max_queue,
        outstanding: Arc::new(AtomicUsize::new(0)),
        timeout: opts.request_timeout,
        limits: Limits {
            max_n: 16,
            max_logprobs: 20,
        },
        next_id: AtomicU64::new(1),
    });
    let listener = tokio::net::TcpListener::bind((opts.host.as_str(), opts.port))
        .await
        .map_err(|e| format!("cannot listen on {}:{}: {e}", opts.host, opts.port))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    // Streamed tokens are small writes: without TCP_NODELAY, Nagle's
    // algorithm holds each one until the client acknowledges the last
    // (up to its delayed-ACK timer), and tokens arrive in clumps.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let app = server::router(state, opts.max_body_bytes);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stop_rx.await;
            })
            .await;
    });
    Ok(Running {
        addr,
        metrics,
        shutdown: Some(stop_tx),
        task,
    })
}

fn build_engine(o: &Options, metrics: Arc<Metrics>) -> Result<(Engine, Ready), String> {
    let dev = lazyfuse::Device::cpu().map_err(|e| e.to_string())?;
    let model = Llama::load(&o.model, &dev).map_err(|e| format!("{}: {e}", o.model.display()))?;
    let c = &model.config;
    let max_len = o
        .max_model_len
        .unwrap_or(c.max_position_embeddings.min(2048))
        .min(c.max_position_embeddings)
        .max(2);
    let bs = o.block_size.max(1);
    let mut buckets = Buckets::new(o.max_batch.max(1), bs, max_len, o.prefill_chunk);
    buckets.prefill_budget = o.prefill_budget.max(1);
    let per_block = PagedKv::bytes_per_block(&model, bs);
    let budget = (o.kv_cache_mb << 20) / per_block;
    // More blocks than every row at full length (twice, for the prefix
    // cache) would never be used.
    let useful = 2 * buckets.max_batch() * buckets.max_blocks();
    let blocks = o.kv_cache_blocks.unwrap_or(budget.min(useful));
    if blocks < buckets.max_blocks() {
        return Err(format!(
            "the KV cache (--kv-cache-mb {}) holds {blocks} blocks of {bs} positions ({per_block} bytes each), fewer than one sequence of {max_len} tokens needs ({}): raise it or lower --max-model-len",
            o.kv_cache_mb,
            buckets.max_blocks()
        ));
    }
    let eos = eos_token_ids(&o.model, &c.eos_token_ids);
    let (vocab, layers) = (c.vocab_size, c.num_hidden_layers);
    let mut engine =
        Engine::new(model, buckets.clone(), blocks + 1, eos, metrics).map_err(|e| e.to_string())?;
    let bar = if o.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(0).with_style(
            indicatif::ProgressStyle::with_template(
                "warming up {pos}/{len} step shapes {wide_bar} {elapsed}",
            )
            .expect("a valid template"),
        )
    };
    let started = std::time::Instant::now();
    let shapes = buckets.all_shapes().len();
    if !o.quiet {
        eprintln!(
            "lazyfuse-serve: {} ({} layers), context {max_len}, {} KV blocks of {bs}; compiling {shapes} step shapes",
            o.model.display(),
            layers,
            blocks
        );
    }
    engine
        .warm_up(&mut |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        })
        .map_err(|e| format!("warm-up failed: {e}"))?;
    bar.finish_and_clear();
    if !o.quiet {
        eprintln!(
            "lazyfuse-serve: warm in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    Ok((
        engine,
        Ready {
            vocab,
            max_model_len: max_len,
            capacity: buckets.max_batch(),
        },
    ))
}
