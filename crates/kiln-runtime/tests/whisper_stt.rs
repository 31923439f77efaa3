//! Whisper transcription end to end on real audio with tiny.en: timestamps, subtitle
//! formats, long-form audio across windows, the vocabulary's suppressed tokens, bad input.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kiln_backend::cpu::CpuBackend;
use kiln_models::whisper::LoadOptions;
use kiln_runtime::whisper::{output, Stt, TranscribeOptions, Transcript};

const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/assets");
const JFK: &str = "and so my fellow americans ask not what your country can do for you ask what you can do for your country";

fn model_dir() -> PathBuf {
    let p = kiln_assets::resolve("whisper-tiny.en", &mut |_| {}).unwrap();
    if p.is_dir() {
        p
    } else {
        p.parent().unwrap().into()
    }
}

fn stt() -> &'static Stt<CpuBackend> {
    static STT: OnceLock<Stt<CpuBackend>> = OnceLock::new();
    STT.get_or_init(|| Stt::load(CpuBackend::new(2), &model_dir(), LoadOptions::default()).unwrap())
}

fn jfk() -> Vec<f32> {
    kiln_audio::load_16k(Path::new(&format!("{SHARED}/audio/jfk.wav")))
        .unwrap()
        .samples
}

/// Lower-case words only.
fn words(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                ' '
            }
        })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn check_segments(t: &Transcript, audio_s: f64) {
    assert!(!t.segments.is_empty());
    let mut prev_end = 0.0;
    for s in &t.segments {
        assert!(
            s.start >= prev_end - 1e-9,
            "segments overlap: {:?}",
            t.segments
        );
        assert!(s.end > s.start, "empty segment {s:?}");
        assert!(s.end <= audio_s + 0.5, "segment past the audio: {s:?}");
        assert!(!s.text.trim().is_empty());
        assert!(s.avg_logprob <= 0.0 && (0.0..=1.0).contains(&s.no_speech_prob));
        prev_end = s.end;
    }
}

#[test]
fn jfk_with_timestamps_segments_are_monotonic_and_cover_the_speech() {
    let s = stt();
    let t = s.transcribe(&jfk(), &TranscribeOptions::default()).unwrap();
    assert_eq!(words(&t.text), JFK, "{}", t.text);
    check_segments(&t, 11.0);
    let (first, last) = (&t.segments[0], t.segments.last().unwrap());
    assert!(first.start < 1.0, "speech starts at 0.3 s: {first:?}");
    assert!(last.end > 9.5, "speech ends near 10.5 s: {last:?}");
    // Every token of a segment is text or a timestamp of this window.
    for seg in &t.segments {
        assert!(seg
            .tokens
            .iter()
            .all(|&id| id < s.special.eot || s.special.is_timestamp(id)));
    }

    // SubRip: numbered cues, `HH:MM:SS,mmm --> HH:MM:SS,mmm`, text, blank line.
    let srt = output::srt(&t);
    let cues: Vec<&str> = srt.trim_end().split("\n\n").collect();
    assert_eq!(cues.len(), t.segments.len());
    for (i, cue) in cues.iter().enumerate() {
        let lines: Vec<&str> = cue.lines().collect();
        assert_eq!(lines[0], (i + 1).to_string());
        let (a, b) = lines[1].split_once(" --> ").unwrap();
        for ts in [a, b] {
            let ok = ts.len() == 12
                && ts.as_bytes()[2] == b':'
                && ts.as_bytes()[5] == b':'
                && ts.as_bytes()[8] == b',';
            assert!(ok, "bad srt time '{ts}'");
        }
        assert!(a < b, "{cue}");
        assert!(!lines[2].is_empty());
    }
    // WebVTT: header, `HH:MM:SS.mmm --> HH:MM:SS.mmm` cues.
    let vtt = output::vtt(&t);
    assert!(vtt.starts_with("WEBVTT\n\n"));
    let cues: Vec<&str> = vtt["WEBVTT\n\n".len()..].trim_end().split("\n\n").collect();
    assert_eq!(cues.len(), t.segments.len());
    for cue in cues {
        let (a, b) = cue.lines().next().unwrap().split_once(" --> ").unwrap();
        assert!(a.len() == 12 && a.as_bytes()[8] == b'.' && b.as_bytes()[8] == b'.');
        assert!(a < b);
    }
    // JSON: segments with their fields.
    let j: serde_json::Value = serde_json::from_str(&output::json(&t)).unwrap();
    let seg = &j["segments"][0];
    for k in [
        "start",
        "end",
        "text",
        "tokens",
        "avg_logprob",
        "no_speech_prob",
    ] {
        assert!(!seg[k].is_null(), "json segment lacks {k}");
    }
    assert_eq!(output::timestamp(3661.0416, ','), "01:01:01,042");
}

