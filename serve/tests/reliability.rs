//! What a client can do wrong, or leave half done, never costs the server:
//! bad input gets an OpenAI error with the right status, a client that
//! disconnects frees its sequence and blocks, a full queue answers 429 at
//! once, and a burst loses no request and leaks no block.

mod common;

use common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn assert_error(status: u16, v: &Value, want: u16, param: Option<&str>) {
    assert_eq!(status, want, "{v}");
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert!(e.as_object().unwrap().contains_key("code"), "{v}");
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_is_an_openai_error_and_the_server_goes_on() {
    let _serial = serial().await;
    let mut o = options(checkpoint("bad-input"));
    o.max_body_bytes = 64 << 10;
    let (server, url) = serve(o).await;
    let c = "/v1/completions";
    let cases: Vec<(&str, Vec<u8>, u16, Option<&str>)> = vec![
        ("malformed", b"{\"prompt\": [1, 2".to_vec(), 400, None),
        ("not an object", b"[1, 2]".to_vec(), 400, None),
        ("not utf-8", vec![b'{', 0xff, 0xfe, b'}'], 400, None),
        (
            "missing prompt",
            br#"{"max_tokens": 3}"#.to_vec(),
            400,
            Some("prompt"),
        ),
        (
            "prompt of a wrong type",
            br#"{"prompt": 5}"#.to_vec(),
            400,
            Some("prompt"),
        ),
        (
            "negative token id",
            br#"{"prompt": [1, -2]}"#.to_vec(),
            400,
            Some("prompt"),
        ),
        (
            "token id outside the vocabulary",
            br#"{"prompt": [1, 100000]}"#.to_vec(),
            400,
            Some("prompt"),
        ),
        (
            "max_tokens 0",
            br#"{"prompt": [1], "max_tokens": 0}"#.to_vec(),
            400,
            Some("max_tokens"),
        ),
        (
            "max_tokens negative",
            br#"{"prompt": [1], "max_tokens": -4}"#.to_vec(),
            400,
            Some("max_tokens"),
        ),
        (
            "max_tokens a string",
            br#"{"prompt": [1], "max_tokens": "4"}"#.to_vec(),
            400,
            Some("max_tokens"),
        ),
        (
            "max_tokens past the context",
            br#"{"prompt": [1, 2], "max_tokens": 127}"#.to_vec(),
            400,
            Some("max_tokens"),
        ),
        (
            "n too large",
            br#"{"prompt": [1], "n": 1000}"#.to_vec(),
            400,
            Some("n"),
        ),
        (
            "temperature below 0",
            br#"{"prompt": [1], "temperature": -0.5}"#.to_vec(),
            400,
            Some("temperature"),
        ),
        (
            "top_p above 1",
            br#"{"prompt": [1], "top_p": 1.5}"#.to_vec(),
            400,
            Some("top_p"),
        ),
        (
            "stop of a wrong type",
            br#"{"prompt": [1], "stop": 3}"#.to_vec(),
            400,
            Some("stop"),
        ),
        (
            "stream of a wrong type",
            br#"{"prompt": [1], "stream": "yes"}"#.to_vec(),
            400,
            Some("stream"),
        ),
        (
            "unknown model",
            br#"{"prompt": [1], "model": "gpt-9"}"#.to_vec(),
            404,
            Some("model"),
        ),
    ];
    for (what, body, status, param) in cases {
        let (s, v) = post(&url, c, body).await;
        eprintln!("{what}: {v}");
        assert_error(s, &v, status, param);
    }
    // The prompt longer than the context: the message gives the lengths.
    let long: Vec<u32> = (0..200).map(|i| 3 + i % 100).collect();
    let (s, v) = post(&url, c, json!({"prompt": long}).to_string()).await;
    assert_error(s, &v, 400, Some("prompt"));
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.contains("200") && m.contains("128"), "{m}");
    // Chat-specific: messages missing or malformed.
    let chat = "/v1/chat/completions";
    let (s, v) = post(
        &url,
        chat,
        r#"{"model": "x", "messages": [{"role": "user", "content": "hi"}]}"#,
    )
    .await;
    assert_error(s, &v, 404, Some("model"));
    let (s, v) = post(&url, chat, r#"{"messages": []}"#).await;
    assert_error(s, &v, 400, Some("messages"));
    let (s, v) = post(&url, chat, r#"{"messages": [{"content": "hi"}]}"#).await;
    assert_error(s, &v, 400, Some("messages[0]"));
    // A body over the limit.
    let big = format!("{{\"prompt\": \"{}\"}}", "the ".repeat(40_000));
    let (s, v) = post(&url, c, big).await;
    assert_error(s, &v, 413, None);
    let (s, v) = post(&url, "/v1/nothing-here", "{}").await;
    assert_error(s, &v, 404, None);
    // Still serving, nothing held.
    let (s, v) = post(
        &url,
        c,
        json!({"prompt": [1, 5], "max_tokens": 3}).to_string(),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(settled(&url).await, (0.0, 0.0, 0.0));
    assert!(
        metric(
            &url,
            "lazyfuse_serve_requests_total{endpoint=\"completions\",status=\"400\"}"
        )
        .await
            >= 15.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_disconnects_mid_stream_frees_its_sequence_and_blocks() {
    let _serial = serial().await;
    let mut o = options(checkpoint("disconnect"));
    o.max_model_len = Some(256);
    let (server, url) = serve(o).await;
    let body = json!({"prompt": [1, 5, 9, 20, 30, 40], "max_tokens": 250, "ignore_eos": true, "stream": true});
    let r = client()
        .post(format!("{url}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut chunks = r.bytes_stream();
    let mut seen = 0;
    while seen < 3 {
        let c = chunks.next().await.unwrap().unwrap();
        seen += String::from_utf8_lossy(&c).matches("data: ").count();
    }
    assert!(metric(&url, "lazyfuse_serve_running_sequences").await >= 1.0);
    drop(chunks);
    assert_eq!(settled(&url).await, (0.0, 0.0, 0.0));
    // A non-streaming client that gives up (a client-side timeout) too.
    let quick = reqwest::Client::builder()
        .timeout(Duration::from_millis(30))
        .build()
        .unwrap();
    let slow = json!({"prompt": [1, 5, 9], "max_tokens": 250, "ignore_eos": true, "n": 4});
    assert!(quick
        .post(format!("{url}/v1/completions"))
        .json(&slow)
        .send()
        .await
        .is_err());
    assert_eq!(settled(&url).await, (0.0, 0.0, 0.0));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_queue_answers_429_at_once_and_a_burst_loses_nothing() {
    let _serial = serial().await;
    let mut o = options(checkpoint("burst"));
    o.max_batch = 4;
    o.max_queue = 4;
    o.max_model_len = Some(256);
    o.request_timeout = Duration::from_secs(60);
    let (server, url) = serve(o).await;
    // Eight long requests fill the batch and the queue.
    let long = |i: u32| json!({"prompt": [1, 5 + i, 9], "max_tokens": 250, "ignore_eos": true});
    let hold: Vec<_> = (0..8)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move { post(&url, "/v1/completions", long(i).to_string()).await })
        })
        .collect();
    for _ in 0..400 {
        let running = metric(&url, "lazyfuse_serve_running_sequences").await;
        if running == 4.0 && metric(&url, "lazyfuse_serve_waiting_sequences").await == 4.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t = Instant::now();
    let (s, v) = post(&url, "/v1/completions", long(9).to_string()).await;
    assert_error(s, &v, 429, None);
    assert!(t.elapsed() < Duration::from_secs(2), "a 429 comes at once");
    for h in hold {
        let (s, v) = h.await.unwrap();
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 250);
    }
    // A burst of 40 mixed requests: each is answered in full or with a
    // clear 429; none is lost, nothing leaks.
    let tasks: Vec<_> = (0..40u32)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                let body = json!({"prompt": (0..1 + i % 30).map(|k| 3 + (k * 7 + i) % 120).collect::<Vec<_>>(),
                    "max_tokens": 1 + i % 17, "ignore_eos": true, "stream": i % 3 == 0, "temperature": 0});
                let r = client().post(format!("{url}/v1/completions")).json(&body).send().await.unwrap();
                let status = r.status().as_u16();
                let text = r.text().await.unwrap();
                (i, status, text)
            })
        })
        .collect();
    let (mut ok, mut refused) = (0, 0);
    for t in tasks {
        let (i, status, text) = t.await.unwrap();
        match status {
            200 if i % 3 == 0 => {
                assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
                let n = text
                    .lines()
                    .filter(|l| l.starts_with("data: {") && !l.contains("\"error\""))
                    .count();
                assert!(n >= 1, "{text}");
                ok += 1;
            }
            200 => {
                let v: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(v["usage"]["completion_tokens"], 1 + i % 17, "{v}");
                ok += 1;
            }
            429 => {
                let v: Value = serde_json::from_str(&text).unwrap();
                assert_error(429, &v, 429, None);
                refused += 1;
            }
            s => panic!("request {i}: status {s}: {text}"),
        }
    }
    assert_eq!(ok + refused, 40);
    assert!(ok >= 8, "{ok} answered, {refused} refused");
    assert_eq!(settled(&url).await, (0.0, 0.0, 0.0));
    assert_eq!(
        metric(&url, "lazyfuse_serve_lazyfuse_compiles_after_warmup").await,
        0.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_small_cache_bounds_the_batch_and_preempted_sequences_finish_the_same() {
    let _serial = serial().await;
    // Blocks for three of the requests at a time: eight share them by
    // waiting and by preemption, and each still gets its greedy tokens.
    let mut o = options(checkpoint("small-cache"));
    let model = lazyfuse_models::Llama::load(fixture(), &lazyfuse::Device::cpu().unwrap()).unwrap();
    // 12 blocks of 16: a 128-token sequence needs 8, each request here 4.
    o.kv_cache_blocks = Some(12);
    let (server, url) = serve(o).await;
    let reqs: Vec<_> = (0..8u32)
        .map(|i| {
            let url = url.clone();
            let p: Vec<u32> = (0..5 + i).map(|k| 3 + (k * 11 + i) % 120).collect();
            let body = json!({"prompt": p, "max_tokens": 40, "temperature": 0, "ignore_eos": true});
            tokio::spawn(async move { (p, post(&url, "/v1/completions", body.to_string()).await) })
        })
        .collect();
    for t in reqs {
        let (p, (s, v)) = t.await.unwrap();
        assert_eq!(s, 200, "{v}");
        assert_eq!(
            ids(&v["choices"][0]["token_ids"]),
            model.generate_greedy(&p, 40).unwrap()
        );
    }
    assert_eq!(settled(&url).await, (0.0, 0.0, 0.0));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_model_step_fails_its_requests_with_500_and_the_server_goes_on() {
    let _serial = serial().await;
    let model = lazyfuse_models::Llama::load(fixture(), &lazyfuse::Device::cpu().unwrap()).unwrap();
    let want = model.generate_greedy(&[1, 5, 9, 20], 8).unwrap();
    let (server, url) = serve(options(checkpoint("step-fault"))).await;
    let body =
        json!({"prompt": [1, 5, 9, 20], "max_tokens": 8, "temperature": 0, "ignore_eos": true});
    // Every region with an rsqrt (each RMSNorm) fails when launched.
    lazyfuse::testing::inject_execution_fault(Some("rsqrt"));
    let (s, v) = post(&url, "/v1/completions", body.to_string()).await;
    lazyfuse::testing::inject_execution_fault(None);
    assert_error(s, &v, 500, None);
    let (s, v) = post(&url, "/v1/completions", body.to_string()).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(ids(&v["choices"][0]["token_ids"]), want);
    assert_eq!(settled(&url).await, (0.0, 0.0, 0.0));
    server.stop().await;
}
