//! The HTTP side: routes, request checks, admission control, and streaming
//! the engine's events back as OpenAI responses.

use crate::api::{self, ApiError, Endpoint, GenSpec, Limits, Prompt};
use crate::engine::Cmd;
use crate::metrics::Metrics;
use crate::respond::{usage, Choice, Head};
use crate::seq::{EventKind, SeqRequest};
use crate::template::ChatTemplate;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lazyfuse::ir::SplitMix64;
use lazyfuse_models::Tokenizer;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// What the handlers share.
pub struct AppState {
    /// The engine's inbox.
    pub cmd: Mutex<mpsc::Sender<Cmd>>,
    /// Text to ids and back (`None`: the checkpoint has no tokenizer.json).
    pub tokenizer: Option<Arc<Tokenizer>>,
    /// The chat template, if the checkpoint has one.
    pub template: Option<ChatTemplate>,
    /// The name `/v1/models` lists and requests may name.
    pub model_name: String,
    /// The registry `/metrics` renders.
    pub metrics: Arc<Metrics>,
    /// Longest sequence, prompt included.
    pub max_model_len: usize,
    /// Tokens in the vocabulary.
    pub vocab: usize,
    /// Sequences running or queued at most; more is a 429.
    pub capacity: usize,
    /// Sequences submitted and not yet answered.
    pub outstanding: Arc<AtomicUsize>,
    /// Longest a request may take.
    pub timeout: Duration,
    /// Limits on `n` and log-probabilities.
    pub limits: Limits,
    /// Request ids.
    pub next_id: AtomicU64,
}

/// Every route, with `max_body` bytes the most a body may have.
pub fn router(state: Arc<AppState>, max_body: usize) -> Router {
    Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route", None) })
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .with_state(state)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn models(State(s): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": s.model_name, "object": "model", "created": now_secs(),
        "owned_by": "lazyfuse", "max_model_len": s.max_model_len,
    }]}))
}

async fn metrics(State(s): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
    )
}

async fn completions(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = generate(&s, Endpoint::Completions, body).await;
    finish_response(&s, "completions", r)
}

async fn chat(State(s): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let r = generate(&s, Endpoint::Chat, body).await;
    finish_response(&s, "chat_completions", r)
}

fn finish_response(s: &AppState, endpoint: &str, r: Result<Response, ApiError>) -> Response {
    let resp = r.unwrap_or_else(IntoResponse::into_response);
    s.metrics.request(endpoint, resp.status().as_u16());
    resp
}

/// Frees the request's share of the capacity when the request ends in
/// any way (answered, failed, or dropped by a client that left).
struct Outstanding(Arc<AtomicUsize>, usize);

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::SeqCst);
    }
}

