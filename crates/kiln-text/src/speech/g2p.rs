//! English grapheme-to-phoneme conversion into Kokoro's phoneme set.
//!
//! Words are looked up in misaki's lexicons (`us_gold.json`, then `us_silver.json`; a
//! part-of-speech entry takes its `DEFAULT`), with the common inflections (-s, -'s, -ed, -ing)
//! derived from their stems; accented letters are also tried without their accents, numbers
//! are read as words and initialisms (all capitals, not in the lexicons) letter by letter.
//! Other words go to the `espeak-ng` program where it is installed (run as a subprocess,
//! never linked), whose IPA phonemes are mapped onto Kokoro's, else to the neural
//! letter-to-sound model ([`super::NeuralG2p`]) kept beside the lexicons. Punctuation Kokoro
//! knows is kept.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum G2pError {
    #[error("{}: {what}", path.display())]
    Lexicon { path: PathBuf, what: String },
    #[error("no pronunciation for '{word}': it is in no lexicon and espeak-ng failed ({why}); install espeak-ng or pass --phonemes")]
    Espeak { word: String, why: String },
}

/// The neural letter-to-sound model's file, beside the lexicons.
pub const NEURAL_G2P_FILE: &str = "g2p_en_checkpoint20.npz";

pub struct G2p {
    lexicon: HashMap<String, String>,
    espeak: Option<PathBuf>,
    neural: Option<super::NeuralG2p>,
    english: English,
}

/// Which English: misaki's American or British lexicons, and espeak-ng's voice to match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum English {
    American,
    British,
}

impl English {
    /// The lexicon files, silver first (gold wins).
    fn lexicons(self) -> [&'static str; 2] {
        match self {
            English::American => ["us_silver.json", "us_gold.json"],
            English::British => ["gb_silver.json", "gb_gold.json"],
        }
    }

    fn espeak_voice(self) -> &'static str {
        match self {
            English::American => "en-us",
            English::British => "en-gb",
        }
    }
}

/// Kokoro's punctuation, kept as is.
const PUNCT: &str = ";:,.!?—…\"()“”";

fn vowel_start(p: &str) -> bool {
    p.trim_start_matches(['ˈ', 'ˌ'])
        .chars()
        .next()
        .is_some_and(|c| "AIOWYaeiouæɑɒɔəɛɜɪʊʌᵊ".contains(c))
}

impl G2p {
    /// Loads the American lexicons of `dir` (us_gold.json, us_silver.json; gold wins) and
    /// the neural model beside them ([`NEURAL_G2P_FILE`]) where it is.
    pub fn load(dir: &Path) -> Result<G2p, G2pError> {
        Self::load_english(dir, English::American)
    }

