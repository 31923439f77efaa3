//! Silero VAD against ONNX Runtime running the package's own ONNX export
//! (`tools/silero_vad_reference.py`): the same probability for every 32 ms of jfk.wav and of
//! a file of silence, noise and speech; silence and noise hold no speech region.

use std::path::{Path, PathBuf};

use kiln_models::vad::{speech_regions, SileroVad, VadOptions};

const JFK: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/assets/audio/jfk.wav"
);

fn out_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("vad");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn vad() -> SileroVad {
    SileroVad::load(&kiln_assets::resolve("silero-vad", &mut |_| {}).unwrap()).unwrap()
}

fn samples(wav: &Path) -> Vec<f32> {
    kiln_audio::load_16k(wav).unwrap().samples
}

fn reference(wav: &Path) -> Vec<f32> {
    let p = kiln_assets::convert::silero_vad_reference(&out_dir(), wav).unwrap();
    kiln_formats::read_npy(&p).unwrap().data
}

/// 16 kHz mono 16-bit WAV.
fn write_wav(path: &Path, x: &[f32]) {
    let n = (x.len() * 2) as u32;
    let mut b = b"RIFF".to_vec();
    b.extend((36 + n).to_le_bytes());
    b.extend(b"WAVEfmt ");
    b.extend(16u32.to_le_bytes());
    b.extend(1u16.to_le_bytes());
    b.extend(1u16.to_le_bytes());
    b.extend(16000u32.to_le_bytes());
    b.extend(32000u32.to_le_bytes());
    b.extend(2u16.to_le_bytes());
    b.extend(16u16.to_le_bytes());
    b.extend(b"data");
    b.extend(n.to_le_bytes());
    for &s in x {
        b.extend(((s.clamp(-1.0, 1.0) * 32767.0).round() as i16).to_le_bytes());
    }
    std::fs::write(path, b).unwrap();
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn jfk_probabilities_match_onnx_runtime() {
    let wav = Path::new(JFK);
    let (ours, theirs) = (vad().probs(&samples(wav)), reference(wav));
    let d = max_diff(&ours, &theirs);
    assert!(d < 1e-4, "max |kiln - ORT| = {d}");
    // jfk.wav is mostly speech, with pauses between the phrases.
    let r = speech_regions(&ours, samples(wav).len(), &VadOptions::default());
    assert!(r.len() >= 2, "{r:?}");
    assert!(r[0].0 < 16000, "{r:?}");
}

/// 2 s of digital silence, jfk, 3 s of white noise, 1 s of silence: speech only where jfk
/// is; a file of silence and noise alone has none.
#[test]
fn silence_and_noise_hold_no_speech() {
    let jfk = samples(Path::new(JFK));
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut noise = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
            })
            .collect()
    };
    let mut mixed = vec![0.0; 32000];
    mixed.extend(&jfk);
    mixed.extend(noise(48000));
    mixed.extend(vec![0.0; 16000]);
    let quiet: Vec<f32> = [vec![0.0; 40000], noise(40000)].concat();
    let v = vad();
    for (name, audio) in [("mixed", &mixed), ("quiet", &quiet)] {
        let wav = out_dir().join(format!("{name}.wav"));
        write_wav(&wav, audio);
        let ours = v.probs(&samples(&wav));
        let d = max_diff(&ours, &reference(&wav));
        assert!(d < 1e-4, "{name}: max |kiln - ORT| = {d}");
        let r = speech_regions(&ours, audio.len(), &VadOptions::transcription());
        if name == "quiet" {
            assert!(r.is_empty(), "{r:?}");
        } else {
            // One region (pauses under 2 s merge), around jfk's 11 s, padded by 0.4 s.
            assert_eq!(r.len(), 1, "{r:?}");
            let (s, e) = r[0];
            assert!((32000 - 6400..32000 + 16000).contains(&s), "{r:?}");
            let end = 32000 + jfk.len();
            // (The onset of the noise may hold the region open a few steps.)
            assert!((end - 16000..end + 6400 + 8000).contains(&e), "{r:?}");
        }
    }
}