#[test]
fn greedy_without_timestamps_matches_golden_text() {
    let s = stt();
    let mut o = TranscribeOptions::default();
    o.decode.timestamps = false;
    let t = s.transcribe(&jfk(), &o).unwrap();
    let v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{SHARED}/golden/whisper_tiny_en_jfk.json")).unwrap(),
    )
    .unwrap();
    let want: Vec<u32> = v["greedy_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(t.segments.len(), 1);
    assert_eq!(t.segments[0].tokens, want);
    assert_eq!(t.text, v["text"].as_str().unwrap());
}

#[test]
fn beam_search_transcribes_jfk() {
    let s = stt();
    let mut o = TranscribeOptions::default();
    o.decode.beam_size = 3;
    let t = s.transcribe(&jfk(), &o).unwrap();
    assert_eq!(words(&t.text), JFK, "{}", t.text);
    check_segments(&t, 11.0);
}

#[test]
fn long_form_across_windows_neither_drops_nor_repeats() {
    // 3 s silence, jfk, 10 s silence, jfk, 12 s silence, jfk, 8 s silence: 66 s, 3+ windows,
    // with the second and third sentences straddling window boundaries.
    let j = jfk();
    let silence = |s: f64| vec![0f32; (s * 16_000.0) as usize];
    let mut audio = silence(3.0);
    for gap in [10.0, 12.0, 8.0] {
        audio.extend_from_slice(&j);
        audio.extend(silence(gap));
    }
    let audio_s = audio.len() as f64 / 16_000.0;
    assert!(audio_s > 60.0);
    let t = stt()
        .transcribe(&audio, &TranscribeOptions::default())
        .unwrap();
    assert!(t.stats.windows >= 3, "{:?}", t.stats);
    let w = words(&t.text);
    assert_eq!(w, [JFK, JFK, JFK].join(" "), "{}", t.text);
    check_segments(&t, audio_s);
    // Each sentence (spoken over [s, s + 11] for s = 3, 24, 47) lies in one segment whose
    // span covers it. Whisper places a window's first timestamp within its first second
    // (max_initial_timestamp), so a segment may begin in the silence before its sentence,
    // but never in the previous sentence.
    let spans: Vec<(f64, f64)> = t.segments.iter().map(|s| (s.start, s.end)).collect();
    for (k, start) in [3.0, 24.0, 47.0].into_iter().enumerate() {
        let prev_end = [0.0, 14.0, 35.0][k];
        assert!(
            spans
                .iter()
                .any(|&(a, b)| a <= start + 1.5 && a >= prev_end - 0.5 && b >= start + 9.0),
            "no segment covers the sentence at {start} s: {spans:?}"
        );
    }
}