/// The prompt ids of a checked request, one list per prompt.
fn prompt_ids(s: &AppState, spec: &GenSpec, endpoint: Endpoint) -> Result<Vec<Vec<u32>>, ApiError> {
    let encode = |text: &str| -> Result<Vec<u32>, ApiError> {
        let tok = s.tokenizer.as_ref().ok_or_else(|| {
            ApiError::bad(
                "prompt",
                "this checkpoint has no tokenizer.json: send token ids",
            )
        })?;
        tok.encode(text)
            .map_err(|e| ApiError::bad("prompt", e.to_string()))
    };
    let prompts = match endpoint {
        Endpoint::Completions => spec
            .prompts
            .iter()
            .map(|p| match p {
                Prompt::Text(t) => encode(t),
                Prompt::Ids(ids) => Ok(ids.clone()),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Endpoint::Chat => {
            let t = s.template.as_ref().ok_or_else(|| {
                ApiError::bad(
                    "messages",
                    "this checkpoint has no chat template: use /v1/completions",
                )
            })?;
            let text = t
                .render(&spec.messages)
                .map_err(|e| ApiError::bad("messages", e))?;
            vec![encode(&text)?]
        }
    };
    for p in &prompts {
        if p.is_empty() {
            return Err(ApiError::bad("prompt", "the prompt has no tokens"));
        }
        if let Some(bad) = p.iter().find(|&&i| i as usize >= s.vocab) {
            return Err(ApiError::bad(
                "prompt",
                format!("token id {bad} is outside the vocabulary of {}", s.vocab),
            ));
        }
        if p.len() >= s.max_model_len {
            return Err(ApiError::bad(
                "prompt",
                format!(
                    "the prompt has {} tokens; this model's context holds {} (prompt and completion), so at most {} prompt tokens",
                    p.len(),
                    s.max_model_len,
                    s.max_model_len - 1
                ),
            ));
        }
    }
    Ok(prompts)
}

async fn generate(
    s: &Arc<AppState>,
    endpoint: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|r| ApiError::new(r.status(), r.body_text(), None))?;
    let mut spec = api::parse(&body, endpoint, &s.limits)?;
    if let Some(m) = &spec.model {
        if *m != s.model_name {
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!(
                    "the model '{m}' does not exist; this server serves '{}'",
                    s.model_name
                ),
                param: Some("model".into()),
                code: Some("model_not_found"),
            });
        }
    }
    let prompts = prompt_ids(s, &spec, endpoint)?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let room = s.max_model_len - longest;
    spec.params.max_tokens = match spec.max_tokens {
        Some(m) if m > room => {
            return Err(ApiError::bad(
                "max_tokens",
                format!(
                    "this model's context holds {} tokens; the request asks for {} ({longest} in the prompt, {m} to generate)",
                    s.max_model_len,
                    longest + m
                ),
            ))
        }
        Some(m) => m,
        None if endpoint == Endpoint::Completions => 16.min(room),
        None => room,
    };
    let total = prompts.len() * spec.n;
    let before = s.outstanding.fetch_add(total, Ordering::SeqCst);
    let guard = Outstanding(s.outstanding.clone(), total);
    if before + total > s.capacity {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("the server is at capacity ({before} sequences running or queued, {} at most); retry later", s.capacity),
            Some("queue_full"),
        ));
    }
    let req = s.next_id.fetch_add(1, Ordering::SeqCst);
    let (tx, rx) = unbounded_channel();
    let arrived = Instant::now();
    let mut noise =
        SplitMix64::new(req ^ arrived.elapsed().as_nanos() as u64 ^ now_secs().rotate_left(17));
    {
        let cmd = s.cmd.lock().unwrap_or_else(|e| e.into_inner());
        for (i, p) in prompts.iter().enumerate() {
            for j in 0..spec.n {
                let choice = i * spec.n + j;
                let mut params = spec.params.clone();
                params.seed = if spec.seeded {
                    params.seed.wrapping_add(choice as u64)
                } else {
                    noise.next_u64()
                };
                let r = SeqRequest {
                    req,
                    choice,
                    prompt: p.clone(),
                    params,
                    events: tx.clone(),
                    arrived,
                };
                if cmd.send(Cmd::Submit(r)).is_err() {
                    return Err(ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the engine has stopped",
                        None,
                    ));
                }
            }
        }
    }
    drop(tx);
    let head = Head {
        id: format!(
            "{}-{req}",
            if endpoint == Endpoint::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            }
        ),
        created: now_secs(),
        model: s.model_name.clone(),
        endpoint,
    };
    let run = Run {
        state: s.clone(),
        req,
        head,
        choices: (0..total)
            .map(|c| Choice::new(c, spec.stop.clone()))
            .collect(),
        prompt_tokens: prompts.iter().map(Vec::len).sum(),
        cached: 0,
        logprobs: spec.params.logprobs.is_some(),
        rx,
        deadline: tokio::time::Instant::now() + s.timeout,
        _guard: guard,
    };
    if spec.stream {
        Ok(run.stream(spec.include_usage))
    } else {
        run.collect().await
    }
}

/// One request in flight: its choices and the engine's events for them.
struct Run {
    state: Arc<AppState>,
    req: u64,
    head: Head,
    choices: Vec<Choice>,
    prompt_tokens: usize,
    cached: usize,
    logprobs: bool,
    rx: UnboundedReceiver<crate::seq::Event>,
    deadline: tokio::time::Instant,
    _guard: Outstanding,
}

/// What one engine event means for the response.
enum Step {
    /// Text (and log-probabilities) for a choice; `finish` when it ended.
    Piece {
        index: usize,
        text: String,
        logprobs: Value,
        finish: Option<&'static str>,
    },
    /// The choice failed.
    Failed(String),
    /// Nothing to send.
    Quiet,
}

