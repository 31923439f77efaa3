//! The one tokenizer type: a `tokenizers` pipeline plus the special-token facts around it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use kiln_formats::GgufFile;
use serde_json::Value as Json;

use crate::error::{Result, TextError};
use crate::gguf_vocab;
use crate::stream::StreamDecoder;

/// End-of-generation markers recognised by name when present in a vocabulary.
const EOG_NAMES: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|END_OF_TURN_TOKEN|>",
    "<｜end▁of▁sentence｜>",
    "<EOT>",
];

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<(u32, String)>,
    eos: Option<(u32, String)>,
    eog: BTreeSet<u32>,
    /// One past the largest id (the pipeline's own count rebuilds its vocabulary map).
    vocab_size: usize,
    chat_template: Option<String>,
    /// BOS/EOS added by `encode` itself (GGUF vocabularies); `tokenizer.json` files carry
    /// their own post-processor instead.
    add_bos: bool,
    add_eos: bool,
}

/// What a vocabulary source hands over besides the pipeline.
pub(crate) struct Specials {
    /// Number of ids (GGUF token count); 0 to take it from the pipeline.
    pub n_vocab: usize,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub extra_eog: Vec<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub chat_template: Option<String>,
}

impl Tokenizer {
    /// Load a Hugging Face `tokenizer.json` (a file, or a directory holding one), with the
    /// `tokenizer_config.json` (and `chat_template.jinja`) beside it when present.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = if path.is_dir() {
            path.join("tokenizer.json")
        } else {
            path.to_path_buf()
        };
        let dir = file.parent().unwrap_or(Path::new(".")).to_path_buf();
        let text = std::fs::read_to_string(&file).map_err(|source| TextError::Io {
            path: file.clone(),
            source,
        })?;
        let inner: tokenizers::Tokenizer =
            text.parse()
                .map_err(|e: tokenizers::Error| TextError::TokenizerFile {
                    path: file.clone(),
                    msg: one_line(&e.to_string()),
                })?;

        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = if cfg_path.is_file() {
            Some(read_config(&cfg_path)?)
        } else {
            None
        };
        let token_of = |key: &str| -> Option<(u32, String)> {
            let name = special_name(cfg.as_ref()?.get(key)?)?;
            Some((inner.token_to_id(&name)?, name))
        };
        let bos = token_of("bos_token");
        let eos = token_of("eos_token");
        let mut chat_template = match cfg.as_ref().and_then(|c| c.get("chat_template")) {
            Some(t) => pick_template(t).map_err(|()| TextError::Config {
                path: cfg_path.clone(),
                msg: "chat_template is neither a string nor a list of {name, template}".into(),
            })?,
            None => None,
        };
        let jinja = dir.join("chat_template.jinja");
        if chat_template.is_none() && jinja.is_file() {
            let t = std::fs::read_to_string(&jinja).map_err(|source| TextError::Io {
                path: jinja,
                source,
            })?;
            chat_template = Some(t);
        }
        Ok(Self::assemble(
            inner,
            Specials {
                n_vocab: 0,
                bos: bos.map(|b| b.0),
                eos: eos.map(|e| e.0),
                extra_eog: Vec::new(),
                add_bos: false,
                add_eos: false,
                chat_template,
            },
        ))
    }

    /// Build from a GGUF file's `tokenizer.ggml.*` vocabulary.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let (inner, specials) = gguf_vocab::build(gguf)?;
        Ok(Self::assemble(inner, specials))
    }

    pub(crate) fn assemble(inner: tokenizers::Tokenizer, s: Specials) -> Self {
        let named = |id: Option<u32>| id.and_then(|i| Some((i, inner.id_to_token(i)?)));
        let bos = named(s.bos);
        let eos = named(s.eos);
        let mut eog: BTreeSet<u32> = s.extra_eog.into_iter().collect();
        eog.extend(eos.as_ref().map(|e| e.0));
        eog.extend(EOG_NAMES.iter().filter_map(|n| inner.token_to_id(n)));
        let largest = inner.get_vocab(true).into_values().max();
        let vocab_size = s.n_vocab.max(largest.map_or(0, |m| m as usize + 1));
        Tokenizer {
            vocab_size,
            inner,
            bos,
            eos,
            eog,
            chat_template: s.chat_template,
            add_bos: s.add_bos,
            add_eos: s.add_eos,
        }
    }

    /// Text -> ids. Special tokens written in the text (`<|im_start|>`) become their ids;
    /// `add_special` adds BOS/EOS where the vocabulary asks for them.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, add_special)
            .map_err(TextError::tok)?;
        let mut ids = Vec::with_capacity(enc.len() + 2);
        if add_special && self.add_bos {
            ids.extend(self.bos_id());
        }
        ids.extend_from_slice(enc.get_ids());
        if add_special && self.add_eos {
            ids.extend(self.eos_id());
        }
        Ok(ids)
    }

    /// Ids -> text; `skip_special` drops control tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let n = self.vocab_size();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= n) {
            return Err(TextError::IdOutOfRange { id, vocab_size: n });
        }
        self.inner.decode(ids, skip_special).map_err(TextError::tok)
    }

    /// A decoder for ids arriving one at a time.
    pub fn stream(&self, skip_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special)
    }

    /// The vocabulary entry for `id` as stored (e.g. `Ġthe`, `▁the`, `<|im_end|>`).
    pub fn token_str(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos.as_ref().map(|b| b.0)
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos.as_ref().map(|e| e.0)
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos.as_ref().map(|b| b.1.as_str())
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos.as_ref().map(|e| e.1.as_str())
    }

    /// True for ids that end a generation: EOS and the turn/text end markers of the vocabulary.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// Adds an end-of-generation id (e.g. from a `generation_config.json`).
    pub fn add_eog(&mut self, id: u32) {
        self.eog.insert(id);
    }

    pub fn eog_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.eog.iter().copied()
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Whether the pipeline is byte-level BPE (GPT-2 style): its encoding of any text
    /// fragment is the one the model saw.
    pub fn is_byte_level(&self) -> bool {
        decoder_style(&self.inner) == DecoderStyle::ByteLevel
    }

    /// Every id's bytes as the decoder writes them (what a grammar matches against):
    /// byte-level BPE characters mapped back to their bytes, SentencePiece `▁` as a space
    /// and `<0xAB>` byte pieces as that byte. Special tokens are `0xFF` followed by their
    /// name (never matched by text); ids the pipeline does not know are empty.
    pub fn token_bytes(&self) -> Vec<Vec<u8>> {
        let style = decoder_style(&self.inner);
        let specials: std::collections::HashMap<u32, bool> = self
            .inner
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, t)| (id, t.special))
            .collect();
        let table = byte_level_table();
        (0..self.vocab_size as u32)
            .map(|id| {
                let Some(name) = self.inner.id_to_token(id) else {
                    return Vec::new();
                };
                match specials.get(&id) {
                    Some(true) => return [&[0xFF][..], name.as_bytes()].concat(),
                    Some(false) => return name.into_bytes(),
                    None => {}
                }
                if self.eog.contains(&id) || self.bos_id() == Some(id) {
                    return [&[0xFF][..], name.as_bytes()].concat();
                }
                match style {
                    DecoderStyle::ByteLevel => {
                        let bytes: Option<Vec<u8>> = name.chars().map(|c| table(c)).collect();
                        bytes.unwrap_or_default()
                    }
                    DecoderStyle::Pieces { byte_fallback } => {
                        if let Some(b) = byte_fallback.then(|| byte_piece(&name)).flatten() {
                            return vec![b];
                        }
                        name.replace('\u{2581}', " ").into_bytes()
                    }
                }
            })
            .collect()
    }

    /// The underlying pipeline.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