    /// [`G2p::load`] for either English (British: gb_gold.json, gb_silver.json, espeak-ng's
    /// en-gb voice; the neural model, trained on American pronunciations, stays the last
    /// resort for both).
    pub fn load_english(dir: &Path, english: English) -> Result<G2p, G2pError> {
        let mut lexicon = HashMap::new();
        for name in english.lexicons() {
            let path = dir.join(name);
            let err = |what: String| G2pError::Lexicon {
                path: path.clone(),
                what,
            };
            let text = std::fs::read_to_string(&path).map_err(|e| err(e.to_string()))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| err(format!("not JSON: {e}")))?;
            let map = v
                .as_object()
                .ok_or_else(|| err("not a JSON object".into()))?;
            for (word, p) in map {
                let p = match p {
                    serde_json::Value::String(s) => Some(s.clone()),
                    serde_json::Value::Object(o) => {
                        o.get("DEFAULT").and_then(|d| d.as_str()).map(String::from)
                    }
                    _ => None,
                };
                if let Some(p) = p {
                    lexicon.insert(word.clone(), p);
                }
            }
        }
        let neural = dir.join(NEURAL_G2P_FILE);
        let neural = match neural.is_file() {
            true => Some(super::NeuralG2p::load(&neural)?),
            false => None,
        };
        Ok(G2p {
            lexicon,
            espeak: find_espeak(),
            neural,
            english,
        })
    }

    /// Words out of the lexicons go to `neural` where espeak-ng is not installed.
    pub fn with_neural(mut self, neural: super::NeuralG2p) -> Self {
        self.neural = Some(neural);
        self
    }

    /// Whether out-of-lexicon words go to espeak-ng (installed) rather than the neural model.
    pub fn uses_espeak(&self) -> bool {
        self.espeak.is_some()
    }

    /// Leaves espeak-ng out even where it is installed (tests of the neural fallback).
    pub fn without_espeak(mut self) -> Self {
        self.espeak = None;
        self
    }

    /// A G2P over a given word list (tests), with or without espeak-ng.
    pub fn from_entries(entries: &[(&str, &str)], espeak: bool) -> G2p {
        G2p {
            lexicon: entries
                .iter()
                .map(|(w, p)| (w.to_string(), p.to_string()))
                .collect(),
            espeak: if espeak { find_espeak() } else { None },
            neural: None,
            english: English::American,
        }
    }

    fn lookup(&self, w: &str) -> Option<String> {
        let lower = w.to_lowercase();
        let mut cap = lower.clone();
        if let Some(f) = cap.get_mut(0..1) {
            f.make_ascii_uppercase();
        }
        for cand in [w, lower.as_str(), cap.as_str()] {
            if let Some(p) = self.lexicon.get(cand) {
                return Some(p.clone());
            }
        }
        None
    }

    /// The word's phonemes from the lexicons: directly, through an inflection of its stem,
    /// without its accents, as a number, or (all capitals) letter by letter.
    fn lexicon_word(&self, w: &str) -> Option<String> {
        if let Some(p) = self.lexicon_stem(w) {
            return Some(p);
        }
        let plain = fold_accents(w);
        if plain != w {
            if let Some(p) = self.lexicon_stem(&plain) {
                return Some(p);
            }
        }
        if w.bytes().all(|b| b.is_ascii_digit()) {
            let words = super::number(w)?;
            let p: Option<Vec<String>> = words
                .split([' ', '-'])
                .map(|x| self.lexicon_stem(x))
                .collect();
            return p.map(|p| p.join(" "));
        }
        let letters = w.chars().count();
        if (2..=6).contains(&letters) && w.chars().all(|c| c.is_ascii_uppercase()) {
            // An initialism: its letters, the stress on the last.
            let mut out = String::new();
            for (i, c) in w.chars().enumerate() {
                let p = self.lookup(&c.to_string())?;
                let p = if i + 1 < letters {
                    p.replace('ˈ', "ˌ")
                } else {
                    p
                };
                out.push_str(&p);
            }
            return Some(out);
        }
        None
    }

    /// The word's phonemes from the lexicons, directly or through an inflection of its stem.
    fn lexicon_stem(&self, w: &str) -> Option<String> {
        if let Some(p) = self.lookup(w) {
            return Some(p);
        }
        let lower = w.to_lowercase();
        let voiceless = |p: &str| p.ends_with(['p', 't', 'k', 'f', 'θ']);
        let sibilant = |p: &str| p.ends_with(['s', 'z', 'ʃ', 'ʒ', 'ʧ', 'ʤ']);
        for suf in ["'s", "s", "es"] {
            if let Some(stem) = lower.strip_suffix(suf).filter(|s| s.len() > 1) {
                if let Some(p) = self.lookup(stem) {
                    let end = if sibilant(&p) {
                        "ɪz"
                    } else if voiceless(&p) {
                        "s"
                    } else {
                        "z"
                    };
                    return Some(p + end);
                }
            }
        }
        for stem in [lower.strip_suffix("ed"), lower.strip_suffix('d')]
            .into_iter()
            .flatten()
        {
            if stem.len() > 1 {
                if let Some(p) = self.lookup(stem) {
                    let end = if p.ends_with(['t', 'd']) {
                        "ɪd"
                    } else if voiceless(&p) || sibilant(&p) && !p.ends_with(['z', 'ʒ', 'ʤ']) {
                        "t"
                    } else {
                        "d"
                    };
                    return Some(p + end);
                }
            }
        }
        if let Some(stem) = lower.strip_suffix("ing").filter(|s| s.len() > 1) {
            for s in [stem.to_string(), format!("{stem}e")] {
                if let Some(p) = self.lookup(&s) {
                    return Some(p + "ɪŋ");
                }
            }
        }
        None
    }

    /// Phonemes of one sentence of normalised text.
    pub fn phonemize(&self, text: &str) -> Result<String, G2pError> {
        // Words (letters, apostrophes, inner hyphens) and punctuation, in order.
        enum Tok {
            Word(String),
            Punct(char),
        }
        let mut toks = Vec::new();
        let mut cur = String::new();
        for c in text.chars() {
            if c.is_alphanumeric() || c == '\'' || c == '’' {
                cur.push(if c == '’' { '\'' } else { c });
                continue;
            }
            if !cur.is_empty() {
                toks.push(Tok::Word(std::mem::take(&mut cur)));
            }
            if PUNCT.contains(c) {
                toks.push(Tok::Punct(c));
            } else if c == '-' {
                // word-word: two words
            } else if c == '!' || c == '?' {
                toks.push(Tok::Punct(c));
            }
        }
        if !cur.is_empty() {
            toks.push(Tok::Word(cur));
        }
        // Unknown words go to espeak-ng together.
        let unknown: Vec<String> = toks
            .iter()
            .filter_map(|t| match t {
                Tok::Word(w)
                    if !w.eq_ignore_ascii_case("the") && self.lexicon_word(w).is_none() =>
                {
                    Some(w.clone())
                }
                _ => None,
            })
            .collect();
        let spoken = match (&self.neural, &self.espeak) {
            _ if unknown.is_empty() => Vec::new(),
            (Some(n), None) => unknown
                .iter()
                .map(|w| match n.phonemes(&fold_accents(w)) {
                    p if p.is_empty() => Err(G2pError::Espeak {
                        word: w.clone(),
                        why: "espeak-ng not found on PATH, and the letter-to-sound model \
                              reads Latin letters only"
                            .into(),
                    }),
                    p => Ok(p),
                })
                .collect::<Result<_, _>>()?,
            _ => self.espeak_words(&unknown)?,
        };
        let mut spoken = spoken.into_iter();
        let mut out = String::new();
        let mut prev_word = false;
        for (i, t) in toks.iter().enumerate() {
            match t {
                Tok::Word(w) => {
                    let p = match self.lexicon_word(w) {
                        Some(p) => p,
                        None if w.eq_ignore_ascii_case("the") => String::new(),
                        None => spoken.next().unwrap_or_default(),
                    };
                    // "the" before a vowel: ði.
                    let p = if w.eq_ignore_ascii_case("the") {
                        let next_vowel = toks.get(i + 1).is_some_and(|n| match n {
                            Tok::Word(nw) => {
                                self.lexicon_word(nw).is_some_and(|np| vowel_start(&np))
                            }
                            _ => false,
                        });
                        if next_vowel {
                            "ði".to_string()
                        } else {
                            "ðə".to_string()
                        }
                    } else {
                        p
                    };
                    if prev_word || (!out.is_empty() && !out.ends_with(' ')) {
                        out.push(' ');
                    }
                    out.push_str(&p);
                    prev_word = true;
                }
                Tok::Punct(c) => {
                    if matches!(c, '(' | '“') || (*c == '"' && !prev_word) {
                        if !out.is_empty() {
                            out.push(' ');
                        }
                        out.push(*c);
                        prev_word = false;
                    } else {
                        out.push(*c);
                        prev_word = true;
                    }
                }
            }
        }
        Ok(out.trim().to_string())
    }

    /// espeak-ng's phonemes for each word, mapped onto Kokoro's set.
    fn espeak_words(&self, words: &[String]) -> Result<Vec<String>, G2pError> {
        let fail = |why: String| G2pError::Espeak {
            word: words.join(" "),
            why,
        };
        let exe = self
            .espeak
            .as_ref()
            .ok_or_else(|| fail("espeak-ng not found on PATH".into()))?;
        let out = Command::new(exe)
            .args([
                "-q",
                "--ipa=1",
                "-v",
                self.english.espeak_voice(),
                "--sep=_",
            ])
            .arg(words.join("\n"))
            .output()
            .map_err(|e| fail(e.to_string()))?;
        if !out.status.success() {
            return Err(fail(format!("exit status {}", out.status)));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<String> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|l| {
                l.split_whitespace()
                    .map(map_espeak)
                    .collect::<Vec<_>>()
                    .join("")
            })
            .collect();
        if lines.len() != words.len() {
            // espeak joined or split lines: fall back to one call per word.
            let mut v = Vec::new();
            for w in words {
                let o = Command::new(exe)
                    .args([
                        "-q",
                        "--ipa=1",
                        "-v",
                        self.english.espeak_voice(),
                        "--sep=_",
                    ])
                    .arg(w)
                    .output()
                    .map_err(|e| fail(e.to_string()))?;
                let t = String::from_utf8_lossy(&o.stdout);
                v.push(
                    t.split_whitespace()
                        .map(map_espeak)
                        .collect::<Vec<_>>()
                        .join(""),
                );
            }
            return Ok(v);
        }
        Ok(lines)
    }
}

