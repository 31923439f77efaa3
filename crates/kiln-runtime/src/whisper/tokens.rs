//! Whisper's special tokens, found in the vocabulary by name, and the tokens it never
//! samples (non-speech symbols and control tokens).

use kiln_formats::WhisperGgmlFile;
use kiln_models::whisper::HfWhisper;
use kiln_text::Tokenizer;

use super::WhisperError;

/// Whisper's language codes in token order (large-v3 added `yue`, the 100th).
pub const LANGUAGES: [&str; 100] = [
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it",
    "id", "hi", "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur",
    "hr", "bg", "lt", "la", "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn",
    "et", "mk", "br", "eu", "is", "hy", "ne", "mn", "bs", "kk", "sq", "sw", "gl", "mr", "pa", "si",
    "km", "sn", "yo", "so", "af", "oc", "ka", "be", "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo",
    "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl", "mg", "as", "tt", "haw", "ln",
    "ha", "ba", "jw", "su", "yue",
];

/// The tokenizer of a whisper.cpp file: its text tokens' bytes (ids in rank order, as
/// tiktoken writes them) and the special tokens where whisper.cpp places them for a model
/// of `n_vocab` ids: `<|endoftext|>` right after the text tokens (50256 English-only, 50257
/// multilingual), then `<|startoftranscript|>`, one token per language, the task tokens,
/// `<|startoflm|>`, `<|startofprev|>`, `<|nospeech|>`, `<|notimestamps|>`, timestamps.
pub fn ggml_tokenizer(f: &WhisperGgmlFile, n_vocab: usize) -> Result<Tokenizer, WhisperError> {
    let bad = |what: String| WhisperError::Vocabulary(format!("{}: {what}", f.path().display()));
    let multilingual = n_vocab >= 51865;
    let eot = 50256 + multilingual as usize;
    let n_langs = n_vocab
        .checked_sub(51765 + multilingual as usize)
        .filter(|&n| n <= LANGUAGES.len())
        .ok_or_else(|| {
            bad(format!(
                "n_vocab {n_vocab} is not a Whisper vocabulary (51864 English-only, 51865..51866 multilingual)"
            ))
        })?;
    if f.tokens.len() < eot {
        return Err(bad(format!(
            "{} text tokens, a Whisper vocabulary has {eot}",
            f.tokens.len()
        )));
    }
    // Files converted from Hugging Face list the special tokens too: they are re-made here.
    let tokens: Vec<&[u8]> = (0..eot).filter_map(|i| f.token(i)).collect();
    let mut specials: Vec<String> = vec!["<|endoftext|>".into(), "<|startoftranscript|>".into()];
    specials.extend(LANGUAGES[..n_langs].iter().map(|l| format!("<|{l}|>")));
    for s in [
        "<|translate|>",
        "<|transcribe|>",
        "<|startoflm|>",
        "<|startofprev|>",
        "<|nospeech|>",
        "<|notimestamps|>",
    ] {
        specials.push(s.into());
    }
    let specials: Vec<(u32, String)> = specials
        .into_iter()
        .enumerate()
        .map(|(i, s)| ((eot + i) as u32, s))
        .collect();
    Ok(Tokenizer::from_byte_vocab(&tokens, &specials)?)
}

/// Seconds per timestamp token step.
pub const TIME_PRECISION: f64 = 0.02;

#[derive(Debug, Clone)]
pub struct SpecialTokens {
    pub eot: u32,
    pub sot: u32,
    pub translate: u32,
    pub transcribe: u32,
    pub sot_lm: u32,
    pub sot_prev: u32,
    pub no_speech: u32,
    pub no_timestamps: u32,
    /// `<|0.00|>`: timestamp tokens run from here to the end of the model's vocabulary.
    pub timestamp_begin: u32,
    /// Language tokens `<|en|>`, `<|zh|>`, ... with their codes, in vocabulary order.
    pub languages: Vec<(String, u32)>,
    /// Whether the model was trained on many languages (else English-only, `.en`).
    pub multilingual: bool,
}