fn read_config(path: &PathBuf) -> Result<serde_json::Map<String, Json>> {
    let text = std::fs::read_to_string(path).map_err(|source| TextError::Io {
        path: path.clone(),
        source,
    })?;
    match serde_json::from_str(&text) {
        Ok(Json::Object(m)) => Ok(m),
        Ok(_) => Err(TextError::Config {
            path: path.clone(),
            msg: "top level is not an object".into(),
        }),
        Err(e) => Err(TextError::Config {
            path: path.clone(),
            msg: e.to_string(),
        }),
    }
}

/// `"<s>"` or `{"content": "<s>", ...}`; null means none.
fn special_name(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// A template string, or the `default` (else first) of a list of `{name, template}`.
/// `Err` for any other shape; `Ok(None)` for null.
fn pick_template(v: &Json) -> Result<Option<String>, ()> {
    match v {
        Json::Null => Ok(None),
        Json::String(s) => Ok(Some(s.clone())),
        Json::Array(list) => {
            let named = |want: Option<&str>| {
                list.iter().find_map(|e| {
                    let name = e.get("name")?.as_str()?;
                    let t = e.get("template")?.as_str()?;
                    (want.is_none() || want == Some(name)).then(|| t.to_string())
                })
            };
            named(Some("default"))
                .or_else(|| named(None))
                .map(Some)
                .ok_or(())
        }
        _ => Err(()),
    }
}

pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// How a pipeline's decoder turns vocabulary entries into text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DecoderStyle {
    /// GPT-2's byte-to-character table.
    ByteLevel,
    /// Entries are text, `▁` a space; `<0xAB>` entries are bytes when `byte_fallback`.
    Pieces { byte_fallback: bool },
}

fn decoder_style(tok: &tokenizers::Tokenizer) -> DecoderStyle {
    let json = tok
        .get_decoder()
        .and_then(|d| serde_json::to_value(d).ok())
        .unwrap_or(Json::Null);
    let kind = |v: &Json| {
        v.get("type")
            .and_then(Json::as_str)
            .unwrap_or("")
            .to_string()
    };
    let kinds: Vec<String> = match json.get("decoders").and_then(Json::as_array) {
        Some(list) => list.iter().map(kind).collect(),
        None => vec![kind(&json)],
    };
    if kinds.iter().any(|k| k == "ByteLevel") {
        DecoderStyle::ByteLevel
    } else {
        DecoderStyle::Pieces {
            byte_fallback: kinds.iter().any(|k| k == "ByteFallback"),
        }
    }
}

/// `<0xAB>` -> 0xAB.
fn byte_piece(name: &str) -> Option<u8> {
    let hex = name.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2)
        .then(|| u8::from_str_radix(hex, 16).ok())
        .flatten()
}

/// GPT-2's character for each byte (`byte_vocab`'s table), inverted.
fn byte_level_table() -> impl Fn(char) -> Option<u8> {
    let inv: std::collections::HashMap<char, u8> = crate::byte_vocab::byte_chars()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect();
    move |c: char| inv.get(&c).copied()
}