/// `w` with accented Latin letters as their plain ones (é -> e, ß -> ss, æ -> ae).
fn fold_accents(w: &str) -> String {
    let mut out = String::with_capacity(w.len());
    for c in w.chars() {
        let plain = match c {
            'à' | 'á' | 'â' | 'ã' | 'ä' | 'å' | 'ā' | 'ă' | 'ą' => "a",
            'À' | 'Á' | 'Â' | 'Ã' | 'Ä' | 'Å' | 'Ā' | 'Ă' | 'Ą' => "A",
            'ç' | 'ć' | 'č' => "c",
            'Ç' | 'Ć' | 'Č' => "C",
            'ď' | 'đ' => "d",
            'è' | 'é' | 'ê' | 'ë' | 'ē' | 'ė' | 'ę' | 'ě' => "e",
            'È' | 'É' | 'Ê' | 'Ë' | 'Ē' | 'Ė' | 'Ę' | 'Ě' => "E",
            'ğ' => "g",
            'ì' | 'í' | 'î' | 'ï' | 'ī' | 'į' | 'ı' => "i",
            'Ì' | 'Í' | 'Î' | 'Ï' | 'Ī' | 'İ' => "I",
            'ł' | 'ľ' => "l",
            'Ł' | 'Ľ' => "L",
            'ñ' | 'ń' | 'ň' => "n",
            'Ñ' | 'Ń' | 'Ň' => "N",
            'ò' | 'ó' | 'ô' | 'õ' | 'ö' | 'ø' | 'ō' | 'ő' => "o",
            'Ò' | 'Ó' | 'Ô' | 'Õ' | 'Ö' | 'Ø' | 'Ō' | 'Ő' => "O",
            'ř' => "r",
            'ś' | 'š' | 'ş' => "s",
            'Ś' | 'Š' | 'Ş' => "S",
            'ß' => "ss",
            'ť' | 'ţ' => "t",
            'ù' | 'ú' | 'û' | 'ü' | 'ū' | 'ů' | 'ű' => "u",
            'Ù' | 'Ú' | 'Û' | 'Ü' | 'Ū' | 'Ů' | 'Ű' => "U",
            'ý' | 'ÿ' => "y",
            'Ý' => "Y",
            'ź' | 'ż' | 'ž' => "z",
            'Ź' | 'Ż' | 'Ž' => "Z",
            'æ' => "ae",
            'Æ' => "AE",
            'œ' => "oe",
            'Œ' => "OE",
            c => {
                out.push(c);
                continue;
            }
        };
        out.push_str(plain);
    }
    out
}