impl SpecialTokens {
    /// From the tokenizer's vocabulary; `n_vocab` is the model's (timestamps included).
    pub fn from_tokenizer(tok: &Tokenizer, n_vocab: usize) -> Result<Self, WhisperError> {
        let id = |names: &[&str]| -> Result<u32, WhisperError> {
            names
                .iter()
                .find_map(|n| tok.token_id(n))
                .ok_or_else(|| WhisperError::Vocabulary(format!("no {} token", names[0])))
        };
        let eot = id(&["<|endoftext|>"])?;
        let sot = id(&["<|startoftranscript|>"])?;
        let translate = id(&["<|translate|>"])?;
        let transcribe = id(&["<|transcribe|>"])?;
        let no_timestamps = id(&["<|notimestamps|>"])?;
        let timestamp_begin = no_timestamps + 1;
        if timestamp_begin as usize + 1500 > n_vocab {
            return Err(WhisperError::Vocabulary(format!(
                "the model's {n_vocab} tokens leave no room for 1501 timestamp tokens after id {timestamp_begin}"
            )));
        }
        let languages = (sot + 1..translate)
            .filter_map(|i| {
                let s = tok.token_str(i)?;
                let code = s.strip_prefix("<|")?.strip_suffix("|>")?.to_string();
                Some((code, i))
            })
            .collect::<Vec<_>>();
        Ok(SpecialTokens {
            eot,
            sot,
            translate,
            transcribe,
            sot_lm: id(&["<|startoflm|>"])?,
            sot_prev: id(&["<|startofprev|>"])?,
            no_speech: id(&["<|nospeech|>", "<|nocaptions|>"])?,
            no_timestamps,
            timestamp_begin,
            // Whisper's own rule: English-only vocabularies have 51864 ids, multilingual ones
            // 51865 (51866 from large-v3 on). Counting from the timestamps instead misreads
            // multilingual files, whose 1501 timestamps end exactly at 51865.
            multilingual: n_vocab >= 51865,
            languages,
        })
    }

    /// Checks the special ids a Hugging Face `generation_config.json` (else `config.json`)
    /// names against the tokenizer's: start, end and no-timestamps tokens must agree.
    pub fn check_hf(&self, h: &HfWhisper) -> Result<(), WhisperError> {
        let key = |k: &str| -> Option<(u64, &'static str)> {
            if let Some(v) = h
                .generation
                .as_ref()
                .and_then(|g| g.get(k))
                .and_then(|v| v.as_u64())
            {
                return Some((v, "generation_config.json"));
            }
            h.config
                .get(k)
                .and_then(|v| v.as_u64())
                .map(|v| (v, "config.json"))
        };
        for (k, want) in [
            ("decoder_start_token_id", self.sot),
            ("eos_token_id", self.eot),
            ("no_timestamps_token_id", self.no_timestamps),
        ] {
            if let Some((v, file)) = key(k) {
                if v != want as u64 {
                    return Err(WhisperError::Path {
                        path: h.dir.join(file),
                        what: format!("{k} is {v} but the tokenizer has {want}"),
                    });
                }
            }
        }
        Ok(())
    }

    /// The language token of `code`; Hebrew answers to OpenAI's `he` and to the `iw` that
    /// Hugging Face vocabularies name it.
    pub fn language(&self, code: &str) -> Option<u32> {
        let alias = match code {
            "he" => "iw",
            "iw" => "he",
            c => c,
        };
        self.languages
            .iter()
            .find(|(c, _)| c == code || c == alias)
            .map(|&(_, id)| id)
    }

    pub fn is_timestamp(&self, t: u32) -> bool {
        t >= self.timestamp_begin
    }

    /// Seconds of a timestamp token from its window's start.
    pub fn time_of(&self, t: u32) -> f64 {
        (t - self.timestamp_begin) as f64 * TIME_PRECISION
    }
}

/// Tokens Whisper never samples: symbols that are not speech (so that it does not write
/// speaker tags or music notes), and the control tokens. Found by encoding each symbol alone
/// and after a space, keeping it where it is one token.
pub fn suppressed_tokens(tok: &Tokenizer, sp: &SpecialTokens) -> Vec<u32> {
    let mut symbols: Vec<String> = "\"#()*+/:;<=>@[\\]^_`{|}~「」『』"
        .chars()
        .map(String::from)
        .collect();
    symbols.extend(
        "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪"
            .split(' ')
            .map(String::from),
    );
    let misc = "♩♪♫♬♭♮♯";
    symbols.extend(misc.chars().map(String::from));
    let mut out = Vec::new();
    let enc = |s: &str| tok.encode(s, false).unwrap_or_default();
    // A dash or quote after a space at the start of a word is kept out too.
    for s in [" -", " '"] {
        if let Some(&t) = enc(s).first() {
            out.push(t);
        }
    }
    for s in &symbols {
        for text in [s.clone(), format!(" {s}")] {
            let ids = enc(&text);
            let is_misc = s.chars().count() == 1 && misc.contains(s.as_str());
            if ids.len() == 1 || (is_misc && !ids.is_empty()) {
                out.push(ids[0]);
            }
        }
    }
    out.extend([
        sp.translate,
        sp.transcribe,
        sp.sot,
        sp.sot_prev,
        sp.sot_lm,
        sp.no_speech,
    ]);
    out.sort_unstable();
    out.dedup();
    out
}
