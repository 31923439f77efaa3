//! GGUF `tokenizer.ggml.*` vocabularies rebuilt as `tokenizers` pipelines.
//!
//! - `gpt2`: byte-level BPE from `tokens` + `merges`; the pre-tokenizer is a sequence of
//!   regex splits chosen by `tokenizer.ggml.pre`, each re-splitting the previous pieces.
//! - `llama`: SentencePiece BPE from `tokens` + `scores`: a pair merges when the joined piece
//!   is in the vocabulary, highest score first; unknown characters fall back to `<0xXX>`.

use kiln_formats::{GgufFile, Value};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSeq;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace, Sequence as NormSeq};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSeq;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::error::{Result, TextError};
use crate::tokenizer::Specials;

// `tokenizer.ggml.token_type` values.
const TT_UNKNOWN: i64 = 2;
const TT_CONTROL: i64 = 3;
const TT_USER_DEFINED: i64 = 4;
const TT_UNUSED: i64 = 5;
const TT_BYTE: i64 = 6;

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Pre-tokenizer splits per `tokenizer.ggml.pre`, and whether whole words found in the
/// vocabulary skip the merges.
fn pre_splits(pre: &str) -> Option<(Vec<&'static str>, bool)> {
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" => (vec![LLAMA3], true),
        "qwen2" | "deepseek-r1-qwen" => (vec![QWEN2], false),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            (vec![r"\p{N}", GPT2], false)
        }
        "gpt-2" | "gpt2" | "phi-2" | "mpt" | "olmo" | "jais" | "trillion" => (vec![GPT2], false),
        "falcon" => (
            vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"],
            false,
        ),
        "default" => (
            vec![r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
            false,
        ),
        _ => return None,
    })
}

const SUPPORTED_PRE: &str = "default, gpt2, llama-bpe/llama3, qwen2, smollm/starcoder/refact/\
command-r, falcon";

/// Build the pipeline and special-token facts from a GGUF file.
pub(crate) fn build(g: &GgufFile) -> Result<(tokenizers::Tokenizer, Specials)> {
    let model = string(g, "tokenizer.ggml.model")?.ok_or(TextError::MissingKey {
        key: "tokenizer.ggml.model",
    })?;
    let tokens = strings(g, "tokenizer.ggml.tokens")?.ok_or(TextError::MissingKey {
        key: "tokenizer.ggml.tokens",
    })?;
    let n = tokens.len();
    let types = match numbers(g, "tokenizer.ggml.token_type")? {
        Some(t) if t.len() == n => t.iter().map(|&v| v as i64).collect(),
        Some(t) => {
            return Err(TextError::Vocab {
                msg: format!("{} token types for {n} tokens", t.len()),
            })
        }
        None => vec![1; n],
    };
    let id = |key: &'static str| -> Result<Option<u32>> {
        match uint(g, key)? {
            Some(v) if (v as usize) < n => Ok(Some(v as u32)),
            Some(v) => Err(TextError::Vocab {
                msg: format!("{key} = {v} but the vocabulary has {n} tokens"),
            }),
            None => Ok(None),
        }
    };
    let unk = id("tokenizer.ggml.unknown_token_id")?;
    let bos = id("tokenizer.ggml.bos_token_id")?;
    let eos = id("tokenizer.ggml.eos_token_id")?;
    let extra_eog: Vec<u32> = [
        id("tokenizer.ggml.eot_token_id")?,
        id("tokenizer.ggml.eom_token_id")?,
    ]
    .into_iter()
    .flatten()
    .collect();

    // Token string -> id; a repeated string keeps its first id.
    let mut vocab = Vocab::with_capacity(n);
    for (i, t) in tokens.iter().enumerate() {
        vocab.entry(t.clone()).or_insert(i as u32);
    }

    let (mut tok, add_bos_default) = match model.as_str() {
        "gpt2" => {
            let pre = string(g, "tokenizer.ggml.pre")?.unwrap_or_else(|| "default".into());
            (byte_level_bpe(g, vocab, &pre)?, false)
        }
        "llama" => {
            let prefix = boolean(g, "tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
            let scores = numbers(g, "tokenizer.ggml.scores")?;
            if scores.as_ref().is_some_and(|s| s.len() != n) {
                return Err(TextError::Vocab {
                    msg: format!("scores length differs from {n} tokens"),
                });
            }
            let unk_str = unk.map(|u| tokens[u as usize].clone());
            let merges = spm_merges(&tokens, &types, scores.as_deref(), &vocab);
            (sentencepiece(vocab, merges, unk_str, prefix)?, true)
        }
        other => {
            return Err(TextError::UnsupportedModel {
                model: other.to_string(),
            })
        }
    };

    // Control and unknown tokens are specials; user-defined ones are matched verbatim too.
    let mut specials = Vec::new();
    let mut added = Vec::new();
    for (t, &ty) in tokens.iter().zip(&types) {
        match ty {
            TT_CONTROL | TT_UNKNOWN => specials.push(AddedToken::from(t.clone(), true)),
            TT_USER_DEFINED => added.push(AddedToken::from(t.clone(), false).normalized(false)),
            _ => {}
        }
    }
    tok.add_special_tokens(&specials);
    tok.add_tokens(&added);

    let specials = Specials {
        n_vocab: n,
        bos,
        eos,
        extra_eog,
        add_bos: boolean(g, "tokenizer.ggml.add_bos_token")?.unwrap_or(add_bos_default)
            && bos.is_some(),
        add_eos: boolean(g, "tokenizer.ggml.add_eos_token")?.unwrap_or(false) && eos.is_some(),
        chat_template: string(g, "tokenizer.chat_template")?,
    };
    Ok((tok, specials))
}