impl Run {
    fn tokenizer(&self) -> Option<&Tokenizer> {
        self.state.tokenizer.as_deref()
    }

    fn all_done(&self) -> bool {
        self.choices.iter().all(Choice::done)
    }

    fn usage(&self) -> Value {
        let completion = self.choices.iter().map(|c| c.ids.len()).sum();
        usage(self.prompt_tokens, completion, self.cached)
    }

    /// The next event, or an error once the deadline passes.
    async fn next(&mut self) -> Result<Step, ApiError> {
        let ev = match tokio::time::timeout_at(self.deadline, self.rx.recv()).await {
            Err(_) => {
                let m = format!("the request took longer than {:?}", self.state.timeout);
                return Err(ApiError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    m,
                    Some("timeout"),
                ));
            }
            Ok(None) => {
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the engine dropped the request",
                    None,
                ))
            }
            Ok(Some(ev)) => ev,
        };
        let endpoint = self.head.endpoint;
        let tok = self.state.tokenizer.clone();
        let c = &mut self.choices[ev.choice];
        Ok(match ev.kind {
            EventKind::Token { id, logprobs } => match c.token(tok.as_deref(), id, logprobs) {
                None => Step::Quiet,
                Some(p) => {
                    if p.stopped {
                        let cmd = self.state.cmd.lock().unwrap_or_else(|e| e.into_inner());
                        let _ = cmd.send(Cmd::Cancel {
                            req: self.req,
                            choice: ev.choice,
                        });
                    }
                    let lp = match &p.logprobs {
                        Some(l) => crate::respond::logprobs_json(
                            endpoint,
                            tok.as_deref(),
                            std::slice::from_ref(l),
                            0,
                        ),
                        None => Value::Null,
                    };
                    Step::Piece {
                        index: c.index,
                        text: p.text,
                        logprobs: lp,
                        finish: c.finish,
                    }
                }
            },
            EventKind::Done {
                finish,
                cached_tokens,
                ..
            } => {
                if c.done() {
                    Step::Quiet
                } else {
                    let text = c.end(finish.as_str());
                    self.cached += cached_tokens;
                    Step::Piece {
                        index: c.index,
                        text,
                        logprobs: Value::Null,
                        finish: c.finish,
                    }
                }
            }
            EventKind::Error(m) => {
                c.end("error");
                Step::Failed(m)
            }
        })
    }

    /// Waits for every choice and answers with one body.
    async fn collect(mut self) -> Result<Response, ApiError> {
        while !self.all_done() {
            if let Step::Failed(m) = self.next().await? {
                return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, m, None));
            }
        }
        let body = self
            .head
            .response(&self.choices, self.tokenizer(), self.logprobs, self.usage());
        Ok(Json(body).into_response())
    }

    /// Answers with server-sent events as the tokens come.
    fn stream(mut self, include_usage: bool) -> Response {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<SseEvent, Infallible>>(64);
        tokio::spawn(async move {
            let send = |v: &Value| SseEvent::default().data(v.to_string());
            let mut started = vec![false; self.choices.len()];
            while !self.all_done() {
                let step = match self.next().await {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = tx.send(Ok(send(&e.body()))).await;
                        break;
                    }
                };
                let msg = match step {
                    Step::Quiet => continue,
                    Step::Failed(m) => {
                        let e = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, m, None);
                        let _ = tx.send(Ok(send(&e.body()))).await;
                        break;
                    }
                    Step::Piece {
                        index,
                        text,
                        logprobs,
                        finish,
                    } => {
                        let first = !std::mem::replace(&mut started[index], true);
                        let content =
                            (!text.is_empty() || finish.is_none()).then_some(text.as_str());
                        self.head.chunk(index, content, first, logprobs, finish)
                    }
                };
                // A client that left: dropping `self` cancels its sequences.
                if tx.send(Ok(send(&msg))).await.is_err() {
                    return;
                }
            }
            if include_usage {
                let _ = tx
                    .send(Ok(send(&self.head.usage_chunk(self.usage()))))
                    .await;
            }
            let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
        });
        Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx)).into_response()
    }
}
