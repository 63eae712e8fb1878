//! The OpenAI endpoints against the real model: batch-invariant greedy
//! tokens equal to `Llama::generate`, streaming, chat templates, sampling
//! options, prefix caching, and no compiles after warm-up.

mod common;

use common::*;
use lazyfuse_models::{GenerateOptions, Llama};
use serde_json::{json, Value};

fn prompt(i: usize) -> Vec<u32> {
    // Lengths 3 to 48, ids spread over the vocabulary.
    (0..3 + i * 3)
        .map(|k| (3 + (i * 7 + k * 13) % 120) as u32)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_concurrent_greedy_requests_each_get_the_tokens_they_get_alone() {
    let _serial = serial().await;
    let model = Llama::load(fixture(), &lazyfuse::Device::cpu().unwrap()).unwrap();
    let opts = GenerateOptions {
        max_new_tokens: 24,
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    let want: Vec<Vec<u32>> = (0..16)
        .map(|i| model.generate(&[prompt(i)], &opts).unwrap().remove(0))
        .collect();
    let (server, url) = serve(options(checkpoint("invariance"))).await;
    // Alone, one at a time.
    for (i, w) in want.iter().enumerate().take(3) {
        let body =
            json!({"prompt": prompt(i), "max_tokens": 24, "temperature": 0, "ignore_eos": true});
        let (s, v) = post(&url, "/v1/completions", body.to_string()).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(ids(&v["choices"][0]["token_ids"]), *w, "prompt {i} alone");
    }
    let compiles = metric(&url, "lazyfuse_serve_lazyfuse_compiles_after_warmup").await;
    // All sixteen at once: they join and leave the batch at different steps.
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                let body = json!({"prompt": prompt(i), "max_tokens": 24, "temperature": 0, "ignore_eos": true});
                post(&url, "/v1/completions", body.to_string()).await
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let (s, v) = t.await.unwrap();
        assert_eq!(s, 200, "{v}");
        assert_eq!(
            ids(&v["choices"][0]["token_ids"]),
            want[i],
            "prompt {i} among 15 others"
        );
        assert_eq!(v["usage"]["completion_tokens"], 24);
        assert_eq!(v["usage"]["prompt_tokens"], prompt(i).len());
        assert_eq!(v["choices"][0]["finish_reason"], "length");
    }
    assert_eq!(compiles, 0.0, "no compile after warm-up");
    assert_eq!(
        metric(&url, "lazyfuse_serve_lazyfuse_compiles_after_warmup").await,
        0.0
    );
    assert_eq!(settled(&url).await, (0.0, 0.0, 0.0));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_chunks_then_usage_then_done_and_chat_uses_the_template() {
    let _serial = serial().await;
    let (server, url) = serve(options(checkpoint("stream"))).await;
    let body = json!({"prompt": "the quick brown fox", "max_tokens": 6, "temperature": 0,
        "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}});
    let chunks = stream(&url, "/v1/completions", &body).await;
    assert_eq!(chunks.last().unwrap(), "[DONE]");
    let parsed: Vec<Value> = chunks[..chunks.len() - 1]
        .iter()
        .map(|c| serde_json::from_str(c).unwrap())
        .collect();
    let usage = parsed.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 6);
    assert_eq!(usage["usage"]["prompt_tokens"], 4);
    let text: String = parsed
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    let finish: Vec<&Value> = parsed
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, vec![&json!("length")]);
    // The same request without streaming gives the same text.
    let mut plain = body.clone();
    plain["stream"] = json!(false);
    let (s, v) = post(&url, "/v1/completions", plain.to_string()).await;
    assert_eq!(s, 200);
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), text);
    assert!(!text.is_empty());

    // Chat: the template renders "user hi the" as the prompt.
    let chat = json!({"messages": [{"role": "user", "content": " hi "}], "max_tokens": 5, "temperature": 0, "ignore_eos": true});
    let (s, v) = post(&url, "/v1/chat/completions", chat.to_string()).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let tok = lazyfuse_models::Tokenizer::from_dir(&fixture())
        .unwrap()
        .unwrap();
    assert_eq!(
        v["usage"]["prompt_tokens"],
        tok.encode("user hi the").unwrap().len()
    );
    let model = Llama::load(fixture(), &lazyfuse::Device::cpu().unwrap()).unwrap();
    let want = model
        .generate_greedy(&tok.encode("user hi the").unwrap(), 5)
        .unwrap();
    assert_eq!(ids(&v["choices"][0]["token_ids"]), want);
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let chunks = stream(&url, "/v1/chat/completions", &streamed).await;
    let first: Value = serde_json::from_str(&chunks[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let content: String = chunks[..chunks.len() - 1]
        .iter()
        .map(|c| serde_json::from_str::<Value>(c).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(
        content,
        v["choices"][0]["message"]["content"].as_str().unwrap()
    );

    let (s, v) = client_get(&url, "/v1/models").await;
    assert_eq!(s, 200);
    assert_eq!(
        v["data"][0]["id"],
        "lazyfuse-serve-".to_string() + &std::process::id().to_string() + "-stream"
    );
    server.stop().await;
}

async fn client_get(url: &str, path: &str) -> (u16, Value) {
    let r = client().get(format!("{url}{path}")).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seeds_stops_penalties_logprobs_and_n() {
    let _serial = serial().await;
    let (server, url) = serve(options(checkpoint("sampling"))).await;
    let sampled = |seed: u64| {
        json!({"prompt": prompt(2), "max_tokens": 12, "temperature": 1.0,
        "top_p": 0.9, "top_k": 50, "seed": seed, "ignore_eos": true})
    };
    let (_, a) = post(&url, "/v1/completions", sampled(7).to_string()).await;
    // The same seed among other requests gives the same tokens.
    let noise: Vec<_> = (0..6)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                post(
                    &url,
                    "/v1/completions",
                    json!({"prompt": prompt(i), "max_tokens": 20, "temperature": 1.0}).to_string(),
                )
                .await
            })
        })
        .collect();
    let (_, b) = post(&url, "/v1/completions", sampled(7).to_string()).await;
    for t in noise {
        assert_eq!(t.await.unwrap().0, 200);
    }
    assert_eq!(a["choices"][0]["token_ids"], b["choices"][0]["token_ids"]);
    let (_, c) = post(&url, "/v1/completions", sampled(8).to_string()).await;
    assert_ne!(a["choices"][0]["token_ids"], c["choices"][0]["token_ids"]);

    // A stop string cuts the text before it; the stop token id ends it too.
    let greedy =
        json!({"prompt": prompt(3), "max_tokens": 16, "temperature": 0, "ignore_eos": true});
    let (_, full) = post(&url, "/v1/completions", greedy.to_string()).await;
    let text = full["choices"][0]["text"].as_str().unwrap().to_string();
    let words: Vec<&str> = text.split(' ').filter(|w| !w.is_empty()).collect();
    let stop = words[words.len() / 2];
    let at = text.find(stop).unwrap();
    let mut with_stop = greedy.clone();
    with_stop["stop"] = json!([stop, "never-in-the-output"]);
    let (_, v) = post(&url, "/v1/completions", with_stop.to_string()).await;
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), &text[..at]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let third = full["choices"][0]["token_ids"][2].clone();
    let mut with_id = greedy.clone();
    with_id["stop_token_ids"] = json!([third]);
    let (_, v) = post(&url, "/v1/completions", with_id.to_string()).await;
    assert_eq!(v["choices"][0]["token_ids"].as_array().unwrap().len(), 3);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // Penalties steer away from tokens already generated: this prompt's
    // greedy output repeats a token, the penalised one differs.
    let rep =
        json!({"prompt": [1, 5, 9, 20], "max_tokens": 6, "temperature": 0, "ignore_eos": true});
    let (_, plain) = post(&url, "/v1/completions", rep.to_string()).await;
    let plain = ids(&plain["choices"][0]["token_ids"]);
    assert!(plain.windows(2).any(|w| w[0] == w[1]), "{plain:?}");
    let mut pen = rep.clone();
    pen["frequency_penalty"] = json!(2.0);
    pen["presence_penalty"] = json!(2.0);
    let (_, v) = post(&url, "/v1/completions", pen.to_string()).await;
    assert_ne!(ids(&v["choices"][0]["token_ids"]), plain);

    // Log-probabilities: the chosen token is the most likely under greedy.
    let mut lp = greedy.clone();
    lp["logprobs"] = json!(3);
    lp["max_tokens"] = json!(4);
    let (_, v) = post(&url, "/v1/completions", lp.to_string()).await;
    let l = &v["choices"][0]["logprobs"];
    assert_eq!(l["token_logprobs"].as_array().unwrap().len(), 4);
    for (k, top) in l["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let best = top
            .as_object()
            .unwrap()
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!((best - l["token_logprobs"][k].as_f64().unwrap()).abs() < 1e-6);
        assert!(best <= 0.0);
    }
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "logprobs": true, "top_logprobs": 2, "temperature": 0});
    let (_, v) = post(&url, "/v1/chat/completions", chat.to_string()).await;
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert!(!content.is_empty());
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);

    // n: that many choices, seeded choices differ from each other.
    let (_, v) = post(&url, "/v1/completions", json!({"prompt": prompt(1), "n": 3, "max_tokens": 8, "seed": 3, "temperature": 1.0, "ignore_eos": true}).to_string()).await;
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    assert_eq!(v["usage"]["completion_tokens"], 24);
    assert_eq!(
        choices
            .iter()
            .map(|c| c["index"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_eq!(settled(&url).await, (0.0, 0.0, 0.0));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shared_prefix_is_served_from_the_cache() {
    let _serial = serial().await;
    let (server, url) = serve(options(checkpoint("prefix"))).await;
    let system: Vec<u32> = (0..64).map(|k| (3 + k * 5 % 120) as u32).collect();
    let ask = |tail: u32| {
        let mut p = system.clone();
        p.extend([tail, tail + 1]);
        json!({"prompt": p, "max_tokens": 4, "temperature": 0, "ignore_eos": true})
    };
    let (_, first) = post(&url, "/v1/completions", ask(10).to_string()).await;
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let (_, second) = post(&url, "/v1/completions", ask(20).to_string()).await;
    assert_eq!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"],
        64
    );
    assert_eq!(
        metric(&url, "lazyfuse_serve_prefix_cache_hit_tokens_total").await,
        64.0
    );
    // Served from the cache, the answer is the one computed from scratch.
    let model = Llama::load(fixture(), &lazyfuse::Device::cpu().unwrap()).unwrap();
    let mut p = system.clone();
    p.extend([20, 21]);
    assert_eq!(
        ids(&second["choices"][0]["token_ids"]),
        model.generate_greedy(&p, 4).unwrap()
    );
    server.stop().await;
}
