//! Speech out and back in: five varied English sentences spoken by `kiln speak` (Kokoro-82M,
//! voice jf_alpha) and transcribed by `kiln transcribe` (Whisper tiny.en) come back with a
//! word error rate of at most 10% after normalisation (numbers and currency spelled out by
//! the speech front end's normaliser on both sides, case and punctuation dropped).

use std::process::Command;

use kiln_text::speech::normalize;

const SENTENCES: [&str; 5] = [
    "The quick brown fox jumps over the lazy dog.",
    "I bought three apples for $12 yesterday.",
    "Where is the nearest train station?",
    "Our meeting starts at ten thirty in the morning, so please arrive a few minutes early \
     and bring your notes.",
    "She has lived in this city for 25 years.",
];

fn words(text: &str) -> Vec<String> {
    normalize(text)
        .to_lowercase()
        .replace('-', " ")
        .chars()
        .filter(|c| c.is_alphanumeric() || c.is_whitespace() || *c == '\'')
        .collect::<String>()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Word-level edit distance.
fn edits(a: &[String], b: &[String]) -> usize {
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, x) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, y) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(x != y))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[test]
fn spoken_sentences_transcribe_back() {
    for m in ["kokoro-82m", "misaki-en-us", "whisper-tiny.en"] {
        kiln_assets::resolve(m, &mut |_| {}).unwrap();
    }
    let dir = std::env::temp_dir().join(format!("kiln-roundtrip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut errors, mut total) = (0, 0);
    for (i, s) in SENTENCES.iter().enumerate() {
        let wav = dir.join(format!("{i}.wav"));
        let spoke = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["speak", s, "-o", wav.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            spoke.status.success(),
            "speak: {}",
            String::from_utf8_lossy(&spoke.stderr)
        );
        let heard = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["transcribe", wav.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            heard.status.success(),
            "transcribe: {}",
            String::from_utf8_lossy(&heard.stderr)
        );
        let (want, got) = (words(s), words(&String::from_utf8_lossy(&heard.stdout)));
        let e = edits(&want, &got);
        eprintln!("{e} errors / {}: {want:?} -> {got:?}", want.len());
        errors += e;
        total += want.len();
    }
    let wer = errors as f64 / total as f64;
    eprintln!("word error rate {errors}/{total} = {wer:.3}");
    assert!(wer <= 0.10, "word error rate {wer:.3} over {total} words");
}
