//! A server on a test checkpoint (the tiny transformers-made Llama under
//! `tests/fixtures/hf/llama_gqa`, copied with a chat template added) and a
//! small HTTP client.

#![allow(dead_code)]

use lazyfuse_serve::{Options, Running};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// Tests of one binary run one at a time: lazyfuse's compile counter is
/// process-wide, and a test's own reference generation must not count as
/// a server's compile.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static L: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    L.lock().await
}

pub fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/hf/llama_gqa")
}

/// The fixture with a `tokenizer_config.json` holding a chat template,
/// in a fresh directory named `name`.
pub fn checkpoint(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lazyfuse-serve-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
    ] {
        std::fs::copy(fixture().join(f), dir.join(f)).unwrap();
    }
    let template = "{% for m in messages %}{{ m['role'] }} {{ m['content'].strip() }} {% endfor %}{% if add_generation_prompt %}the{% endif %}";
    let cfg = serde_json::json!({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": template});
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    dir
}

/// Options for a quick server on `dir`: a 128-token context, any port.
pub fn options(dir: PathBuf) -> Options {
    Options {
        model: dir,
        port: 0,
        max_batch: 16,
        max_model_len: Some(128),
        prefill_chunk: 64,
        quiet: true,
        ..Options::default()
    }
}

pub async fn serve(o: Options) -> (Running, String) {
    let r = lazyfuse_serve::start(o).await.expect("the server starts");
    let url = format!("http://{}", r.addr);
    (r, url)
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

/// POSTs `body` (JSON text) and returns the status and the JSON answer.
pub async fn post(url: &str, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let r = client()
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// The `data:` payloads of a streamed answer, `[DONE]` included.
pub async fn stream(url: &str, path: &str, body: &Value) -> Vec<String> {
    let r = client()
        .post(format!("{url}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
        .collect()
}

/// One metric's value from `/metrics` (the first line starting with `name`).
pub async fn metric(url: &str, name: &str) -> f64 {
    let text = client()
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
}

/// Waits until the engine reports no running or waiting sequence and no
/// held block (it publishes after every step).
pub async fn settled(url: &str) -> (f64, f64, f64) {
    let mut last = (0.0, 0.0, 0.0);
    for _ in 0..200 {
        last = (
            metric(url, "lazyfuse_serve_running_sequences").await,
            metric(url, "lazyfuse_serve_waiting_sequences").await,
            metric(url, "lazyfuse_serve_kv_cache_blocks_used").await,
        );
        if last == (0.0, 0.0, 0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    last
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}
