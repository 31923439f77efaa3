//! `kiln speak` as a user runs it: a WAV file of the right shape from phonemes and from text,
//! and one clear line for bad input.

use std::process::{Command, Output};

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

/// `kiln ARGS`, which must succeed.
fn kiln_ok(args: &[&str]) -> Output {
    let out = kiln(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-speak-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

#[test]
fn speaks_phonemes_and_text_to_wav() {
    kiln_assets::resolve("kokoro-82m", &mut |_| {}).unwrap();
    kiln_assets::resolve("misaki-en-us", &mut |_| {}).unwrap();
    let wav = scratch("a.wav");
    let out = kiln(&[
        "speak",
        "--phonemes",
        "həlˈO wˈɜɹld.",
        "-o",
        wav.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("real-time factor"), "{err}");
    let b = std::fs::read(&wav).unwrap();
    assert_eq!(&b[..4], b"RIFF");
    assert_eq!(&b[8..16], b"WAVEfmt ");
    assert_eq!(u32::from_le_bytes(b[24..28].try_into().unwrap()), 24000);
    let data = u32::from_le_bytes(b[40..44].try_into().unwrap()) as usize;
    assert_eq!(data, b.len() - 44, "data chunk length patched");
    // Kokoro makes 600 samples per frame; a short phrase is well under 3 s and not silent.
    let samples: Vec<i16> = b[44..]
        .chunks_exact(2)
        .map(|c| i16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert!(
        samples.len() % 600 == 0 && samples.len() > 12_000 && samples.len() < 72_000,
        "{}",
        samples.len()
    );
    assert!(
        samples.iter().any(|&s| s.unsigned_abs() > 1000),
        "silent output"
    );

    // Text through normalisation and the lexicons: two sentences, two chunks, raw PCM.
    let pcm = scratch("b.pcm");
    let out = kiln(&[
        "speak",
        "It is 5 o'clock. Hello world!",
        "--raw",
        "-o",
        pcm.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("in 2 chunk(s)"), "{err}");
    assert!(std::fs::metadata(&pcm).unwrap().len() > 48_000);
}

/// All 54 of Kokoro's voices are there (af_heart, the default, was refused), listed with
/// their language.
#[test]
fn every_voice_is_listed_and_speaks() {
    kiln_assets::resolve("kokoro-82m", &mut |_| {}).unwrap();
    let out = kiln_ok(&["speak", "--list-voices"]);
    let list = String::from_utf8_lossy(&out.stdout);
    assert_eq!(list.lines().count(), 54, "{list}");
    for (v, what) in [
        ("af_heart", "American English, female"),
        ("bm_george", "British English, male"),
        ("zf_xiaoxiao", "Mandarin Chinese, female"),
        ("jf_alpha", "Japanese, female"),
    ] {
        assert!(
            list.lines().any(|l| l.starts_with(v) && l.ends_with(what)),
            "{v}: {list}"
        );
    }
    let o = scratch("bella.wav");
    kiln_ok(&[
        "speak",
        "Hello.",
        "--voice",
        "af_bella",
        "-o",
        o.to_str().unwrap(),
    ]);
    assert!(std::fs::metadata(&o).unwrap().len() > 10_000);
}

/// `-o NAME.flac` writes FLAC: the WAV's samples, losslessly, in fewer bytes.
#[test]
fn flac_output_holds_the_wav_samples() {
    kiln_assets::resolve("kokoro-82m", &mut |_| {}).unwrap();
    let (wav, flac) = (scratch("same.wav"), scratch("same.flac"));
    for o in [&wav, &flac] {
        kiln_ok(&[
            "speak",
            "--phonemes",
            "həlˈO wˈɜɹld.",
            "-o",
            o.to_str().unwrap(),
        ]);
    }
    let w = kiln_audio::decode_file(&wav).unwrap();
    let f = kiln_audio::decode_file(&flac).unwrap();
    assert_eq!(&std::fs::read(&flac).unwrap()[..4], b"fLaC");
    assert_eq!((f.rate, f.channels), (24000, 1));
    assert_eq!(f.samples, w.samples);
    assert!(std::fs::metadata(&flac).unwrap().len() < std::fs::metadata(&wav).unwrap().len());
}

/// `-o NAME.opus` writes Ogg Opus that libopus (libsndfile's, through Python's `soundfile`)
/// and kiln's own reader decode to the WAV's length and level, in a small part of its bytes.
#[test]
fn opus_output_decodes_to_the_wav_audio() {
    kiln_assets::resolve("kokoro-82m", &mut |_| {}).unwrap();
    kiln_assets::convert::python_module("soundfile", "soundfile").unwrap();
    let (wav, opus) = (scratch("opus-ref.wav"), scratch("opus-ref.opus"));
    for o in [&wav, &opus] {
        kiln_ok(&[
            "speak",
            "Hello there. The meeting is at three thirty.",
            "-o",
            o.to_str().unwrap(),
        ]);
    }
    let w = kiln_audio::decode_file(&wav).unwrap();
    assert_eq!(&std::fs::read(&opus).unwrap()[..4], b"OggS");
    let rms = |s: &[f32]| (s.iter().map(|v| v * v).sum::<f32>() / s.len() as f32).sqrt();
    // kiln's reader decodes at Opus's 48 kHz: twice the samples.
    let o = kiln_audio::decode_file(&opus).unwrap();
    assert_eq!((o.rate, o.channels), (48000, 1));
    assert_eq!(o.samples.len(), 2 * w.samples.len());
    let db = 20.0 * (rms(&o.samples) / rms(&w.samples)).log10();
    assert!(db.abs() < 0.5, "level {db:.2} dB off");
    // libopus, at the file's own 24 kHz.
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, soundfile as sf; d, r = sf.read(sys.argv[1], dtype='float32'); \
             print(r, len(d), float((d ** 2).mean() ** 0.5))",
            opus.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = String::from_utf8_lossy(&out.stdout);
    let f: Vec<f64> = got.split_whitespace().map(|v| v.parse().unwrap()).collect();
    assert_eq!((f[0], f[1]), (24000.0, w.samples.len() as f64), "{got}");
    let db = 20.0 * (f[2] / rms(&w.samples) as f64).log10();
    assert!(db.abs() < 0.5, "libopus: level {db:.2} dB off");
    let (ob, wb) = (
        std::fs::metadata(&opus).unwrap().len(),
        std::fs::metadata(&wav).unwrap().len(),
    );
    assert!(ob * 5 < wb, "{ob} bytes against the WAV's {wb}");
}

#[test]
fn bad_input_is_one_line() {
    kiln_assets::resolve("kokoro-82m", &mut |_| {}).unwrap();
    let o = scratch("c.wav");
    // A file already there survives every failed run (it was truncated to an empty WAV).
    std::fs::write(&o, b"an earlier take").unwrap();
    let o = o.to_str().unwrap();
    for (args, needle) in [
        (
            vec!["speak", "--phonemes", "hi", "--voice", "nobody", "-o", o],
            "unknown voice 'nobody'",
        ),
        (
            vec!["speak", "--phonemes", "hi", "--speed", "0", "-o", o],
            "--speed",
        ),
        (
            vec!["speak", "--phonemes", "həlˈO 中", "-o", o],
            "not in Kokoro's vocabulary",
        ),
        (vec!["speak", "--phonemes", "  ", "-o", o], "nothing to say"),
    ] {
        let out = kiln(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(needle), "expected '{needle}' in: {err}");
        assert_eq!(std::fs::read(o).unwrap(), b"an earlier take", "{args:?}");
    }
    let names: Vec<_> = std::fs::read_dir(std::path::Path::new(o).parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains("c.wav"))
        .collect();
    assert_eq!(names, ["c.wav"], "no partial file left beside it");
}

/// Audio is not written to a terminal (it was: RIFF bytes on the screen); a pipe gets it.
#[test]
fn audio_is_not_written_to_a_terminal() {
    kiln_assets::resolve("kokoro-82m", &mut |_| {}).unwrap();
    let bin = env!("CARGO_BIN_EXE_kiln");
    // A pseudo-terminal as stdout, from Python's standard library.
    let script = "import os, subprocess, sys\n\
                  m, s = os.openpty()\n\
                  p = subprocess.run(sys.argv[1:], stdout=s, stderr=subprocess.PIPE)\n\
                  os.close(s)\n\
                  sys.stderr.write(p.stderr.decode())\n\
                  sys.exit(p.returncode)";
    let out = Command::new("python3")
        .args(["-c", script, bin, "speak", "--phonemes", "hˈI"])
        .output()
        .expect("run python3");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("not writing audio to a terminal"), "{err}");
    let piped = kiln(&["speak", "--phonemes", "hˈI"]);
    assert!(piped.status.success());
    assert_eq!(&piped.stdout[..4], b"RIFF");
}
