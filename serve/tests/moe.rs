//! A mixture-of-experts checkpoint (the tiny transformers-made Mixtral
//! under `tests/fixtures/hf/mixtral`) served with continuous batching: two
//! concurrent greedy requests get transformers' 32 tokens, and changing
//! batches compile nothing after warm-up.

mod common;
use common::*;
use serde_json::{json, Value};
use std::path::PathBuf;

fn mixtral() -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/hf/mixtral");
    let dir = std::env::temp_dir().join(format!("lazyfuse-serve-{}-moe", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    // The fixture has no tokenizer; the Llama fixture's (same 128 tokens) serves.
    std::fs::copy(fixture().join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixtral_serves_transformers_greedy_tokens_without_compiling() {
    let _s = serial().await;
    let dir = mixtral();
    let want: Value = serde_json::from_str(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/fixtures/hf/mixtral/expected.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut o = options(dir);
    o.max_batch = 2;
    o.max_model_len = Some(64);
    o.prefill_chunk = 16;
    let (server, url) = serve(o).await;
    let body = json!({"model": "m", "prompt": want["prompt_ids"], "max_tokens": 32,
                      "temperature": 0, "ignore_eos": true});
    // The model name is whatever the server serves.
    let (_, models) = {
        let r = client()
            .get(format!("{url}/v1/models"))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    let mut body = body;
    body["model"] = models["data"][0]["id"].clone();
    let short = {
        let mut b = body.clone();
        b["max_tokens"] = json!(5);
        b
    };
    let (a, b) = tokio::join!(
        post(&url, "/v1/completions", body.to_string()),
        post(&url, "/v1/completions", short.to_string())
    );
    assert_eq!(a.0, 200, "{}", a.1);
    let greedy = ids(&want["greedy_ids"]);
    assert_eq!(ids(&a.1["choices"][0]["token_ids"]), greedy);
    assert_eq!(ids(&b.1["choices"][0]["token_ids"]), greedy[..5].to_vec());
    assert_eq!(
        metric(&url, "lazyfuse_serve_lazyfuse_compiles_after_warmup").await,
        0.0
    );
    server.stop().await;
}
