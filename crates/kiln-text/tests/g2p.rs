//! The English G2P's fallbacks for words out of the lexicons, as a machine without espeak-ng
//! runs them: g2p-en's neural model (ported) against the package's own predictions
//! (`fixtures/g2p_en_reference.json`, from `tools/g2p_en_reference.py`), and sentences with
//! numbers, dates, initialisms and foreign words phonemized in full.

use std::collections::BTreeMap;

use kiln_text::speech::{normalize, sentences, G2p, NeuralG2p, NEURAL_G2P_FILE};

fn lexicons() -> std::path::PathBuf {
    kiln_assets::resolve("misaki-en-us", &mut |_| {}).unwrap()
}

#[test]
fn neural_g2p_matches_g2p_en() {
    let m = NeuralG2p::load(&lexicons().join(NEURAL_G2P_FILE)).unwrap();
    let want: BTreeMap<String, Vec<String>> = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/g2p_en_reference.json"
        ))
        .unwrap(),
    )
    .unwrap();
    assert!(want.len() >= 20);
    for (word, phones) in &want {
        assert_eq!(&m.arpabet(word), phones, "{word}");
    }
    assert!(m.arpabet("").is_empty() && m.arpabet("123").is_empty());
    assert_eq!(m.phonemes("ab"), "ˈæb");
}

/// Without espeak-ng every word gets phonemes: numbers and dates as words, initialisms
/// spelled, accents folded, the rest from the neural model.
#[test]
fn every_word_is_pronounced_without_espeak() {
    let g = G2p::load(&lexicons()).unwrap().without_espeak();
    let text = "Dr. Smith paid $3.50 on 12/05/2024 at 3:30pm. The FBI met Zyzzyva Quokkington \
                at the café in São Paulo, etc. Room 42b, 7 items.";
    for s in sentences(text) {
        let p = g.phonemize(&normalize(&s)).unwrap();
        assert!(!p.is_empty(), "{s}");
        assert!(!p.chars().any(|c| c.is_ascii_digit()), "{s}: {p}");
    }
    let p = g.phonemize("FBI").unwrap();
    assert_eq!(
        p.matches('ˈ').count(),
        1,
        "stress on the last letter only: {p}"
    );
    assert_eq!(g.phonemize("café").unwrap(), g.phonemize("cafe").unwrap());
    assert_eq!(
        g.phonemize("42").unwrap(),
        g.phonemize("forty-two").unwrap()
    );
}