/// Beam search (5) over the same 66 s: faster-whisper 1.2.1's segments on the same model
/// (int8, `beam_size=5`, no VAD) as the reference, text for text and each time within
/// 0.05 s. openai-whisper's rule that drops candidates ranked below the beam's last kept
/// one, finished ones included, decides this: keeping a finished short ending from further
/// down let "country." alone win a window on its mean logprob.
#[test]
fn beam_search_long_form_segments_match_faster_whisper() {
    let j = jfk();
    let silence = |s: f64| vec![0f32; (s * 16_000.0) as usize];
    let mut audio = silence(3.0);
    for gap in [10.0, 12.0, 8.0] {
        audio.extend_from_slice(&j);
        audio.extend(silence(gap));
    }
    let mut o = TranscribeOptions::default();
    o.decode.beam_size = 5;
    let t = stt().transcribe(&audio, &o).unwrap();
    let (a, b) = (
        "And so, my fellow Americans ask not what your country can do for you, ask what you can",
        "do for your country.",
    );
    let c =
        "And so, my fellow Americans ask not what your country can do for you, ask what you can do";
    let want = [
        (0.00, 12.38, a),
        (12.38, 24.52, b),
        (24.52, 33.36, a),
        (33.36, 47.54, b),
        (47.54, 56.54, c),
        (56.54, 57.54, "for your country."),
    ];
    let got: Vec<(f64, f64, &str)> = t
        .segments
        .iter()
        .map(|s| (s.start, s.end, s.text.trim()))
        .collect();
    assert_eq!(got.len(), want.len(), "{got:?}");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.2, w.2, "{got:?}");
        assert!(
            (g.0 - w.0).abs() <= 0.05 && (g.1 - w.1).abs() <= 0.05,
            "{g:?} vs {w:?}"
        );
    }
}

#[test]
fn suppressed_tokens_match_the_models_config() {
    // The package's config.json lists the ids its converter suppressed; ours come from the
    // vocabulary alone.
    let s = stt();
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model_dir().join("config.json")).unwrap())
            .unwrap();
    let want: Vec<u32> = cfg["suppress_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(s.suppress, want);
    assert_eq!(s.special.timestamp_begin, 50363);
    assert!(!s.special.multilingual);
}

