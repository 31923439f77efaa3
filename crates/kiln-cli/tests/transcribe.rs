//! `kiln transcribe` and `kiln bench --stt` as a user runs them: the default Whisper model on
//! real speech (file and raw PCM on stdin), subtitle output, and one clear line for bad input.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const JFK: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/assets/audio/jfk.wav"
);

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-stt-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn assert_clean_error(out: &Output, needle: &str) {
    let err = text(&out.stderr);
    assert!(!out.status.success(), "expected failure: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    assert_eq!(err.trim().lines().count(), 1, "one line expected: {err}");
    assert!(err.contains(needle), "expected '{needle}' in: {err}");
}

fn fetch() {
    kiln_assets::resolve("whisper-tiny.en", &mut |_| {}).unwrap();
}

#[test]
fn transcribes_a_wav_file_to_srt() {
    fetch();
    let out = kiln(&["transcribe", JFK, "--format", "srt", "-t", "2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let srt = text(&out.stdout);
    assert!(srt.starts_with("1\n00:00:0"), "{srt}");
    assert!(srt.contains(" --> "), "{srt}");
    assert!(
        srt.contains("ask not what your country can do for you"),
        "{srt}"
    );
    let err = text(&out.stderr);
    assert!(err.contains("RTF"), "stats line: {err}");
}

#[test]
fn raw_pcm_on_stdin_and_q8_0_weights() {
    fetch();
    // jfk.wav is 16 kHz mono s16le after a 44-byte header.
    let wav = std::fs::read(JFK).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "transcribe",
            "-",
            "--quant",
            "q8_0",
            "-t",
            "2",
            "--no-timestamps",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&wav[44..]).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout).to_lowercase();
    assert!(
        t.contains("ask not what your country can do for you"),
        "{t}"
    );
    assert!(t.contains("ask what you can do for your country"), "{t}");
}

/// A container piped to stdin is decoded as the file would be (FLAC was taken for raw PCM
/// and transcribed as nothing); MP3 frames are recognised by their chained headers; Ogg Opus
/// from libopus decodes to the same words.
#[test]
fn containers_on_stdin_are_decoded() {
    fetch();
    kiln_assets::convert::python_module("soundfile", "soundfile").unwrap();
    let (wav_text, _) = transcribe_json(JFK, "whisper-tiny.en");
    // Ogg Opus as libopus (libsndfile's) writes it: what voice messages and browsers send.
    for (ext, format, subtype) in [
        ("flac", "FLAC", "PCM_16"),
        ("mp3", "MP3", "MPEG_LAYER_III"),
        ("opus", "OGG", "OPUS"),
    ] {
        let f = scratch(&format!("jfk.{ext}"));
        let st = Command::new("python3")
            .args([
                "-c",
                "import sys, soundfile as sf; d, r = sf.read(sys.argv[1]); \
                 sf.write(sys.argv[2], d, r, format=sys.argv[3], subtype=sys.argv[4])",
                JFK,
                f.to_str().unwrap(),
                format,
                subtype,
            ])
            .status()
            .unwrap();
        assert!(st.success(), "encoding {format}");
        let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["transcribe", "-", "-t", "2", "--no-timestamps"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let bytes = std::fs::read(&f).unwrap();
        child.stdin.take().unwrap().write_all(&bytes).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(words(&text(&out.stdout)), words(&wav_text), "{format}");
    }
}

#[test]
fn bad_input_is_one_clear_line() {
    fetch();
    let p = scratch("notes.wav");
    std::fs::write(&p, "not audio at all, just some text\n".repeat(10)).unwrap();
    assert_clean_error(
        &kiln(&["transcribe", p.to_str().unwrap()]),
        "not a supported audio file",
    );
    let e = scratch("empty.wav");
    std::fs::write(&e, b"").unwrap();
    assert_clean_error(&kiln(&["transcribe", e.to_str().unwrap()]), "empty");
    assert_clean_error(
        &kiln(&["transcribe", "/no/such/file.wav"]),
        "/no/such/file.wav",
    );
    // A truncated model.bin in a model directory.
    let dir = scratch("model");
    std::fs::create_dir_all(&dir).unwrap();
    let src = kiln_assets::resolve("whisper-tiny.en", &mut |_| {}).unwrap();
    let src = if src.is_dir() {
        src
    } else {
        src.parent().unwrap().into()
    };
    let bin = std::fs::read(src.join("model.bin")).unwrap();
    std::fs::write(dir.join("model.bin"), &bin[..bin.len() / 3]).unwrap();
    std::fs::copy(src.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let out = kiln(&["transcribe", JFK, "-m", dir.to_str().unwrap()]);
    assert_clean_error(&out, "truncated");
    // English-only model asked for another language.
    let out = kiln(&["transcribe", JFK, "--language", "de"]);
    assert_clean_error(&out, "English-only");
}

#[test]
fn bench_stt_reports_encoder_decoder_and_rtf() {
    fetch();
    let out = kiln(&["bench", "--stt", JFK, "-r", "1", "-t", "2", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    for k in ["encoder_ms_per_window", "decode_ms_per_token", "rtf"] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}: {v}");
    }
}

fn formats_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("whisper-formats")
}

fn golden() -> (Vec<u64>, String) {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/assets/golden/whisper_tiny_en_jfk.json"
    );
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let ids = v["greedy_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    (ids, v["text"].as_str().unwrap().into())
}

/// Lower-case words, single spaces.
fn words(s: &str) -> String {
    let s: String = s
        .chars()
        .map(|c| {
            if c.is_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                ' '
            }
        })
        .collect();
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `kiln transcribe FILE -m MODEL --no-timestamps --format json`: (text, tokens).
fn transcribe_json(file: &str, model: &str) -> (String, Vec<u64>) {
    let out = kiln(&[
        "transcribe",
        file,
        "-m",
        model,
        "-t",
        "2",
        "--no-timestamps",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{model}: {}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    let tokens = v["segments"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| {
            s["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap())
        })
        .collect();
    (v["text"].as_str().unwrap().into(), tokens)
}

#[test]
fn whisper_cpp_ggml_files_just_work() {
    // As a whisper.cpp user has them: one .bin, no tokenizer.json beside it.
    let (ids, want) = golden();
    let f16 = kiln_assets::convert::whisper_ggml(&formats_dir(), "f16").unwrap();
    let (t, toks) = transcribe_json(JFK, f16.to_str().unwrap());
    assert_eq!(toks, ids);
    assert_eq!(t, want);
    for ty in ["q8_0", "q5_0"] {
        let q = kiln_assets::convert::whisper_ggml(&formats_dir(), ty).unwrap();
        let (t, _) = transcribe_json(JFK, q.to_str().unwrap());
        assert_eq!(words(&t), words(&want), "{ty}: {t}");
    }
    // A cut-off download: one line naming the file.
    let bin = std::fs::read(&f16).unwrap();
    let cut = scratch("ggml-cut.bin");
    std::fs::write(&cut, &bin[..bin.len() / 2]).unwrap();
    let out = kiln(&["transcribe", JFK, "-m", cut.to_str().unwrap()]);
    assert_clean_error(&out, "ggml-cut.bin: truncated");
}

#[test]
fn hugging_face_directory_transcribes() {
    let (ids, want) = golden();
    let hf = kiln_assets::convert::whisper_hf(&formats_dir(), "f16", 1).unwrap();
    let (t, toks) = transcribe_json(JFK, hf.to_str().unwrap());
    assert_eq!(toks, ids);
    assert_eq!(t, want);
}

#[test]
fn ogg_vorbis_transcribes_like_the_wav() {
    fetch();
    // Encoded here by libsndfile (the soundfile wheel bundles it with Vorbis).
    kiln_assets::convert::python_module("soundfile", "soundfile").unwrap();
    let ogg = scratch("jfk.ogg");
    let st = Command::new("python3")
        .args([
            "-c",
            "import sys, soundfile as sf; d, r = sf.read(sys.argv[1]); \
             sf.write(sys.argv[2], d, r, format='OGG', subtype='VORBIS')",
            JFK,
            ogg.to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(&std::fs::read(&ogg).unwrap()[..4], b"OggS");
    let (wav_text, _) = transcribe_json(JFK, "whisper-tiny.en");
    let (ogg_text, _) = transcribe_json(ogg.to_str().unwrap(), "whisper-tiny.en");
    assert_eq!(words(&ogg_text), words(&wav_text), "{ogg_text}");
}

/// jfk.wav's samples with `lead` s of digital silence before them and, with `split` =
/// (at, gap), `gap` s of silence inserted `at` s into them, as a 16 kHz WAV named `name`.
fn jfk_with_silence(name: &str, lead: f32, split: Option<(f32, f32)>) -> PathBuf {
    let wav = std::fs::read(JFK).unwrap();
    let data = wav.windows(4).position(|w| w == b"data").unwrap() + 8;
    let jfk = &wav[data..];
    let bytes = |s: f32| (s * 16000.0) as usize * 2;
    let mut pcm = vec![0u8; bytes(lead)];
    match split {
        Some((at, gap)) => {
            pcm.extend(&jfk[..bytes(at)]);
            pcm.extend(vec![0u8; bytes(gap)]);
            pcm.extend(&jfk[bytes(at)..]);
        }
        None => pcm.extend(jfk),
    }
    wav16(name, pcm)
}

/// 16 kHz mono s16le `pcm` as a WAV named `name` in the test's scratch folder.
fn wav16(name: &str, pcm: Vec<u8>) -> PathBuf {
    let n = pcm.len() as u32;
    let mut b = b"RIFF".to_vec();
    b.extend((36 + n).to_le_bytes());
    b.extend(b"WAVEfmt ");
    // PCM, mono, 16 kHz, 32000 B/s, 2-byte frames, 16 bits.
    for (v, bytes) in [
        (16u32, 4),
        (1, 2),
        (1, 2),
        (16000, 4),
        (32000, 4),
        (2, 2),
        (16, 2),
    ] {
        b.extend(&v.to_le_bytes()[..bytes]);
    }
    b.extend(b"data");
    b.extend(n.to_le_bytes());
    b.extend(pcm);
    let p = scratch(name);
    std::fs::write(&p, b).unwrap();
    p
}

fn transcribe_vad(file: &Path, vad: &str) -> serde_json::Value {
    let out = kiln(&[
        "transcribe",
        file.to_str().unwrap(),
        "--format",
        "json",
        "--vad",
        vad,
        "-t",
        "2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Silence and noise transcribe as nothing (5 s of digital silence was " you"), by the VAD
/// that runs by default; a 30 s window without speech is skipped, not decoded.
#[test]
fn silence_and_noise_transcribe_as_nothing() {
    fetch();
    let silence = jfk_with_silence("silence-5s.wav", 5.0, None);
    // The same header, samples cut to the 5 s of silence.
    let mut b = std::fs::read(&silence).unwrap();
    b.truncate(44 + 5 * 16000 * 2);
    b[4..8].copy_from_slice(&(36 + 5 * 32000u32).to_le_bytes());
    b[40..44].copy_from_slice(&(5 * 32000u32).to_le_bytes());
    std::fs::write(&silence, &b).unwrap();
    let noise = scratch("noise-5s.wav");
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for s in b[44..].chunks_exact_mut(2) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.copy_from_slice(&(((x >> 48) as i16) / 10).to_le_bytes());
    }
    std::fs::write(&noise, &b).unwrap();
    for f in [&silence, &noise] {
        let out = kiln(&["transcribe", f.to_str().unwrap(), "-t", "2"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout).trim(), "", "{}", f.display());
    }
    // 35 s of silence, then jfk: the first window is skipped, the second holds jfk.
    let late = jfk_with_silence("late.wav", 35.0, None);
    let v = transcribe_vad(&late, "auto");
    assert_eq!(v["stats"]["windows"], 1, "{}", v["stats"]);
    let segs = v["segments"].as_array().unwrap();
    assert!(segs[0]["start"].as_f64().unwrap() >= 30.0, "{v}");
    assert!(words(v["text"].as_str().unwrap()).contains(PHRASE), "{v}");
}

const PHRASE: &str = "ask not what your country can do for you";

/// `--vad on` transcribes the speech alone, and the times are the audio's: 5 s of silence,
/// then jfk with 6 s of silence inserted at its pause after "fellow Americans" (2.8 s).
#[test]
fn vad_on_keeps_the_audio_times() {
    fetch();
    let f = jfk_with_silence("split-jfk.wav", 5.0, Some((2.8, 6.0)));
    let on = transcribe_vad(&f, "on");
    let s = &on["stats"];
    let (audio, speech) = (
        s["audio_s"].as_f64().unwrap(),
        s["speech_s"].as_f64().unwrap(),
    );
    assert!(audio > 21.9 && speech < audio - 8.0, "{s}");
    let t = words(on["text"].as_str().unwrap());
    assert!(t.contains("fellow americans") && t.contains(PHRASE), "{t}");
    let segs = on["segments"].as_array().unwrap();
    let time = |i: usize, k: &str| segs[i][k].as_f64().unwrap();
    // The first word after the lead silence (less the VAD's 0.4 s of padding); "for you",
    // 7.6 s into jfk, after the inserted silence: 5 + 6 + 7.6 s into the audio (8.5 s into
    // the speech alone); the last segment ends by the audio's end; segments in order.
    assert!((4.5..6.0).contains(&time(0, "start")), "{on}");
    let for_you = segs
        .iter()
        .position(|x| words(x["text"].as_str().unwrap()).ends_with("for you"))
        .expect("a segment ending \"for you\"");
    assert!((17.5..19.5).contains(&time(for_you, "end")), "{on}");
    let last = segs.len() - 1;
    assert!((audio - 2.0..=audio).contains(&time(last, "end")), "{on}");
    for i in 1..segs.len() {
        assert!(time(i, "start") >= time(i - 1, "end") - 0.01, "{on}");
    }
}

/// `--live`: raw PCM on stdin (silence, jfk.wav, a pause, jfk.wav again, silence) comes out
/// as utterances when their speaker goes quiet, partial transcripts before each; the words
/// of the finals are the speech's (word error rate at most 10%), twice, at the times it was
/// spoken. A WAV header on the
/// stream is read and skipped; a WAV of another rate is one clear line.
#[test]
fn live_transcription_from_a_pipe() {
    fetch();
    kiln_assets::resolve("silero-vad", &mut |_| {}).unwrap();
    let jfk = kiln_audio::load_16k(Path::new(JFK)).unwrap().samples;
    let mut audio = vec![0f32; 8000];
    audio.extend_from_slice(&jfk);
    audio.extend(std::iter::repeat_n(0f32, 24000));
    let second = audio.len() as f64 / 16000.0;
    audio.extend_from_slice(&jfk);
    audio.extend(std::iter::repeat_n(0f32, 16000));
    let pcm: Vec<u8> = audio
        .iter()
        .flat_map(|&s| ((s * 32767.0).round() as i16).to_le_bytes())
        .collect();
    let run = |bytes: Vec<u8>| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["transcribe", "--live", "-", "--format", "json"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        std::thread::spawn(move || {
            for piece in bytes.chunks(3200) {
                if stdin.write_all(piece).is_err() {
                    break;
                }
            }
        });
        child.wait_with_output().unwrap()
    };
    let out = run(pcm.clone());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let finals: Vec<&serde_json::Value> = events.iter().filter(|e| e["type"] == "final").collect();
    let first_final = events.iter().position(|e| e["type"] == "final").unwrap();
    assert!(
        events[..first_final].iter().any(|e| e["type"] == "partial"),
        "no partial before the first final: {events:?}"
    );
    let words = |s: &str| {
        s.to_lowercase()
            .chars()
            .map(|c| if c.is_alphanumeric() { c } else { ' ' })
            .collect::<String>()
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let said: Vec<String> = finals
        .iter()
        .flat_map(|f| words(f["text"].as_str().unwrap()))
        .collect();
    let once = words("and so my fellow americans ask not what your country can do for you ask what you can do for your country");
    let twice: Vec<String> = once.iter().chain(&once).cloned().collect();
    // Word errors at most 10% (tiny.en hears "and so my" alone as "and so am I").
    let mut prev: Vec<usize> = (0..=twice.len()).collect();
    for (i, x) in said.iter().enumerate() {
        let mut cur = vec![i + 1; twice.len() + 1];
        for (j, y) in twice.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(x != y))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    let errors = prev[twice.len()];
    assert!(
        errors * 10 <= twice.len(),
        "{errors} word errors: {said:?}\n{events:?}"
    );
    let mut last_end = 0.0;
    for f in &finals {
        let (s, e) = (f["start"].as_f64().unwrap(), f["end"].as_f64().unwrap());
        assert!(s >= last_end - 1e-9 && e > s, "{f}");
        last_end = e;
    }
    let start0 = finals[0]["start"].as_f64().unwrap();
    assert!(
        (0.1..=0.6).contains(&start0),
        "speech starts at 0.5 s: {start0}"
    );
    assert!(
        finals
            .iter()
            .any(|f| (f["start"].as_f64().unwrap() - second).abs() < 0.6),
        "no utterance starting near {second:.1} s: {finals:?}"
    );

    // The same stream behind a WAV header: the same finals.
    let mut wav = Vec::new();
    wav.extend_from_slice(b"RIFF");
    wav.extend_from_slice(&(36 + pcm.len() as u32).to_le_bytes());
    wav.extend_from_slice(b"WAVEfmt ");
    wav.extend_from_slice(&16u32.to_le_bytes());
    wav.extend_from_slice(&1u16.to_le_bytes());
    wav.extend_from_slice(&1u16.to_le_bytes());
    wav.extend_from_slice(&16000u32.to_le_bytes());
    wav.extend_from_slice(&32000u32.to_le_bytes());
    wav.extend_from_slice(&2u16.to_le_bytes());
    wav.extend_from_slice(&16u16.to_le_bytes());
    wav.extend_from_slice(b"data");
    wav.extend_from_slice(&(pcm.len() as u32).to_le_bytes());
    let head = wav.clone();
    wav.extend_from_slice(&pcm);
    let out2 = run(wav);
    assert!(out2.status.success(), "{}", text(&out2.stderr));
    let finals2: Vec<String> = text(&out2.stdout)
        .lines()
        .filter(|l| l.contains("\"final\""))
        .map(str::to_string)
        .collect();
    let finals1: Vec<String> = text(&out.stdout)
        .lines()
        .filter(|l| l.contains("\"final\""))
        .map(str::to_string)
        .collect();
    assert_eq!(finals2, finals1);
    // 8 kHz: refused, naming what it takes.
    let mut bad = head;
    bad[24..28].copy_from_slice(&8000u32.to_le_bytes());
    assert_clean_error(&run(bad), "16 kHz mono 16-bit");
}

/// A 16 kHz mono WAV of `samples` in the test's scratch folder.
fn write_wav16(name: &str, samples: &[f32]) -> PathBuf {
    let pcm = samples
        .iter()
        .flat_map(|&s| ((s.clamp(-1.0, 1.0) * 32767.0).round() as i16).to_le_bytes())
        .collect();
    wav16(name, pcm)
}

/// Word errors (substitutions, insertions, deletions) of `hyp` against `reference`.
fn word_errors(reference: &[String], hyp: &[String]) -> usize {
    let mut d: Vec<usize> = (0..=hyp.len()).collect();
    for (i, r) in reference.iter().enumerate() {
        let mut diag = d[0];
        d[0] = i + 1;
        for (j, h) in hyp.iter().enumerate() {
            let sub = diag + usize::from(r != h);
            diag = d[j + 1];
            d[j + 1] = sub.min(d[j + 1] + 1).min(d[j] + 1);
        }
    }
    d[hyp.len()]
}

/// Words as they are compared: lowercase, punctuation and apostrophes as spaces, "mr" as
/// the transcripts spell it.
fn wer_words(s: &str) -> Vec<String> {
    words(&s.replace(['’', '\''], ""))
        .split(' ')
        .filter(|w| !w.is_empty())
        .map(|w| {
            if w == "mr" {
                "mister".into()
            } else {
                w.to_string()
            }
        })
        .collect()
}

/// The lines of a sonnet's XHTML page (`<span id="fNNN">`), its title a number.
fn sonnet_text(xhtml: &str) -> String {
    let mut lines: Vec<String> = xhtml
        .split("<span id=\"f")
        .skip(1)
        .filter_map(|s| Some(s.split_once('>')?.1.split_once("</span>")?.0.to_string()))
        .collect();
    let title = match lines[0].as_str() {
        "II" => "2",
        "III" => "3",
        t => t,
    };
    lines[0] = title.into();
    lines.join(" ")
}

/// The held-out check of the VAD: public-domain LibriVox readings (five Sense and
/// Sensibility clips and three sonnets, registry packages' test data) with their
/// transcripts, as they are and with pauses of 2.5-12 s of faint noise put between
/// sentences and lines; word errors with `--vad on` are no more than without (`auto`, the
/// default, runs the VAD only to skip windows without speech: none here).
#[test]
fn vad_does_not_raise_word_errors_on_librivox_readings() {
    fetch();
    let sense = kiln_assets::test_data("librivox-sense-and-sensibility").unwrap();
    let sonnets = kiln_assets::test_data("librivox-sonnets").unwrap();
    let read = |p: &Path| std::fs::read_to_string(p).unwrap();
    let samples = |p: &Path| {
        let d = kiln_audio::decode_file(p).unwrap();
        assert_eq!((d.rate, d.channels), (16000, 1), "{}", p.display());
        d.samples
    };
    // Faint noise (about -60 dBFS), as a room between sentences.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut pause = |secs: f32| -> Vec<f32> {
        (0..(secs * 16000.0) as usize)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.003
            })
            .collect()
    };
    let mut cases: Vec<(PathBuf, String)> = Vec::new();
    let (mut joined, mut joined_text) = (Vec::new(), Vec::new());
    for (id, gap) in [
        ("0870", 3.0),
        ("0880", 6.0),
        ("0890", 2.5),
        ("0920", 9.0),
        ("0930", 0.0),
    ] {
        let (wav, txt) = (
            sense.join(format!("{id}.wav")),
            read(&sense.join(format!("{id}.txt"))),
        );
        joined.extend(samples(&wav));
        joined.extend(pause(gap));
        joined_text.push(txt.clone());
        cases.push((wav, txt));
    }
    cases.push((
        write_wav16("sense-pauses.wav", &joined),
        joined_text.join(" "),
    ));
    let sonnet1 = read(&sonnets.join("sonnet1.txt"))
        .lines()
        .collect::<Vec<_>>()
        .join(" ");
    cases.push((sonnets.join("sonnet1.wav"), sonnet1.clone()));
    // Sonnet 1 cut at its line times, with pauses after four of its lines.
    let audio = samples(&sonnets.join("sonnet1.wav"));
    let mut cut = Vec::new();
    for (i, line) in read(&sonnets.join("sonnet1.csv")).lines().enumerate() {
        let f: Vec<&str> = line.splitn(4, ',').collect();
        let at = |s: &str| ((s.parse::<f32>().unwrap() * 16000.0) as usize).min(audio.len());
        cut.extend(&audio[at(f[1])..at(f[2])]);
        if let Some(k) = [1, 5, 9, 12].iter().position(|&l| l == i) {
            cut.extend(pause([4.0, 7.0, 3.0, 12.0][k]));
        }
    }
    cases.push((write_wav16("sonnet1-pauses.wav", &cut), sonnet1));
    for n in [2, 3] {
        let text = sonnet_text(&read(&sonnets.join(format!("sonnet{n}.xhtml"))));
        cases.push((sonnets.join(format!("sonnet{n}.mp3")), text));
    }

    let mut totals = [0usize; 2];
    let mut reference_words = 0;
    for (file, reference) in &cases {
        let reference = wer_words(reference);
        reference_words += reference.len();
        let mut row = Vec::new();
        for (k, vad) in ["off", "on"].iter().enumerate() {
            let v = transcribe_vad(file, vad);
            let e = word_errors(&reference, &wer_words(v["text"].as_str().unwrap()));
            totals[k] += e;
            row.push(e);
        }
        let name = file.file_name().unwrap().to_string_lossy();
        eprintln!(
            "{name:<22} {:>4} words, errors off/on {row:?}",
            reference.len()
        );
    }
    let wer = |e: usize| 100.0 * e as f64 / reference_words as f64;
    eprintln!(
        "WER off {:.2}% | on {:.2}% ({reference_words} words)",
        wer(totals[0]),
        wer(totals[1])
    );
    assert!(reference_words > 550, "{reference_words} words");
    assert!(
        wer(totals[0]) < 12.0,
        "WER without the VAD {:.2}%",
        wer(totals[0])
    );
    assert!(
        totals[1] <= totals[0],
        "--vad on: {totals:?} errors (off, on)"
    );
}
