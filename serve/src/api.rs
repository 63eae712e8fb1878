//! Request bodies of the OpenAI API, checked field by field into what the
//! engine runs, and the OpenAI error body for everything that is wrong.

use crate::sampling::SamplingParams;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

/// An error as OpenAI's API returns it.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// The offending field, if one.
    pub param: Option<String>,
    /// A machine-readable code, if one.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 about field `param`.
    pub fn bad(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.into()),
            code: None,
        }
    }

    /// An error with `status` and no field.
    pub fn new(
        status: StatusCode,
        message: impl Into<String>,
        code: Option<&'static str>,
    ) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code,
        }
    }

    /// OpenAI's error `type` for the status.
    pub fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 413 | 422 => "invalid_request_error",
            401 => "authentication_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            503 => "service_unavailable_error",
            504 => "timeout_error",
            _ => "server_error",
        }
    }

    /// The `{"error": {...}}` body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind(),
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// A prompt as sent: text, or token ids.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Text to tokenize.
    Text(String),
    /// Token ids as given.
    Ids(Vec<u32>),
}

/// Which endpoint a request came to (they differ in defaults and shapes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

/// A generation request, checked.
#[derive(Clone, Debug)]
pub struct GenSpec {
    /// Completions: the prompts; chat: empty (see `messages`).
    pub prompts: Vec<Prompt>,
    /// Chat: the messages.
    pub messages: Value,
    /// Sampling; `max_tokens` is `None` when the request left it to the server.
    pub params: SamplingParams,
    /// Whether `max_tokens` was given.
    pub max_tokens: Option<usize>,
    /// Whether `seed` was given.
    pub seeded: bool,
    /// Choices per prompt.
    pub n: usize,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Server-sent events.
    pub stream: bool,
    /// A last chunk with usage (`stream_options.include_usage`).
    pub include_usage: bool,
    /// The `model` named, if any.
    pub model: Option<String>,
}

/// The limits a request is checked against.
pub struct Limits {
    /// Largest `n`.
    pub max_n: usize,
    /// Largest `top_logprobs` / `logprobs`.
    pub max_logprobs: usize,
}

struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    fn f64(&self, k: &str) -> Result<Option<f64>, ApiError> {
        self.get(k)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| ApiError::bad(k, format!("'{k}' must be a number")))
            })
            .transpose()
    }

    fn int(&self, k: &str) -> Result<Option<i64>, ApiError> {
        self.get(k)
            .map(|v| {
                v.as_i64()
                    .or_else(|| {
                        v.as_f64()
                            .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
                            .map(|f| f as i64)
                    })
                    .ok_or_else(|| ApiError::bad(k, format!("'{k}' must be an integer")))
            })
            .transpose()
    }

    fn bool(&self, k: &str) -> Result<Option<bool>, ApiError> {
        self.get(k)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| ApiError::bad(k, format!("'{k}' must be a boolean")))
            })
            .transpose()
    }

    fn ranged(&self, k: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        match self.f64(k)? {
            Some(x) if !(lo..=hi).contains(&x) => Err(ApiError::bad(
                k,
                format!("'{k}' must be between {lo} and {hi}, got {x}"),
            )),
            x => Ok(x),
        }
    }
}

fn token_ids(v: &Value, param: &str) -> Result<Vec<u32>, ApiError> {
    let arr = v
        .as_array()
        .ok_or_else(|| ApiError::bad(param, "expected a list of token ids"))?;
    arr.iter()
        .map(|x| {
            x.as_u64()
                .filter(|&i| i <= u32::MAX as u64)
                .map(|i| i as u32)
                .ok_or_else(|| {
                    ApiError::bad(param, format!("token id {x} is not a non-negative integer"))
                })
        })
        .collect()
}

fn prompts(v: Option<&Value>) -> Result<Vec<Prompt>, ApiError> {
    let bad = || {
        ApiError::bad(
            "prompt",
            "'prompt' must be a string, a list of token ids, or a list of either",
        )
    };
    match v {
        None => Err(ApiError::bad("prompt", "'prompt' is required")),
        Some(Value::String(s)) => Ok(vec![Prompt::Text(s.clone())]),
        Some(Value::Array(a)) if a.is_empty() => Err(ApiError::bad("prompt", "'prompt' is empty")),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => Ok(vec![Prompt::Ids(
            token_ids(&Value::Array(a.clone()), "prompt")?,
        )]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|p| match p {
                Value::String(s) => Ok(Prompt::Text(s.clone())),
                Value::Array(_) => Ok(Prompt::Ids(token_ids(p, "prompt")?)),
                _ => Err(bad()),
            })
            .collect(),
        Some(_) => Err(bad()),
    }
}

