//! Generated tokens to text, a piece at a time, with stop strings.
//!
//! A token can end inside a UTF-8 character or change how the previous
//! tokens decode (byte-level BPE, SentencePiece's leading spaces), so the
//! text is decoded from all generated ids and only the part that is
//! settled is released: never a trailing replacement character, and never
//! the last few characters that could still start a stop string.

use lazyfuse_models::Tokenizer;

/// One choice's text as it grows.
pub struct TextStream {
    ids: Vec<u32>,
    /// Bytes of the text already released.
    released: usize,
    stops: Vec<String>,
    text: String,
    stopped: bool,
}

impl TextStream {
    /// A stream that ends at the first of `stops` (not included).
    pub fn new(stops: Vec<String>) -> TextStream {
        TextStream {
            ids: vec![],
            released: 0,
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            text: String::new(),
            stopped: false,
        }
    }

    /// True once a stop string matched: later tokens are ignored.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Adds a token; returns the text now settled.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        if self.stopped {
            return String::new();
        }
        self.ids.push(id);
        let text = tok.decode(&self.ids).unwrap_or_default();
        // Text decoded earlier can change only in its unsettled tail.
        let from = self.released.saturating_sub(8);
        let from = (0..=from)
            .rev()
            .find(|&i| self.text.is_char_boundary(i))
            .unwrap_or(0);
        if let Some(at) = self.find_stop(&text, from) {
            self.text = text[..at].to_string();
            self.released = self.released.min(at);
            self.stopped = true;
            return self.release(self.text.len());
        }
        self.text = text;
        let mut settled = self.text.len();
        if self.text.ends_with('\u{FFFD}') {
            settled -= '\u{FFFD}'.len_utf8();
        }
        // Hold back what could still be the start of a stop string.
        let hold = self.stops.iter().map(|s| s.len() - 1).max().unwrap_or(0);
        settled = settled.saturating_sub(hold).max(self.released);
        while !self.text.is_char_boundary(settled) {
            settled -= 1;
        }
        self.release(settled.max(self.released))
    }

    /// Whatever is still held back, at the end of the sequence.
    pub fn finish(&mut self) -> String {
        self.release(self.text.len())
    }

    /// All released text.
    pub fn text(&self) -> &str {
        &self.text[..self.released]
    }

    fn release(&mut self, upto: usize) -> String {
        if upto <= self.released || !self.text.is_char_boundary(self.released) {
            return String::new();
        }
        let piece = self.text[self.released..upto].to_string();
        self.released = upto;
        piece
    }

    fn find_stop(&self, text: &str, from: usize) -> Option<usize> {
        let from = from.min(text.len());
        let from = (0..=from)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        self.stops
            .iter()
            .filter_map(|s| text[from..].find(s.as_str()).map(|i| i + from))
            .min()
    }
}