fn byte_level_bpe(g: &GgufFile, vocab: Vocab, pre: &str) -> Result<tokenizers::Tokenizer> {
    let (splits, ignore_merges) = pre_splits(pre).ok_or_else(|| TextError::UnsupportedPre {
        pre: pre.to_string(),
        supported: SUPPORTED_PRE.to_string(),
    })?;
    let merges = strings(g, "tokenizer.ggml.merges")?
        .ok_or(TextError::MissingKey {
            key: "tokenizer.ggml.merges",
        })?
        .into_iter()
        .enumerate()
        .map(|(i, m)| match m.split_once(' ') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_string(), b.to_string())),
            _ => Err(TextError::Vocab {
                msg: format!("merge {i} {m:?} is not two pieces separated by a space"),
            }),
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| TextError::Vocab { msg: e.to_string() })?;

    let mut pres = Vec::new();
    for re in splits {
        let split = Split::new(
            SplitPattern::Regex(re.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TextError::Vocab {
            msg: format!("pre-tokenizer regex {re:?}: {e}"),
        })?;
        pres.push(PreTokenizerWrapper::Split(split));
    }
    pres.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
        false, false, false,
    )));
    let mut tok = tokenizers::Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(PreSeq::new(pres)));
    tok.with_decoder(Some(ByteLevel::new(false, false, false)));
    Ok(tok)
}

fn sentencepiece(
    vocab: Vocab,
    merges: Vec<(String, String)>,
    unk: Option<String>,
    add_space_prefix: bool,
) -> Result<tokenizers::Tokenizer> {
    let mut b = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(u) = unk {
        b = b.unk_token(u);
    }
    let bpe = b
        .build()
        .map_err(|e| TextError::Vocab { msg: e.to_string() })?;
    let replace = |from: &str, to: &str| {
        Replace::new(from, to).map_err(|e| TextError::Vocab { msg: e.to_string() })
    };

    let mut norms = Vec::new();
    if add_space_prefix {
        norms.push(NormalizerWrapper::Prepend(Prepend::new("▁".into())));
    }
    norms.push(NormalizerWrapper::Replace(replace(" ", "▁")?));
    let mut decs = vec![
        DecoderWrapper::Replace(replace("▁", " ")?),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if add_space_prefix {
        decs.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    let mut tok = tokenizers::Tokenizer::new(bpe);
    tok.with_normalizer(Some(NormSeq::new(norms)));
    tok.with_decoder(Some(DecoderSeq::new(decs)));
    Ok(tok)
}

/// SentencePiece merges: every split of a piece into two vocabulary pieces, ranked by the
/// joined piece's score (highest first, ties by id).
fn spm_merges(
    tokens: &[String],
    types: &[i64],
    scores: Option<&[f64]>,
    vocab: &Vocab,
) -> Vec<(String, String)> {
    let mut cands: Vec<(f64, u32, u32, u32)> = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        if matches!(types[i], TT_CONTROL | TT_UNKNOWN | TT_BYTE | TT_UNUSED) {
            continue;
        }
        let score = scores.map_or(-(i as f64), |s| s[i]);
        for (k, _) in t.char_indices().skip(1) {
            if let (Some(&l), Some(&r)) = (vocab.get(&t[..k]), vocab.get(&t[k..])) {
                cands.push((score, i as u32, l, r));
            }
        }
    }
    cands.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    cands
        .into_iter()
        .map(|(_, _, l, r)| (tokens[l as usize].clone(), tokens[r as usize].clone()))
        .collect()
}

fn found(v: &Value) -> String {
    v.type_name().to_string()
}

fn string(g: &GgufFile, key: &'static str) -> Result<Option<String>> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .map(|s| Some(s.to_string()))
            .ok_or(TextError::BadKey {
                key,
                found: found(v),
                expected: "string",
            }),
    }
}

fn uint(g: &GgufFile, key: &'static str) -> Result<Option<u64>> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or(TextError::BadKey {
            key,
            found: found(v),
            expected: "unsigned integer",
        }),
    }
}

fn boolean(g: &GgufFile, key: &'static str) -> Result<Option<bool>> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or(TextError::BadKey {
            key,
            found: found(v),
            expected: "bool",
        }),
    }
}

fn array<'a>(g: &'a GgufFile, key: &'static str) -> Result<Option<&'a [Value]>> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => v.as_array().map(Some).ok_or(TextError::BadKey {
            key,
            found: found(v),
            expected: "array",
        }),
    }
}

fn strings(g: &GgufFile, key: &'static str) -> Result<Option<Vec<String>>> {
    let Some(a) = array(g, key)? else {
        return Ok(None);
    };
    a.iter()
        .map(|v| {
            v.as_str().map(str::to_string).ok_or(TextError::BadKey {
                key,
                found: format!("array of {}", found(v)),
                expected: "array of strings",
            })
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn numbers(g: &GgufFile, key: &'static str) -> Result<Option<Vec<f64>>> {
    let Some(a) = array(g, key)? else {
        return Ok(None);
    };
    a.iter()
        .map(|v| {
            v.as_f64().ok_or(TextError::BadKey {
                key,
                found: format!("array of {}", found(v)),
                expected: "array of numbers",
            })
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}
