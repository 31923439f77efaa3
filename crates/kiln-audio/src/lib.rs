//! Audio in, for speech models: any file symphonia decodes (WAV PCM 8/16/24/32-bit and float,
//! FLAC, MP3, Ogg Vorbis or Opus) or raw s16le PCM, mixed down to mono and resampled to 16 kHz; then
//! Whisper's log-mel spectrogram.

mod decode;
pub mod encode;
pub mod flac;
pub mod mel;
pub mod opus;
pub mod resample;

use std::path::{Path, PathBuf};
use thiserror::Error;

pub use decode::{decode_bytes, decode_file, is_container, Decoded};
pub use mel::{log_mel_spectrogram, mel_filters, MelSpectrogram};
pub use resample::resample;

/// The rate every speech model here consumes.
pub const SAMPLE_RATE: u32 = 16_000;

#[derive(Debug, Error)]
pub enum AudioError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: file is empty", path.display())]
    Empty { path: PathBuf },
    #[error("{}: not a supported audio file (WAV, FLAC, MP3, Ogg Vorbis or Opus): {why}", path.display())]
    NotAudio { path: PathBuf, why: String },
    #[error("{}: corrupt audio: {why}", path.display())]
    Corrupt { path: PathBuf, why: String },
    #[error("{}: no audio samples", path.display())]
    NoSamples { path: PathBuf },
    #[error("{}: raw PCM s16le needs an even number of bytes, got {len}", path.display())]
    OddPcm { path: PathBuf, len: usize },
    #[error("{what}")]
    Invalid { what: String },
}

/// Mono samples at `rate` Hz, in [-1, 1].
#[derive(Debug, Clone)]
pub struct Audio {
    pub samples: Vec<f32>,
    pub rate: u32,
}

impl Audio {
    pub fn duration_s(&self) -> f64 {
        self.samples.len() as f64 / self.rate as f64
    }
}

/// A file (or `-` for stdin: a WAV, FLAC, OGG or MP3 stream, else raw s16le 16 kHz mono
/// PCM) as 16 kHz mono.
pub fn load_16k(path: &Path) -> Result<Audio, AudioError> {
    if path.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut buf).map_err(|source| {
            AudioError::Io {
                path: path.into(),
                source,
            }
        })?;
        // A container piped in (`cat a.flac | kiln transcribe -`) is decoded as a file is;
        // anything else is the raw PCM the argument documents.
        if is_container(&buf) {
            return to_16k_mono(decode_bytes(buf, None, path)?);
        }
        let samples = pcm_s16le(&buf, path)?;
        return Ok(Audio {
            samples,
            rate: SAMPLE_RATE,
        });
    }
    let d = decode_file(path)?;
    to_16k_mono(d)
}

/// Mixes `d` down to mono (channel mean) and resamples it to 16 kHz.
pub fn to_16k_mono(d: Decoded) -> Result<Audio, AudioError> {
    let mono = d.mono();
    let samples = resample(&mono, d.rate, SAMPLE_RATE)?;
    Ok(Audio {
        samples,
        rate: SAMPLE_RATE,
    })
}

/// Raw little-endian signed 16-bit PCM (mono) to f32 in [-1, 1).
pub fn pcm_s16le(bytes: &[u8], path: &Path) -> Result<Vec<f32>, AudioError> {
    if bytes.is_empty() {
        return Err(AudioError::Empty { path: path.into() });
    }
    if bytes.len() % 2 != 0 {
        return Err(AudioError::OddPcm {
            path: path.into(),
            len: bytes.len(),
        });
    }
    Ok(bytes
        .chunks_exact(2)
        .map(|c| i16::from_le_bytes([c[0], c[1]]) as f32 / 32768.0)
        .collect())
}
