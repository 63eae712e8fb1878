//! `lazyfuse-serve bench`: load on any OpenAI-compatible server, in the
//! style of `vllm bench serve`.
//!
//! Requests arrive as a Poisson process at each given rate (`inf`: a
//! burst, all at once), with prompt and output lengths drawn from a seeded
//! distribution, and stream their answers, so each one gives its time to
//! first token, time per output token and inter-token latencies. The same
//! run against two servers on the same checkpoint compares them.

use crate::bench_report::{chart, Report, Sample};
use futures_util::StreamExt;
use lazyfuse::ir::SplitMix64;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const USAGE: &str =
    "usage: lazyfuse-serve bench --url URL [--model NAME] [--endpoint completions|chat]
    [--rates 1,2,4,inf] [--num-prompts 64] [--input-len 64] [--output-len 64] [--len-spread 0.25]
    [--prompt-kind ids|words] [--vocab 128] [--shared-prefix 0] [--max-concurrency N]
    [--seed 0] [--label NAME] [--json FILE] [--no-ignore-eos]
       lazyfuse-serve bench --chart OUT.png FILE.json...   (latency against throughput per label)";

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchArgs {
    url: String,
    model: Option<String>,
    chat: bool,
    rates: Vec<f64>,
    num_prompts: usize,
    input_len: usize,
    output_len: usize,
    spread: f64,
    words: bool,
    vocab: u32,
    shared_prefix: usize,
    max_concurrency: Option<usize>,
    seed: u64,
    ignore_eos: bool,
    label: String,
    json: Option<PathBuf>,
}

fn parse(args: Vec<String>) -> Result<Result<BenchArgs, (PathBuf, Vec<PathBuf>)>, String> {
    let mut a = BenchArgs {
        url: String::new(),
        model: None,
        chat: false,
        rates: vec![f64::INFINITY],
        num_prompts: 64,
        input_len: 64,
        output_len: 64,
        spread: 0.25,
        words: false,
        vocab: 128,
        shared_prefix: 0,
        max_concurrency: None,
        seed: 0,
        ignore_eos: true,
        label: "server".into(),
        json: None,
    };
    let mut chart_out = None;
    let mut files = vec![];
    let mut it = args.into_iter();
    while let Some(f) = it.next() {
        let mut val = || it.next().ok_or(format!("{f} needs a value"));
        fn num<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String> {
            v.parse().map_err(|_| format!("{flag}: cannot parse {v:?}"))
        }
        match f.as_str() {
            "--url" => a.url = val()?.trim_end_matches('/').to_string(),
            "--model" => a.model = Some(val()?),
            "--endpoint" => a.chat = val()? == "chat",
            "--rates" => {
                a.rates = val()?
                    .split(',')
                    .map(|r| {
                        if r == "inf" {
                            Ok(f64::INFINITY)
                        } else {
                            num("--rates", r.to_string())
                        }
                    })
                    .collect::<Result<_, _>>()?
            }
            "--num-prompts" => a.num_prompts = num(&f, val()?)?,
            "--input-len" => a.input_len = num(&f, val()?)?,
            "--output-len" => a.output_len = num(&f, val()?)?,
            "--len-spread" => a.spread = num(&f, val()?)?,
            "--prompt-kind" => a.words = val()? == "words",
            "--vocab" => a.vocab = num(&f, val()?)?,
            "--shared-prefix" => a.shared_prefix = num(&f, val()?)?,
            "--max-concurrency" => a.max_concurrency = Some(num(&f, val()?)?),
            "--seed" => a.seed = num(&f, val()?)?,
            "--label" => a.label = val()?,
            // For servers that reject the field (not in OpenAI's API).
            "--no-ignore-eos" => a.ignore_eos = false,
            "--json" => a.json = Some(PathBuf::from(val()?)),
            "--chart" => chart_out = Some(PathBuf::from(val()?)),
            "-h" | "--help" => return Err(USAGE.into()),
            s if !s.starts_with('-') && chart_out.is_some() => files.push(PathBuf::from(s)),
            _ => return Err(format!("unknown argument {f}\n{USAGE}")),
        }
    }
    if let Some(out) = chart_out {
        return Ok(Err((out, files)));
    }
    if a.url.is_empty() {
        return Err(format!("--url is required\n{USAGE}"));
    }
    Ok(Ok(a))
}

/// One request of the workload.
struct Job {
    prompt: Value,
    max_tokens: usize,
}

fn uniform(rng: &mut SplitMix64) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// A length around `mean`, uniform within `spread` of it, at least 1.
fn length(rng: &mut SplitMix64, mean: usize, spread: f64) -> usize {
    let lo = mean as f64 * (1.0 - spread);
    let hi = mean as f64 * (1.0 + spread);
    ((lo + (hi - lo) * uniform(rng)).round() as usize).max(1)
}

fn workload(a: &BenchArgs) -> Vec<Job> {
    let mut rng = SplitMix64::new(a.seed);
    let word = |i: u32| crate::bench_report::WORDS[i as usize % crate::bench_report::WORDS.len()];
    let prefix: Vec<u32> = (0..a.shared_prefix)
        .map(|_| 3 + rng.next_u64() as u32 % (a.vocab - 3))
        .collect();
    (0..a.num_prompts)
        .map(|_| {
            let n = length(&mut rng, a.input_len, a.spread);
            let mut ids = prefix.clone();
            ids.extend((0..n).map(|_| 3 + rng.next_u64() as u32 % (a.vocab - 3)));
            let prompt = if a.words || a.chat {
                Value::String(ids.iter().map(|&i| word(i)).collect::<Vec<_>>().join(" "))
            } else {
                json!(ids)
            };
            Job {
                prompt,
                max_tokens: length(&mut rng, a.output_len, a.spread),
            }
        })
        .collect()
}

