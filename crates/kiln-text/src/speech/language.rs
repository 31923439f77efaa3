//! Kokoro's voices are named by language (the first letter) and gender (the second):
//! `af_heart` is American English, female. Each language has its own way from text to
//! phonemes: misaki's lexicons for the two Englishes, espeak-ng (run as a program, never
//! linked) for Spanish, French, Hindi, Italian and Brazilian Portuguese, as Kokoro's own
//! pipeline does; Japanese and Mandarin need G2Ps kiln does not have, and say so.

use std::process::Command;

use super::g2p::{find_espeak, English};
use super::G2pError;

/// How a voice's text becomes phonemes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phonemizer {
    English(English),
    /// espeak-ng with this voice.
    Espeak(&'static str),
    /// No G2P for this language here: the reason, for the error.
    None(&'static str),
}

/// A voice's language: its name and its phonemizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Language {
    pub name: &'static str,
    pub phonemizer: Phonemizer,
}

/// The language of a Kokoro voice name (`bf_emma` -> British English); None for a name that
/// does not start with one of Kokoro's language letters.
pub fn voice_language(voice: &str) -> Option<Language> {
    let (name, phonemizer) = match voice.chars().next()? {
        'a' => ("American English", Phonemizer::English(English::American)),
        'b' => ("British English", Phonemizer::English(English::British)),
        'e' => ("Spanish", Phonemizer::Espeak("es")),
        'f' => ("French", Phonemizer::Espeak("fr-fr")),
        'h' => ("Hindi", Phonemizer::Espeak("hi")),
        'i' => ("Italian", Phonemizer::Espeak("it")),
        'p' => ("Brazilian Portuguese", Phonemizer::Espeak("pt-br")),
        'j' => (
            "Japanese",
            Phonemizer::None("Kokoro's Japanese phonemes come from a Japanese G2P (pyopenjtalk's dictionary), which kiln does not have"),
        ),
        'z' => (
            "Mandarin Chinese",
            Phonemizer::None("Kokoro's Mandarin phonemes come from a pinyin G2P (jieba and pypinyin), which kiln does not have"),
        ),
        _ => return None,
    };
    Some(Language { name, phonemizer })
}

/// A language by its code (`en-us`, `en-gb`, `es`, `fr`, `hi`, `it`, `pt-br`, `ja`, `zh`) or
/// by Kokoro's voice letter (`a`, `b`, ...).
pub fn language_by_code(code: &str) -> Option<Language> {
    let letter = match code.to_ascii_lowercase().as_str() {
        "en-us" | "en" | "a" => "a",
        "en-gb" | "b" => "b",
        "es" | "e" => "e",
        "fr" | "fr-fr" | "f" => "f",
        "hi" | "h" => "h",
        "it" | "i" => "i",
        "pt-br" | "pt" | "p" => "p",
        "ja" | "j" => "j",
        "zh" | "cmn" | "z" => "z",
        _ => return None,
    };
    voice_language(letter)
}

/// Clause-ending punctuation kept between espeak-ng's clauses.
const CLAUSE_END: &[char] = &[',', ';', ':', '.', '!', '?', '—', '…'];

/// espeak-ng's IPA for `text` in `voice`, in Kokoro's notation: the tied multi-letter
/// phonemes Kokoro writes as one letter (diphthongs, affricates), language-switch flags and
/// hyphens dropped, the clauses' punctuation kept. Letters Kokoro has no token for are left
/// for the caller to drop, as Kokoro's own pipeline drops them.
pub fn espeak_phonemes(text: &str, voice: &str) -> Result<String, G2pError> {
    let fail = |why: String| G2pError::Espeak {
        word: text.to_string(),
        why,
    };
    let exe = find_espeak().ok_or_else(|| {
        fail(format!(
            "espeak-ng, which kiln runs for this language ({voice}), is not installed"
        ))
    })?;
    let mut out = String::new();
    let mut clause = String::new();
    let run = |clause: &str, end: Option<char>, out: &mut String| -> Result<(), G2pError> {
        if !clause.trim().is_empty() {
            let o = Command::new(&exe)
                .args(["-q", "--ipa=1", "--tie=^", "-v", voice])
                .arg(clause.trim())
                .output()
                .map_err(|e| fail(e.to_string()))?;
            if !o.status.success() {
                return Err(fail(format!("exit status {}", o.status)));
            }
            let ipa = String::from_utf8_lossy(&o.stdout);
            let words: Vec<String> = ipa.split_whitespace().map(map_ipa).collect();
            if !out.is_empty() && !out.ends_with(' ') {
                out.push(' ');
            }
            out.push_str(&words.join(" "));
        }
        if let Some(c) = end {
            out.push(c);
            out.push(' ');
        }
        Ok(())
    };
    let chars: Vec<char> = text.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        // A mark ends a clause where a space or the end follows (not "3.5").
        let ends = CLAUSE_END.contains(&c) && chars.get(i + 1).is_none_or(|n| n.is_whitespace());
        if ends {
            run(&clause, Some(c), &mut out)?;
            clause.clear();
        } else {
            clause.push(c);
        }
    }
    run(&clause, None, &mut out)?;
    Ok(out.trim().to_string())
}

/// One espeak-ng word (IPA, multi-letter phonemes tied with `^`) in Kokoro's notation.
fn map_ipa(word: &str) -> String {
    let mut w = word.to_string();
    // Language-switch flags: "(en)".
    while let Some(a) = w.find('(') {
        match w[a..].find(')') {
            Some(b) => w.replace_range(a..a + b + 1, ""),
            None => break,
        }
    }
    for (from, to) in [
        ("a^ɪ", "I"),
        ("a^ʊ", "W"),
        ("e^ɪ", "A"),
        ("o^ʊ", "O"),
        ("ɔ^ɪ", "Y"),
        ("d^ʒ", "ʤ"),
        ("t^ʃ", "ʧ"),
        ("t^s", "ʦ"),
        ("d^z", "ʣ"),
    ] {
        w = w.replace(from, to);
    }
    w.chars().filter(|&c| c != '^' && c != '-').collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn voices_name_their_language() {
        let l = voice_language("bf_emma").unwrap();
        assert_eq!(l.name, "British English");
        assert_eq!(l.phonemizer, Phonemizer::English(English::British));
        assert_eq!(
            voice_language("ef_dora").unwrap().phonemizer,
            Phonemizer::Espeak("es")
        );
        assert!(matches!(
            voice_language("jf_alpha").unwrap().phonemizer,
            Phonemizer::None(_)
        ));
        assert_eq!(voice_language("xx_nobody"), None);
    }

    #[test]
    fn tied_phonemes_become_kokoros_letters() {
        assert_eq!(map_ipa("tɾˈe^ɪnta"), "tɾˈAnta");
        assert_eq!(map_ipa("t^ʃˈiko"), "ʧˈiko");
        assert_eq!(map_ipa("(en)kəmˈə^ʊ(hi)"), "kəmˈəʊ");
        assert_eq!(map_ipa("ʒə-"), "ʒə");
    }
}