#[test]
fn truncated_model_and_bad_audio_are_clear_errors() {
    let src = model_dir();
    let dir = std::env::temp_dir().join(format!("kiln-whisper-trunc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let bin = std::fs::read(src.join("model.bin")).unwrap();
    for cut in [0, 3, 100, 5_000_000, bin.len() - 1] {
        std::fs::write(dir.join("model.bin"), &bin[..cut]).unwrap();
        let e = Stt::load(CpuBackend::new(1), &dir, LoadOptions::default())
            .err()
            .unwrap_or_else(|| panic!("cut at {cut} loaded"));
        let msg = e.to_string();
        assert!(msg.contains("model.bin"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
    }
    std::fs::remove_dir_all(&dir).ok();
    // Audio: not audio, empty.
    let p = std::env::temp_dir().join(format!("kiln-not-audio-{}.wav", std::process::id()));
    std::fs::write(&p, b"this is a text file, not a recording\n").unwrap();
    assert!(kiln_audio::load_16k(&p).is_err());
    std::fs::write(&p, b"").unwrap();
    let e = kiln_audio::load_16k(&p).unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
    std::fs::remove_file(&p).ok();
}

#[test]
fn special_tokens_come_from_the_vocabulary() {
    let tok = kiln_text::Tokenizer::from_file(model_dir().join("tokenizer.json")).unwrap();
    let en = kiln_runtime::whisper::SpecialTokens::from_tokenizer(&tok, 51864).unwrap();
    assert!(!en.multilingual);
    assert_eq!((en.eot, en.sot, en.no_timestamps), (50256, 50257, 50362));
    assert_eq!(en.language("en"), Some(50258));
    assert_eq!(en.language("de"), Some(50260));
    assert_eq!(en.languages.len(), 99);
    assert!((en.time_of(en.timestamp_begin + 150) - 3.0).abs() < 1e-9);
    // One more id in the model's vocabulary: a multilingual model.
    let multi = kiln_runtime::whisper::SpecialTokens::from_tokenizer(&tok, 51865).unwrap();
    assert!(multi.multilingual);
    // Too few ids for 1501 timestamps: an error, not a panic later.
    assert!(kiln_runtime::whisper::SpecialTokens::from_tokenizer(&tok, 50400).is_err());
}

#[test]
fn audio_shorter_than_a_frame_gives_an_empty_transcript() {
    let t = stt()
        .transcribe(&[0.0; 10], &TranscribeOptions::default())
        .unwrap();
    assert!(t.segments.is_empty() && t.text.is_empty());
    let t = stt()
        .transcribe(&[], &TranscribeOptions::default())
        .unwrap();
    assert!(t.segments.is_empty());
}

/// Whisper base, multilingual (the catalog's mirror of a CTranslate2 fp16 export): its
/// vocabulary's specials sit one id later than tiny.en's, the language is detected from the
/// audio, and jfk.wav transcribes word for word.
#[test]
fn multilingual_base_detects_english_and_transcribes_jfk() {
    let dir = kiln_assets::resolve("whisper-base", &mut |_| {}).unwrap();
    let tok = kiln_text::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let sp = kiln_runtime::whisper::SpecialTokens::from_tokenizer(&tok, 51865).unwrap();
    assert!(sp.multilingual);
    assert_eq!((sp.eot, sp.sot, sp.no_timestamps), (50257, 50258, 50363));
    assert_eq!(sp.language("en"), Some(50259));
    let s = Stt::load(CpuBackend::new(2), &dir, LoadOptions::default()).unwrap();
    for timestamps in [true, false] {
        let mut o = TranscribeOptions::default();
        o.decode.timestamps = timestamps;
        let t = s.transcribe(&jfk(), &o).unwrap();
        assert_eq!(t.language, "en");
        assert_eq!(words(&t.text), JFK, "{}", t.text);
    }
}

/// Word timestamps on jfk.wav against the reference alignment of the same model
/// (`tools/whisper_words_reference.py`: faster-whisper 1.2.1, whose word alignment is
/// openai-whisper's): the same words, each start and end within 0.1 s.
#[test]
fn word_timestamps_follow_the_reference_alignment() {
    let s = stt();
    let mut o = TranscribeOptions::default();
    o.word_timestamps = true;
    let t = s.transcribe(&jfk(), &o).unwrap();
    let got: Vec<&kiln_runtime::whisper::Word> = t.segments.iter().flat_map(|s| &s.words).collect();
    let v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/jfk_words_tiny_en.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let want = v["words"].as_array().unwrap();
    let got_words: Vec<String> = got.iter().map(|w| words(&w.word)).collect();
    let want_words: Vec<String> = want
        .iter()
        .map(|w| words(w["word"].as_str().unwrap()))
        .collect();
    assert_eq!(got_words, want_words, "{got:?}");
    for (g, w) in got.iter().zip(want) {
        let (ws, we) = (w["start"].as_f64().unwrap(), w["end"].as_f64().unwrap());
        assert!(
            (g.start - ws).abs() <= 0.1 && (g.end - we).abs() <= 0.1,
            "{:?}: kiln {:.2}-{:.2}, reference {ws:.2}-{we:.2}",
            g.word,
            g.start,
            g.end
        );
    }
    // Words lie in order inside their segments.
    for seg in &t.segments {
        for w in &seg.words {
            assert!(
                w.start <= w.end && w.start >= seg.start - 1e-9 && w.end <= seg.end + 1e-9,
                "{w:?} in {seg:?}"
            );
        }
    }
    // Without asking, no words.
    let plain = s.transcribe(&jfk(), &TranscribeOptions::default()).unwrap();
    assert!(plain.segments.iter().all(|s| s.words.is_empty()));
}

#[test]
fn a_backend_error_is_said_before_the_files() {
    use kiln_runtime::whisper::WhisperError;
    let missing = std::env::temp_dir().join(format!("kiln-no-model-{}", std::process::id()));
    let no_device = || -> Result<CpuBackend, WhisperError> {
        Err(WhisperError::Device("no device here".into()))
    };
    let e = Stt::load_with(no_device, &missing, LoadOptions::default())
        .err()
        .expect("no backend, no model");
    assert_eq!(e.to_string(), "no device here");
    // A backend made: the file's own error, naming it.
    let e = Stt::load_with(|| Ok(CpuBackend::new(1)), &missing, LoadOptions::default())
        .err()
        .expect("no model");
    let name = missing.file_name().unwrap().to_string_lossy().into_owned();
    assert!(e.to_string().contains(&name), "{e}");
    // A readable model but no backend: the backend's error.
    let e = Stt::load_with(no_device, &model_dir(), LoadOptions::default())
        .err()
        .expect("no backend");
    assert_eq!(e.to_string(), "no device here");
}