/// Streams one request; its timings, or why it failed.
async fn one(client: &reqwest::Client, a: &BenchArgs, job: &Job) -> Result<Sample, String> {
    let mut body = json!({
        "max_tokens": job.max_tokens, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true},
    });
    if a.ignore_eos {
        body["ignore_eos"] = json!(true);
    }
    if let Some(m) = &a.model {
        body["model"] = json!(m);
    }
    let path = if a.chat {
        body["messages"] = json!([{"role": "user", "content": job.prompt}]);
        "/v1/chat/completions"
    } else {
        body["prompt"] = job.prompt.clone();
        "/v1/completions"
    };
    let start = Instant::now();
    let r = client
        .post(format!("{}{path}", a.url))
        .json(&body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !r.status().is_success() {
        return Err(format!(
            "status {}: {}",
            r.status(),
            r.text().await.unwrap_or_default()
        ));
    }
    let mut stream = r.bytes_stream();
    let (mut buf, mut times, mut usage_tokens) = (String::new(), Vec::new(), None);
    while let Some(chunk) = stream.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk.map_err(|e| e.to_string())?));
        while let Some(end) = buf.find('\n') {
            let line: String = buf.drain(..=end).collect();
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_str(data).map_err(|e| format!("{e}: {data}"))?;
            if v.get("error").is_some() {
                return Err(v["error"].to_string());
            }
            if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                usage_tokens = Some(n as usize);
            }
            // A chunk is a token when it carries text, or carries an empty
            // text mid-stream (a token whose text is not settled yet, or a
            // server without a tokenizer); a role-only opening chunk and
            // the closing chunk are not.
            let c = &v["choices"][0];
            let text = c["text"]
                .as_str()
                .or_else(|| c["delta"]["content"].as_str());
            let opening = c["delta"].get("role").is_some();
            let token = match text {
                Some(t) if !t.is_empty() => true,
                Some(_) => c["finish_reason"].is_null() && !opening,
                None => false,
            };
            if token {
                times.push(start.elapsed());
            }
        }
    }
    let end = start.elapsed();
    let Some(&first) = times.first() else {
        return Err("no token came back".into());
    };
    let tokens = usage_tokens.unwrap_or(times.len());
    Ok(Sample {
        ttft: first.as_secs_f64(),
        e2e: end.as_secs_f64(),
        itl: times
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs_f64())
            .collect(),
        output_tokens: tokens,
    })
}

async fn run_rate(a: &BenchArgs, jobs: &[Job], rate: f64) -> Report {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(3600))
        .build()
        .expect("an HTTP client");
    let limit = std::sync::Arc::new(tokio::sync::Semaphore::new(
        a.max_concurrency.unwrap_or(usize::MAX >> 4),
    ));
    let mut rng = SplitMix64::new(a.seed ^ 0x5eed);
    let bar = indicatif::ProgressBar::new(jobs.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("{msg} {wide_bar} {pos}/{len} {elapsed}")
            .expect("a valid template"),
    );
    bar.set_message(format!("{} at {rate} req/s", a.label));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(jobs.len());
    let mut at = 0.0;
    for job in jobs {
        if rate.is_finite() {
            at += -(1.0 - uniform(&mut rng)).ln() / rate;
            tokio::time::sleep_until(tokio::time::Instant::from_std(
                start + Duration::from_secs_f64(at),
            ))
            .await;
        }
        let permit = limit
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore stays open");
        let (client, a, bar) = (client.clone(), a.clone(), bar.clone());
        let job = Job {
            prompt: job.prompt.clone(),
            max_tokens: job.max_tokens,
        };
        tasks.push(tokio::spawn(async move {
            let r = one(&client, &a, &job).await;
            drop(permit);
            bar.inc(1);
            r
        }));
    }
    let mut samples = vec![];
    let mut failures = vec![];
    for t in tasks {
        match t.await {
            Ok(Ok(s)) => samples.push(s),
            Ok(Err(e)) => failures.push(e),
            Err(e) => failures.push(e.to_string()),
        }
    }
    bar.finish_and_clear();
    if let Some(f) = failures.first() {
        eprintln!(
            "{} of {} requests failed; the first: {f}",
            failures.len(),
            jobs.len()
        );
    }
    Report::new(
        &a.label,
        rate,
        start.elapsed().as_secs_f64(),
        samples,
        failures.len(),
    )
}

/// Runs the benchmark (or draws a chart); the process exit code.
pub async fn main(args: Vec<String>) -> i32 {
    let a = match parse(args) {
        Ok(Ok(a)) => a,
        Ok(Err((out, files))) => {
            return match chart(&out, &files) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("{e}");
                    1
                }
            }
        }
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    let jobs = workload(&a);
    let mut reports = vec![];
    println!("{}", Report::header());
    for &rate in &a.rates {
        let r = run_rate(&a, &jobs, rate).await;
        println!("{}", r.row());
        reports.push(r);
    }
    if let Some(path) = &a.json {
        let v: Vec<Value> = reports.iter().map(Report::to_json).collect();
        if let Err(e) = std::fs::write(path, serde_json::to_string_pretty(&v).expect("JSON")) {
            eprintln!("{}: {e}", path.display());
            return 1;
        }
    }
    i32::from(reports.iter().any(|r| r.completed == 0))
}
