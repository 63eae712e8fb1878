//! A sequence being served, and what the engine tells its request.

use crate::sampling::{Sampler, SamplingParams, TokenLogprobs};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end token or a stop token.
    Stop,
    /// `max_tokens`, or the end of the context.
    Length,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// What happened to one choice of a request.
#[derive(Clone, Debug)]
pub enum EventKind {
    /// A token was generated.
    Token {
        /// The token.
        id: u32,
        /// Its log-probabilities, when asked for.
        logprobs: Option<TokenLogprobs>,
    },
    /// The sequence ended.
    Done {
        /// Why.
        finish: Finish,
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Prompt tokens served from the prefix cache.
        cached_tokens: usize,
    },
    /// The sequence failed (a model step failed); the message says why.
    Error(String),
}

/// An event for choice `choice` of a request.
#[derive(Clone, Debug)]
pub struct Event {
    /// Which choice (`n` > 1 gives several).
    pub choice: usize,
    /// What happened.
    pub kind: EventKind,
}

/// One sequence to generate: a choice of a request.
pub struct SeqRequest {
    /// The request's id (shared by its choices).
    pub req: u64,
    /// The choice's index.
    pub choice: usize,
    /// Prompt token ids (at least one).
    pub prompt: Vec<u32>,
    /// How to sample.
    pub params: SamplingParams,
    /// Where events go; a closed channel cancels the sequence.
    pub events: UnboundedSender<Event>,
    /// When the request arrived.
    pub arrived: Instant,
}

/// A sequence in the engine.
pub(crate) struct Seq {
    pub req: u64,
    pub choice: usize,
    /// Prompt, then generated tokens.
    pub tokens: Vec<u32>,
    pub n_prompt: usize,
    /// Leading tokens whose keys and values are in `blocks`.
    pub computed: usize,
    pub blocks: Vec<u32>,
    /// Prefix-cache names of the leading full blocks.
    pub hashes: Vec<u64>,
    pub sampler: Sampler,
    pub events: UnboundedSender<Event>,
    pub arrived: Instant,
    pub last_token: Option<Instant>,
    pub cached_tokens: usize,
}

impl Seq {
    pub fn new(r: SeqRequest) -> Seq {
        Seq {
            req: r.req,
            choice: r.choice,
            n_prompt: r.prompt.len(),
            tokens: r.prompt,
            computed: 0,
            blocks: vec![],
            hashes: vec![],
            sampler: Sampler::new(r.params),
            events: r.events,
            arrived: r.arrived,
            last_token: None,
            cached_tokens: 0,
        }
    }

    /// Tokens not yet run through the model (1 when decoding).
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.computed
    }

    pub fn generated(&self) -> usize {
        self.tokens.len() - self.n_prompt
    }

    /// Sends `kind`; false when the client is gone.
    pub fn send(&self, kind: EventKind) -> bool {
        self.events
            .send(Event {
                choice: self.choice,
                kind,
            })
            .is_ok()
    }
}