pub(crate) fn find_espeak() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("espeak-ng"))
        .find(|p| p.is_file())
}

/// One espeak word of `_`-separated phonemes -> Kokoro phonemes.
pub fn map_espeak(word: &str) -> String {
    let mut out = String::new();
    for ph in word.split('_').filter(|p| !p.is_empty()) {
        let (stress, core) = match ph.chars().next() {
            Some(c @ ('ˈ' | 'ˌ')) => (Some(c), &ph[c.len_utf8()..]),
            _ => (None, ph),
        };
        let m = match core {
            "aɪ" => "I",
            "aʊ" => "W",
            "eɪ" => "A",
            "oʊ" | "əʊ" | "oː" => "O",
            "ɔɪ" => "Y",
            "dʒ" => "ʤ",
            "tʃ" => "ʧ",
            "ɚ" => "əɹ",
            "ɜː" | "ɝ" => "ɜɹ",
            "ɑː" => "ɑ",
            "iː" => "i",
            "uː" => "u",
            "ɔː" => "ɔ",
            "ɐ" => "ə",
            "ᵻ" => "ɪ",
            "r" => "ɹ",
            "x" | "ç" => "k",
            "ɬ" => "l",
            "əl" => "ᵊl",
            c => c,
        };
        if let Some(s) = stress {
            out.push(s);
        }
        out.extend(
            m.chars()
                .filter(|&c| c != 'ː' && c != '\u{0361}' && c != '\u{0303}'),
        );
    }
    out
}

