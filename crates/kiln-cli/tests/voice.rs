//! `kiln voice` as a user runs it: jfk.wav in, a reply WAV out, the transcript, the reply
//! and the four stage latencies printed; bad input is one line and a failure exit.

use std::process::{Command, Output};

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

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-voice-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// The number after `label ` and before ` ms` in `line`.
fn ms(text: &str, label: &str) -> f64 {
    let at = text
        .find(&format!("{label} "))
        .unwrap_or_else(|| panic!("no '{label}' in {text}"));
    let rest = &text[at + label.len() + 1..];
    let num = rest.split(" ms").next().unwrap();
    num.parse()
        .unwrap_or_else(|_| panic!("'{label}' is not followed by 'N ms' in {text}"))
}

#[test]
fn voice_turn_on_jfk() {
    for m in [
        "smollm2-135m-instruct",
        "whisper-tiny.en",
        "kokoro-82m",
        "misaki-en-us",
    ] {
        kiln_assets::resolve(m, &mut |_| {}).unwrap();
    }
    let wav = scratch("reply.wav");
    let out = kiln(&["voice", JFK, "-o", wav.to_str().unwrap(), "-n", "40"]);
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{so}\n{se}");
    let transcript = so
        .lines()
        .find_map(|l| l.strip_prefix("transcript: "))
        .unwrap_or_else(|| panic!("no transcript line: {so}"));
    assert!(
        transcript
            .to_lowercase()
            .contains("ask not what your country can do for you"),
        "{transcript}"
    );
    let reply = so
        .lines()
        .find_map(|l| l.strip_prefix("reply: "))
        .unwrap_or_else(|| panic!("no reply line: {so}"));
    assert!(reply.chars().any(char::is_alphabetic), "empty reply: {so}");

    // The stages happen in order: STT, first token, first audio, the end; the reply starts
    // with at most 50 ms of silence.
    let (stt, ttft, first, sound, total) = (
        ms(&se, "STT"),
        ms(&se, "TTFT"),
        ms(&se, "first audio"),
        ms(&se, "first sound"),
        ms(&se, "total"),
    );
    assert!(
        0.0 < stt && stt <= ttft && ttft <= first && first <= total,
        "{se}"
    );
    assert!(first <= sound && sound <= first + 51.0, "{se}");

    let b = std::fs::read(&wav).unwrap();
    assert_eq!(&b[..4], b"RIFF");
    assert_eq!(u32::from_le_bytes(b[24..28].try_into().unwrap()), 24000);
    let data = u32::from_le_bytes(b[40..44].try_into().unwrap()) as usize;
    assert_eq!(data, b.len() - 44, "data chunk length patched");
    let secs = data as f64 / 48000.0;
    assert!(secs > 0.5 && secs < 60.0, "{secs} s of reply");
    let loud = b[44..]
        .chunks_exact(2)
        .filter(|c| i16::from_le_bytes([c[0], c[1]]).unsigned_abs() > 1000)
        .count();
    assert!(loud > 1000, "a near-silent reply ({loud} loud samples)");
}

#[test]
fn voice_bad_input_is_one_line() {
    let not_audio = scratch("notes.txt");
    std::fs::write(&not_audio, "not audio").unwrap();
    // 3 s of digital silence: the VAD hears no speech, so nothing is answered (Whisper
    // alone heard " you" in it and the assistant replied).
    let silence = scratch("silence.wav");
    let n = 3 * 32000u32;
    let mut wav = b"RIFF".to_vec();
    wav.extend((36 + n).to_le_bytes());
    wav.extend(b"WAVEfmt \x10\0\0\0\x01\0\x01\0\x80\x3e\0\0\0\x7d\0\0\x02\0\x10\0data");
    wav.extend(n.to_le_bytes());
    wav.resize(44 + n as usize, 0);
    std::fs::write(&silence, wav).unwrap();
    let o = scratch("x.wav");
    // A file already there survives every failed run.
    std::fs::write(&o, b"an earlier reply").unwrap();
    for (args, needle) in [
        (
            vec![
                "voice",
                not_audio.to_str().unwrap(),
                "-o",
                o.to_str().unwrap(),
            ],
            "not a supported audio file",
        ),
        (
            vec!["voice", JFK, "--speed", "0", "-o", o.to_str().unwrap()],
            "--speed 0 must be in (0, 4]",
        ),
        (
            vec!["voice", "/no/such.wav", "-o", o.to_str().unwrap()],
            "/no/such.wav",
        ),
        (
            vec!["voice", JFK, "--voice", "nobody", "-o", o.to_str().unwrap()],
            "unknown voice 'nobody'",
        ),
        (
            vec![
                "voice",
                silence.to_str().unwrap(),
                "-o",
                o.to_str().unwrap(),
            ],
            "no speech",
        ),
    ] {
        let out = kiln(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.starts_with("kiln: error:") && err.contains(needle),
            "{err}"
        );
        assert_eq!(std::fs::read(&o).unwrap(), b"an earlier reply", "{args:?}");
    }
}

/// `--live`: a stream on stdin (silence, jfk.wav, silence, then jfk.wav again) is answered
/// turn by turn once the speaker has been quiet for --end-silence-ms; the replies' audio
/// goes to stdout as raw PCM, the dialogue and each turn's latency from the end of speech
/// to stderr.
#[test]
fn voice_live_answers_each_turn_of_a_stream() {
    use std::io::Write;
    use std::process::Stdio;
    for m in [
        "smollm2-135m-instruct",
        "whisper-tiny.en",
        "kokoro-82m",
        "misaki-en-us",
        "silero-vad",
    ] {
        kiln_assets::resolve(m, &mut |_| {}).unwrap();
    }
    let jfk = kiln_audio::load_16k(std::path::Path::new(JFK))
        .unwrap()
        .samples;
    let mut audio = vec![0f32; 8000];
    audio.extend_from_slice(&jfk);
    audio.extend(std::iter::repeat_n(0f32, 40000));
    audio.extend_from_slice(&jfk);
    audio.extend(std::iter::repeat_n(0f32, 40000));
    let pcm: Vec<u8> = audio
        .iter()
        .flat_map(|&s| ((s * 32767.0).round() as i16).to_le_bytes())
        .collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["voice", "--live", "-", "-o", "-", "-n", "24"])
        .args(["--end-silence-ms", "1600"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    std::thread::spawn(move || {
        for piece in pcm.chunks(3200) {
            if stdin.write_all(piece).is_err() {
                break;
            }
        }
    });
    let out = child.wait_with_output().unwrap();
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{se}");
    let heard: Vec<&str> = se.lines().filter_map(|l| l.strip_prefix("you: ")).collect();
    assert_eq!(heard.len(), 2, "{se}");
    for h in &heard {
        assert!(
            h.to_lowercase()
                .contains("what you can do for your country"),
            "{se}"
        );
    }
    assert_eq!(
        se.lines().filter(|l| l.starts_with("kiln: ")).count(),
        2,
        "{se}"
    );
    assert_eq!(
        se.lines()
            .filter(|l| l.starts_with("first audio ") && l.contains("after the end of speech"))
            .count(),
        2,
        "{se}"
    );
    assert!(se.contains("2 turn(s) answered"), "{se}");
    // Two spoken replies, 24 kHz 16-bit: more than a second of audio.
    assert!(
        out.stdout.len() > 48_000,
        "{} bytes of reply audio",
        out.stdout.len()
    );
    let loud = out
        .stdout
        .chunks_exact(2)
        .filter(|b| i16::from_le_bytes([b[0], b[1]]).unsigned_abs() > 1000)
        .count();
    assert!(loud > 1000, "silent replies");
}
