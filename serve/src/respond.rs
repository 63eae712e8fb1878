//! Turning engine events into OpenAI response bodies and stream chunks.

use crate::api::Endpoint;
use crate::sampling::TokenLogprobs;
use crate::text::TextStream;
use lazyfuse_models::Tokenizer;
use serde_json::{json, Value};

/// One choice's progress as the events arrive.
pub struct Choice {
    /// Its index in the response.
    pub index: usize,
    text: TextStream,
    /// Tokens generated (up to a stop string, if one matched).
    pub ids: Vec<u32>,
    logprobs: Vec<(u32, TokenLogprobs)>,
    /// `finish_reason` once ended.
    pub finish: Option<&'static str>,
}

/// What one token added to a choice.
pub struct Piece {
    /// Text now settled.
    pub text: String,
    /// Its log-probabilities, when asked for.
    pub logprobs: Option<(u32, TokenLogprobs)>,
    /// A stop string matched: the choice ended.
    pub stopped: bool,
}

impl Choice {
    /// A choice that ends at the first of `stops`.
    pub fn new(index: usize, stops: Vec<String>) -> Choice {
        Choice {
            index,
            text: TextStream::new(stops),
            ids: vec![],
            logprobs: vec![],
            finish: None,
        }
    }

    /// True once the choice has ended.
    pub fn done(&self) -> bool {
        self.finish.is_some()
    }

    /// A generated token; nothing once the choice ended.
    pub fn token(
        &mut self,
        tok: Option<&Tokenizer>,
        id: u32,
        lp: Option<TokenLogprobs>,
    ) -> Option<Piece> {
        if self.done() {
            return None;
        }
        self.ids.push(id);
        let text = tok.map(|t| self.text.push(t, id)).unwrap_or_default();
        let stopped = self.text.stopped();
        if stopped {
            self.finish = Some("stop");
        }
        let logprobs = lp.map(|l| (id, l));
        if let Some(l) = &logprobs {
            self.logprobs.push(l.clone());
        }
        Some(Piece {
            text,
            logprobs,
            stopped,
        })
    }

    /// The sequence ended (`reason`); returns the text still held back.
    pub fn end(&mut self, reason: &'static str) -> String {
        if self.done() {
            return String::new();
        }
        self.finish = Some(reason);
        self.text.finish()
    }

    /// All text released so far.
    pub fn text(&self) -> &str {
        self.text.text()
    }

    /// The choice's log-probabilities in `endpoint`'s format.
    pub fn logprobs_json(&self, endpoint: Endpoint, tok: Option<&Tokenizer>, want: bool) -> Value {
        if !want {
            return Value::Null;
        }
        logprobs_json(endpoint, tok, &self.logprobs, 0)
    }
}

fn piece_text(tok: Option<&Tokenizer>, id: u32) -> String {
    tok.and_then(|t| t.decode(&[id]).ok()).unwrap_or_default()
}

/// `entries` in OpenAI's format: completions' parallel lists, or chat's
/// `content` list with bytes. `offset` starts completions' `text_offset`.
pub fn logprobs_json(
    endpoint: Endpoint,
    tok: Option<&Tokenizer>,
    entries: &[(u32, TokenLogprobs)],
    offset: usize,
) -> Value {
    match endpoint {
        Endpoint::Completions => {
            let mut at = offset;
            let (mut tokens, mut lps, mut tops, mut offs) = (vec![], vec![], vec![], vec![]);
            for (id, l) in entries {
                let s = piece_text(tok, *id);
                offs.push(at);
                at += s.len();
                tokens.push(Value::String(s));
                lps.push(json!(l.logprob));
                let top: serde_json::Map<String, Value> = l
                    .top
                    .iter()
                    .map(|&(t, p)| (piece_text(tok, t), json!(p)))
                    .collect();
                tops.push(Value::Object(top));
            }
            json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs})
        }
        Endpoint::Chat => {
            let entry = |id: u32, lp: f32| {
                let s = piece_text(tok, id);
                json!({"token": s, "logprob": lp, "bytes": s.as_bytes()})
            };
            let content: Vec<Value> = entries
                .iter()
                .map(|(id, l)| {
                    let mut e = entry(*id, l.logprob);
                    e["top_logprobs"] = l.top.iter().map(|&(t, p)| entry(t, p)).collect();
                    e
                })
                .collect();
            json!({"content": content})
        }
    }
}

/// The fields every response and chunk starts with.
pub struct Head {
    /// `cmpl-…` or `chatcmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// Which endpoint.
    pub endpoint: Endpoint,
}

impl Head {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    /// A stream chunk for one choice: `text` (chat: as `delta.content`,
    /// with the role on a choice's first chunk), `finish` once it ends.
    pub fn chunk(
        &self,
        index: usize,
        text: Option<&str>,
        first: bool,
        logprobs: Value,
        finish: Option<&str>,
    ) -> Value {
        let choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": index, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish,
            }),
            Endpoint::Chat => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
        };
        json!({
            "id": self.id, "object": self.object(true), "created": self.created,
            "model": self.model, "choices": [choice],
        })
    }

    /// The last chunk of a stream with `stream_options.include_usage`.
    pub fn usage_chunk(&self, usage: Value) -> Value {
        json!({
            "id": self.id, "object": self.object(true), "created": self.created,
            "model": self.model, "choices": [], "usage": usage,
        })
    }

    /// The whole response of a request that did not stream.
    pub fn response(
        &self,
        choices: &[Choice],
        tok: Option<&Tokenizer>,
        logprobs: bool,
        usage: Value,
    ) -> Value {
        let list: Vec<Value> = choices
            .iter()
            .map(|c| {
                let lp = c.logprobs_json(self.endpoint, tok, logprobs);
                match self.endpoint {
                    Endpoint::Completions => json!({
                        "index": c.index, "text": c.text(), "logprobs": lp,
                        "finish_reason": c.finish, "token_ids": c.ids,
                    }),
                    Endpoint::Chat => json!({
                        "index": c.index,
                        "message": {"role": "assistant", "content": c.text()},
                        "logprobs": lp, "finish_reason": c.finish, "token_ids": c.ids,
                    }),
                }
            })
            .collect();
        json!({
            "id": self.id, "object": self.object(false), "created": self.created,
            "model": self.model, "choices": list, "usage": usage,
        })
    }
}

/// OpenAI's `usage` object.
pub fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}
