//! `/metrics`: the server's counters, gauges and latency histograms in
//! Prometheus text format, from a registry owned by one server (two
//! servers in one process, as in the tests, keep separate numbers).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Every metric the server exports.
pub struct Metrics {
    registry: Registry,
    /// Requests answered, by endpoint and HTTP status.
    pub requests: Family<Vec<(String, String)>, Counter>,
    /// Sequences in the running batch.
    pub running: Gauge,
    /// Sequences waiting to be admitted.
    pub waiting: Gauge,
    /// KV-cache blocks held by sequences.
    pub kv_blocks_used: Gauge,
    /// KV-cache blocks sequences can hold.
    pub kv_blocks_total: Gauge,
    /// Used over total blocks.
    pub kv_usage: Gauge<f64, AtomicU64>,
    /// Arrival to first generated token.
    pub ttft: Histogram,
    /// Time between a sequence's consecutive tokens.
    pub tpot: Histogram,
    /// Arrival to the last token.
    pub e2e: Histogram,
    /// Prompt tokens admitted.
    pub prompt_tokens: Counter,
    /// Prompt tokens whose keys came from the prefix cache.
    pub prefix_hit_tokens: Counter,
    /// Tokens generated.
    pub generation_tokens: Counter,
    /// Sequences preempted (blocks taken back, recomputed later).
    pub preemptions: Counter,
    /// Decode and prefill steps run.
    pub steps: Family<Vec<(String, String)>, Counter>,
    /// lazyfuse XLA compiles in this process.
    pub compiles: Gauge,
    /// lazyfuse XLA compiles since warm-up ended (0 when buckets cover the load).
    pub compiles_after_warmup: Gauge,
}

fn latency_buckets() -> impl Iterator<Item = f64> {
    [
        0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
        20.48, 40.96,
    ]
    .into_iter()
}

impl Metrics {
    /// A fresh registry with every metric at zero.
    pub fn new() -> Metrics {
        let mut r = Registry::with_prefix("lazyfuse_serve");
        let m = Metrics {
            requests: Family::default(),
            running: Gauge::default(),
            waiting: Gauge::default(),
            kv_blocks_used: Gauge::default(),
            kv_blocks_total: Gauge::default(),
            kv_usage: Gauge::default(),
            ttft: Histogram::new(latency_buckets()),
            tpot: Histogram::new(latency_buckets()),
            e2e: Histogram::new(latency_buckets()),
            prompt_tokens: Counter::default(),
            prefix_hit_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            preemptions: Counter::default(),
            steps: Family::default(),
            compiles: Gauge::default(),
            compiles_after_warmup: Gauge::default(),
            registry: Registry::default(),
        };
        r.register(
            "requests",
            "Requests answered, by endpoint and status",
            m.requests.clone(),
        );
        r.register(
            "running_sequences",
            "Sequences in the running batch",
            m.running.clone(),
        );
        r.register(
            "waiting_sequences",
            "Sequences waiting for admission",
            m.waiting.clone(),
        );
        r.register(
            "kv_cache_blocks_used",
            "KV-cache blocks held by sequences",
            m.kv_blocks_used.clone(),
        );
        r.register(
            "kv_cache_blocks_total",
            "KV-cache blocks sequences can hold",
            m.kv_blocks_total.clone(),
        );
        r.register(
            "kv_cache_usage_ratio",
            "Used over total KV-cache blocks",
            m.kv_usage.clone(),
        );
        r.register(
            "time_to_first_token_seconds",
            "Arrival to first generated token",
            m.ttft.clone(),
        );
        r.register(
            "time_per_output_token_seconds",
            "Time between consecutive tokens of a sequence",
            m.tpot.clone(),
        );
        r.register(
            "e2e_request_latency_seconds",
            "Arrival to last token of a sequence",
            m.e2e.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens admitted",
            m.prompt_tokens.clone(),
        );
        r.register(
            "prefix_cache_hit_tokens",
            "Prompt tokens served from the prefix cache",
            m.prefix_hit_tokens.clone(),
        );
        r.register(
            "generation_tokens",
            "Tokens generated",
            m.generation_tokens.clone(),
        );
        r.register(
            "preemptions",
            "Sequences preempted for KV-cache space",
            m.preemptions.clone(),
        );
        r.register("steps", "Model steps run, by kind", m.steps.clone());
        r.register(
            "lazyfuse_compiles",
            "lazyfuse XLA compiles in this process",
            m.compiles.clone(),
        );
        r.register(
            "lazyfuse_compiles_after_warmup",
            "lazyfuse XLA compiles since warm-up ended",
            m.compiles_after_warmup.clone(),
        );
        Metrics { registry: r, ..m }
    }

    /// Counts one answered request.
    pub fn request(&self, endpoint: &str, status: u16) {
        self.requests
            .get_or_create(&vec![
                ("endpoint".into(), endpoint.into()),
                ("status".into(), status.to_string()),
            ])
            .inc();
    }

    /// Counts one model step of `kind` (`prefill` or `decode`).
    pub fn step(&self, kind: &str) {
        self.steps
            .get_or_create(&vec![("kind".into(), kind.into())])
            .inc();
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut s = String::new();
        encode(&mut s, &self.registry).expect("writing to a String cannot fail");
        s
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
