//! Incremental detokenization that never emits half a UTF-8 character.
//!
//! Ids are decoded together with the ids of the previous emitted chunk as context (decoders
//! such as SentencePiece's leading-space strip depend on what came before). A chunk is
//! emitted once its decoding no longer ends in U+FFFD, i.e. once every byte token of the last
//! character has arrived.

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// Longest run of pending ids held back waiting for a character to complete; a UTF-8
/// character spans at most 4 byte tokens, so a longer run really is invalid and is emitted
/// with replacement characters.
const MAX_PENDING: usize = 8;

const REPLACEMENT: char = '\u{FFFD}';

pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    skip_special: bool,
    /// `ids[..ctx]` were already emitted (context), `ids[ctx..]` are pending.
    ids: Vec<u32>,
    ctx: usize,
    /// Decoding of `ids[..ctx]`.
    ctx_text: String,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tok: &'a Tokenizer, skip_special: bool) -> Self {
        StreamDecoder {
            tok,
            skip_special,
            ids: Vec::new(),
            ctx: 0,
            ctx_text: String::new(),
        }
    }

    /// Add one id; returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.tok.decode(&self.ids, self.skip_special)?;
        let pending = self.ids.len() - self.ctx;
        if text.ends_with(REPLACEMENT) && pending < MAX_PENDING {
            return Ok(String::new());
        }
        Ok(self.emit(text))
    }

    /// Emit whatever is still pending (an incomplete character becomes U+FFFD).
    pub fn flush(&mut self) -> Result<String> {
        if self.ids.len() == self.ctx {
            return Ok(String::new());
        }
        let text = self.tok.decode(&self.ids, self.skip_special)?;
        Ok(self.emit(text))
    }

    /// The part of `text` (decoding of all held ids) past the context, then make the
    /// pending ids the new context.
    fn emit(&mut self, text: String) -> String {
        let start = common_prefix(&self.ctx_text, &text);
        let out = text[start..].to_string();
        self.ids.drain(..self.ctx);
        self.ctx = self.ids.len();
        // Re-decode the new context alone: its text can differ from its slice of `text`.
        self.ctx_text = self
            .tok
            .decode(&self.ids, self.skip_special)
            .unwrap_or_default();
        out
    }
}

/// Byte length of the longest common prefix of `a` and `b`, on a char boundary of `b`.
fn common_prefix(a: &str, b: &str) -> usize {
    let mut n = 0;
    for ((i, ca), cb) in a.char_indices().zip(b.chars()) {
        if ca != cb {
            return i;
        }
        n = i + ca.len_utf8();
    }
    n
}