/// Splits phonemes into chunks of at most `max` characters, at sentence punctuation, then
/// commas, then spaces.
pub fn chunk(phonemes: &str, max: usize) -> Vec<String> {
    let chars: Vec<char> = phonemes.chars().collect();
    let mut out = Vec::new();
    let mut start = 0;
    while chars.len() - start > max {
        let window = &chars[start..start + max];
        let cut = [".!?…", ",;:—", " "]
            .iter()
            .find_map(|set| window.iter().rposition(|c| set.contains(*c)))
            .map(|i| i + 1)
            .unwrap_or(max);
        out.push(
            chars[start..start + cut]
                .iter()
                .collect::<String>()
                .trim()
                .to_string(),
        );
        start += cut;
    }
    let rest: String = chars[start..].iter().collect::<String>().trim().to_string();
    if !rest.is_empty() {
        out.push(rest);
    }
    out.retain(|s| !s.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexicon_words_inflections_and_punctuation() {
        let g = G2p::from_entries(
            &[
                ("hello", "həlˈO"),
                ("world", "wˈɜɹld"),
                ("this", "ðɪs"),
                ("is", "ɪz"),
                ("a", "ɐ"),
                ("test", "tˈɛst"),
                ("walk", "wˈɔk"),
                ("apple", "ˈæpᵊl"),
            ],
            false,
        );
        assert_eq!(
            g.phonemize("Hello world, this is a test.").unwrap(),
            "həlˈO wˈɜɹld, ðɪs ɪz ɐ tˈɛst."
        );
        assert_eq!(
            g.phonemize("tests walked walking").unwrap(),
            "tˈɛsts wˈɔkt wˈɔkɪŋ"
        );
        assert_eq!(
            g.phonemize("the apple the test").unwrap(),
            "ði ˈæpᵊl ðə tˈɛst"
        );
        let e = g.phonemize("zyzzyva").err().unwrap().to_string();
        assert!(e.contains("zyzzyva") && e.contains("espeak"), "{e}");
    }

    #[test]
    fn espeak_mapping_and_chunks() {
        assert_eq!(map_espeak("k_ə_k_ˈoː_ɹ_oʊ"), "kəkˈOɹO");
        assert_eq!(map_espeak("tʃ_ˈɜː_tʃ"), "ʧˈɜɹʧ");
        let c = chunk("ab cd. ef gh, ij kl", 8);
        assert!(c.iter().all(|s| s.chars().count() <= 8), "{c:?}");
        assert_eq!(c.concat().replace(' ', ""), "abcd.efgh,ijkl");
    }
}
