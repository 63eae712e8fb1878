//! Generated tokens to text, a piece at a time, with stop strings.
//!
//! A token can end inside a UTF-8 character or change how the previous
//! tokens decode (byte-level BPE, SentencePiece's leading spaces), so each
//! new token is decoded in a short window with the tokens before it, and
//! its text is taken only once it is settled (no trailing replacement
//! character): the window restarts after each settled piece, so a token
//! costs a decode of a few ids, not of the whole sequence. Of the text,
//! the last few characters that could still start a stop string are held
//! back.

use lazyfuse_models::Tokenizer;

/// One choice's text as it grows.
pub struct TextStream {
    ids: Vec<u32>,
    /// The decode window: `ids[prefix..read]` is context whose text is
    /// already in `text`; `ids[read..]` is not yet settled.
    prefix: usize,
    read: usize,
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
            prefix: 0,
            read: 0,
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
        let before = tok
            .decode(&self.ids[self.prefix..self.read])
            .unwrap_or_default();
        let now = tok.decode(&self.ids[self.prefix..]).unwrap_or_default();
        if now.len() > before.len()
            && now.is_char_boundary(before.len())
            && !now.ends_with('\u{FFFD}')
        {
            self.text.push_str(&now[before.len()..]);
            self.prefix = self.read;
            self.read = self.ids.len();
        }
        // A stop string may span the released text's last characters.
        let from = self.released.saturating_sub(8);
        if let Some(at) = self.find_stop(&self.text, from) {
            self.text.truncate(at);
            self.released = self.released.min(at);
            self.stopped = true;
            return self.release(self.text.len());
        }
        let mut settled = self.text.len();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/hf/llama_gqa");
        Tokenizer::from_dir(&dir).unwrap().unwrap()
    }

    #[test]
    fn pieces_add_up_to_the_whole_decode() {
        let tok = tokenizer();
        let mut x = 7u64;
        let ids: Vec<u32> = (0..300)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                3 + (x >> 33) as u32 % 120
            })
            .collect();
        let mut s = TextStream::new(vec![]);
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&s.push(&tok, id));
        }
        out.push_str(&s.finish());
        assert_eq!(out, tok.decode(&ids).unwrap());
        assert_eq!(s.text(), out);
    }

    #[test]
    fn a_stop_string_across_tokens_ends_the_text_before_it() {
        let tok = tokenizer();
        let ids = tok.encode("the quick brown fox jumps over").unwrap();
        let mut s = TextStream::new(vec!["wn fo".into()]);
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&s.push(&tok, id));
        }
        out.push_str(&s.finish());
        assert!(s.stopped());
        assert_eq!(out, "the quick bro");
    }
}
