//! A tiktoken-style vocabulary (each token's raw bytes, ids in merge-rank order, as
//! whisper.cpp's ggml files carry it) rebuilt as a byte-level BPE `tokenizers` pipeline.
//!
//! tiktoken merges the adjacent pair whose joined bytes have the lowest rank; the pair a
//! token is made of is found by running that same procedure on the token's bytes with only
//! lower ranks allowed (it must end in exactly two pieces), which gives the GPT-2 merge list.

use std::collections::HashMap;

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

use crate::error::{Result, TextError};
use crate::tokenizer::{Specials, Tokenizer};

/// GPT-2's printable stand-in for every byte (the `bytes_to_unicode` table).
pub(crate) fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let mut n = 0;
    for b in 0..256u32 {
        out[b as usize] = if printable(b) {
            char::from_u32(b).unwrap_or('\0')
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('\0')
        };
    }
    out
}

/// Token bytes to rank (= id), hashed fast: building the merge list looks up every adjacent
/// pair of every token's pieces.
type Ranks<'a> = HashMap<&'a [u8], u32, foldhash::fast::FixedState>;

/// Where BPE splits `token` when only merges ranked below `max_rank` may apply and exactly
/// two pieces are left (None for any other count): the adjacent pair of lowest rank (the
/// leftmost of equals) joins first. Each pair's rank is looked up once, and again only where
/// a merge changed one of its pieces; `bounds` and `pair` are scratch kept between calls.
fn bpe_split(
    ranks: &Ranks,
    token: &[u8],
    max_rank: u32,
    bounds: &mut Vec<usize>,
    pair: &mut Vec<u32>,
) -> Option<usize> {
    let rank = |a: usize, b: usize| {
        ranks
            .get(&token[a..b])
            .copied()
            .filter(|&r| r < max_rank)
            .unwrap_or(u32::MAX)
    };
    // Piece k is token[bounds[k]..bounds[k + 1]]; pair[k] the rank of pieces k and k + 1 joined.
    bounds.clear();
    bounds.extend(0..=token.len());
    pair.clear();
    pair.extend((0..token.len().saturating_sub(1)).map(|k| rank(k, k + 2)));
    loop {
        let mut best = (u32::MAX, 0);
        for (k, &r) in pair.iter().enumerate() {
            if r < best.0 {
                best = (r, k);
            }
        }
        let (r, i) = best;
        if r == u32::MAX {
            break;
        }
        bounds.remove(i + 1);
        pair.remove(i);
        if i > 0 {
            pair[i - 1] = rank(bounds[i - 1], bounds[i + 1]);
        }
        if i < pair.len() {
            pair[i] = rank(bounds[i], bounds[i + 2]);
        }
    }
    (bounds.len() == 3).then(|| bounds[1])
}

impl Tokenizer {
    /// Builds a byte-level BPE tokenizer from tokens' raw bytes (id = index = merge rank)
    /// and special tokens placed at their ids (`(id, "<|endoftext|>")`, ...), which must be
    /// at or past the end of `tokens`.
    pub fn from_byte_vocab(tokens: &[&[u8]], specials: &[(u32, String)]) -> Result<Self> {
        let bad = |msg: String| TextError::Tokenizer(format!("byte vocabulary: {msg}"));
        let chars = byte_chars();
        let show = |b: &[u8]| b.iter().map(|&c| chars[c as usize]).collect::<String>();
        let mut ranks = Ranks::with_capacity_and_hasher(tokens.len(), Default::default());
        for (i, t) in tokens.iter().enumerate() {
            if t.is_empty() {
                return Err(bad(format!("token {i} is empty")));
            }
            ranks.entry(t).or_insert(i as u32);
        }
        for b in 0..=255u8 {
            if !ranks.contains_key(&[b][..]) {
                return Err(bad(format!("no token for the single byte 0x{b:02x}")));
            }
        }
        let mut vocab = Vocab::with_capacity(tokens.len() + specials.len());
        let mut merges = Vec::with_capacity(tokens.len());
        let (mut bounds, mut pair) = (Vec::new(), Vec::new());
        for (i, t) in tokens.iter().enumerate() {
            if ranks.get(t) != Some(&(i as u32)) {
                continue; // a repeated token keeps its first id
            }
            vocab.insert(show(t), i as u32);
            if t.len() > 1 {
                if let Some(k) = bpe_split(&ranks, t, i as u32, &mut bounds, &mut pair) {
                    merges.push((show(&t[..k]), show(&t[k..])));
                }
            }
        }
        for (id, name) in specials {
            if (*id as usize) < tokens.len() {
                return Err(bad(format!(
                    "special token {name} at id {id} is inside the {} text tokens",
                    tokens.len()
                )));
            }
            vocab.insert(name.clone(), *id);
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| bad(e.to_string()))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        inner.with_decoder(Some(ByteLevel::new(false, true, true)));
        let added: Vec<AddedToken> = specials
            .iter()
            .map(|(_, n)| AddedToken::from(n.clone(), true))
            .collect();
        inner.add_special_tokens(&added);
        let n_vocab = specials
            .iter()
            .map(|s| s.0 as usize + 1)
            .max()
            .unwrap_or(0)
            .max(tokens.len());
        Ok(Tokenizer::assemble(
            inner,
            Specials {
                n_vocab,
                bos: None,
                eos: None,
                extra_eog: Vec::new(),
                add_bos: false,
                add_eos: false,
                chat_template: None,
            },
        ))
    }
}