/// Chat messages: a non-empty list of objects with a string `role` and a
/// string (or text-part list) `content`; parts are joined into one string.
fn messages(v: Option<&Value>) -> Result<Value, ApiError> {
    let list = v
        .ok_or_else(|| ApiError::bad("messages", "'messages' is required"))?
        .as_array()
        .filter(|a| !a.is_empty())
        .ok_or_else(|| ApiError::bad("messages", "'messages' must be a non-empty list"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let param = format!("messages[{i}]");
        let mut m = m
            .as_object()
            .cloned()
            .ok_or_else(|| ApiError::bad(&param, "a message must be an object"))?;
        if !m.get("role").is_some_and(Value::is_string) {
            return Err(ApiError::bad(&param, "a message needs a string 'role'"));
        }
        let content = match m.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .map(|p| {
                    match (
                        p.get("type").and_then(Value::as_str),
                        p.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(t)) => Ok(t.to_string()),
                        _ => Err(ApiError::bad(
                            &param,
                            "only text content parts are supported",
                        )),
                    }
                })
                .collect::<Result<Vec<_>, _>>()?
                .join(""),
            Some(_) => {
                return Err(ApiError::bad(
                    &param,
                    "'content' must be a string or a list of parts",
                ))
            }
        };
        m.insert("content".into(), Value::String(content));
        out.push(Value::Object(m));
    }
    Ok(Value::Array(out))
}

/// Checks a request body for `endpoint`.
pub fn parse(body: &[u8], endpoint: Endpoint, limits: &Limits) -> Result<GenSpec, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        let what = if std::str::from_utf8(body).is_err() {
            "the body is not UTF-8"
        } else {
            "the body is not valid JSON"
        };
        ApiError::new(StatusCode::BAD_REQUEST, format!("{what}: {e}"), None)
    })?;
    let obj = v.as_object().ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "the body must be a JSON object",
            None,
        )
    })?;
    let f = Fields(obj);
    let model = match f.get("model") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::bad("model", "'model' must be a string")),
    };
    let (prompts, messages) = match endpoint {
        Endpoint::Completions => (prompts(f.get("prompt"))?, Value::Null),
        Endpoint::Chat => (vec![], messages(f.get("messages"))?),
    };
    let mut p = SamplingParams::default();
    let max_key = if endpoint == Endpoint::Chat && f.get("max_completion_tokens").is_some() {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let max_tokens = match f.int(max_key)? {
        Some(m) if m < 1 => {
            return Err(ApiError::bad(
                max_key,
                format!("'{max_key}' must be at least 1, got {m}"),
            ))
        }
        m => m.map(|m| m as usize),
    };
    if let Some(t) = f.f64("temperature")? {
        if !(0.0..=1e6).contains(&t) {
            return Err(ApiError::bad(
                "temperature",
                format!("'temperature' must be 0 or more, got {t}"),
            ));
        }
        p.temperature = t as f32;
    }
    p.top_p = match f.ranged("top_p", 0.0, 1.0)? {
        Some(x) if x <= 0.0 => return Err(ApiError::bad("top_p", "'top_p' must be above 0")),
        x => x.filter(|&x| x < 1.0).map(|x| x as f32),
    };
    p.top_k = match f.int("top_k")? {
        Some(k) if k < -1 => {
            return Err(ApiError::bad("top_k", "'top_k' must be -1 (off) or more"))
        }
        k => k.filter(|&k| k > 0).map(|k| k as usize),
    };
    let seed = f.int("seed")?;
    p.seed = seed.unwrap_or(0) as u64;
    p.presence_penalty = f.ranged("presence_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32;
    p.frequency_penalty = f.ranged("frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32;
    p.ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    if let Some(ids) = f.get("stop_token_ids") {
        p.stop_token_ids = token_ids(ids, "stop_token_ids")?;
    }
    p.logprobs = match endpoint {
        Endpoint::Completions => f.int("logprobs")?.map(|k| k.max(-1)),
        Endpoint::Chat => match (f.bool("logprobs")?, f.int("top_logprobs")?) {
            (Some(true), k) => Some(k.unwrap_or(0)),
            (_, Some(_)) => {
                return Err(ApiError::bad(
                    "top_logprobs",
                    "'top_logprobs' needs 'logprobs': true",
                ))
            }
            _ => None,
        },
    }
    .map(|k| {
        if k < 0 || k as usize > limits.max_logprobs {
            Err(ApiError::bad(
                "logprobs",
                format!("logprobs must be between 0 and {}", limits.max_logprobs),
            ))
        } else {
            Ok(k as usize)
        }
    })
    .transpose()?;
    let n = match f.int("n")? {
        None => 1,
        Some(n) if n < 1 || n as usize > limits.max_n => {
            return Err(ApiError::bad(
                "n",
                format!("'n' must be between 1 and {}, got {n}", limits.max_n),
            ))
        }
        Some(n) => n as usize,
    };
    let stop = match f.get("stop") {
        None => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| {
                s.as_str().map(str::to_string).ok_or_else(|| {
                    ApiError::bad("stop", "'stop' must be a string or a list of strings")
                })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::bad(
                "stop",
                "'stop' must be a string or a list of strings",
            ))
        }
    };
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => Fields(o).bool("include_usage")?.unwrap_or(false),
        Some(_) => {
            return Err(ApiError::bad(
                "stream_options",
                "'stream_options' must be an object",
            ))
        }
    };
    Ok(GenSpec {
        prompts,
        messages,
        params: p,
        max_tokens,
        seeded: seed.is_some(),
        n,
        stop,
        stream,
        include_usage,
        model,
    })
}
