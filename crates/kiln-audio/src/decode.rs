//! Container + codec decoding through symphonia (Ogg Opus through `opus-pure`), to
//! interleaved f32.

use std::path::Path;

use symphonia::core::audio::{SampleBuffer, SignalSpec};
use symphonia::core::codecs::{DecoderOptions, CODEC_TYPE_NULL};
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::{FormatOptions, FormatReader};
use symphonia::core::io::{MediaSourceStream, MediaSourceStreamOptions};
use symphonia::default::formats::{FlacReader, MpaReader, OggReader, WavReader};

use crate::AudioError;

/// Interleaved samples of `channels` channels at `rate` Hz.
#[derive(Debug, Clone)]
pub struct Decoded {
    pub samples: Vec<f32>,
    pub channels: usize,
    pub rate: u32,
}

impl Decoded {
    /// The mean of the channels, frame by frame.
    pub fn mono(&self) -> Vec<f32> {
        if self.channels <= 1 {
            return self.samples.clone();
        }
        let inv = 1.0 / self.channels as f32;
        self.samples
            .chunks_exact(self.channels)
            .map(|f| f.iter().sum::<f32>() * inv)
            .collect()
    }
}

pub fn decode_file(path: &Path) -> Result<Decoded, AudioError> {
    let bytes = std::fs::read(path).map_err(|source| AudioError::Io {
        path: path.into(),
        source,
    })?;
    let ext = path.extension().and_then(|e| e.to_str());
    decode_bytes(bytes, ext, path)
}

/// Decodes a whole file held in memory; `path` only names it in errors, `ext` hints the format.
///
/// symphonia asserts some of what it reads from a file (a WAV with a sample rate of 0 makes a
/// zero time base, which panics); such a panic is caught here and reported as corrupt audio, so
/// no file can take the process down.
pub fn decode_bytes(bytes: Vec<u8>, ext: Option<&str>, path: &Path) -> Result<Decoded, AudioError> {
    let run = std::panic::AssertUnwindSafe(|| decode_inner(bytes, ext, path));
    std::panic::catch_unwind(run).unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "the decoder failed".into());
        Err(AudioError::Corrupt {
            path: path.into(),
            why,
        })
    })
}

/// Where the stream starts: after an ID3v2 tag, if any, at a WAV, FLAC, OGG or MPEG audio
/// header. symphonia's probe would otherwise scan the whole file for any format's marker and
/// start there, so a stray "fLaC" in junk would reach a reader kiln never meant to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    Wav,
    Flac,
    Ogg,
    Mpeg,
}

fn stream_start(b: &[u8]) -> Result<(usize, Container), String> {
    let mut pos = 0;
    if b.len() >= 10 && b.starts_with(b"ID3") {
        // Tag size: four 7-bit bytes, excluding the 10-byte header (and the footer, if flagged).
        let size = b[6..10]
            .iter()
            .fold(0usize, |a, &x| a << 7 | (x & 0x7f) as usize);
        let footer = if b[5] & 0x10 != 0 { 10 } else { 0 };
        pos = 10 + size + footer;
        if pos >= b.len() {
            return Err(format!("an ID3 tag of {pos} bytes and no audio after it"));
        }
    }
    let h = &b[pos..];
    let c = if h.starts_with(b"RIFF") {
        Container::Wav
    } else if h.starts_with(b"fLaC") {
        Container::Flac
    } else if h.starts_with(b"OggS") {
        Container::Ogg
    } else if h.len() >= 2 && h[0] == 0xff && h[1] & 0xe0 == 0xe0 {
        Container::Mpeg
    } else {
        let head = &h[..h.len().min(4)];
        return Err(format!(
            "no WAV, FLAC, OGG or MP3 header (starts with {head:02x?})"
        ));
    };
    Ok((pos, c))
}

/// Whether `b` starts with an audio container kiln decodes, judged strictly enough that raw
/// PCM is never taken for one: a WAV, FLAC or OGG magic, an ID3 tag, or MPEG audio whose
/// first frames chain (a header where the previous frame's length says the next one is).
/// A bare frame-sync pattern alone is common in PCM (a sample of -1 is `ff ff`).
pub fn is_container(b: &[u8]) -> bool {
    if [&b"RIFF"[..], b"fLaC", b"OggS", b"ID3"]
        .iter()
        .any(|m| b.starts_with(m))
    {
        return true;
    }
    let mut pos = 0;
    for _ in 0..3 {
        match b.get(pos..pos + 4).and_then(mpeg_frame_len) {
            Some(n) => pos += n,
            None => return false,
        }
    }
    true
}

/// The length in bytes of the MPEG audio frame whose 4-byte header is `h`; `None` when `h`
/// is not a valid header (reserved version, layer, rate, or a free/bad bitrate).
fn mpeg_frame_len(h: &[u8]) -> Option<usize> {
    if h[0] != 0xff || h[1] & 0xe0 != 0xe0 {
        return None;
    }
    let (version, layer) = ((h[1] >> 3) & 3, (h[1] >> 1) & 3);
    let (bi, ri, pad) = (
        (h[2] >> 4) as usize,
        ((h[2] >> 2) & 3) as usize,
        ((h[2] >> 1) & 1) as usize,
    );
    if version == 1 || layer == 0 || bi == 0 || bi == 15 || ri == 3 {
        return None;
    }
    let mpeg1 = version == 3;
    const KBPS: [[u16; 14]; 5] = [
        [
            32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448,
        ],
        [
            32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384,
        ],
        [
            32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320,
        ],
        [
            32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256,
        ],
        [8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160],
    ];
    // layer bits: 3 = I, 2 = II, 1 = III.
    let table = match (mpeg1, layer) {
        (true, 3) => 0,
        (true, 2) => 1,
        (true, _) => 2,
        (false, 3) => 3,
        (false, _) => 4,
    };
    let bitrate = KBPS[table][bi - 1] as usize * 1000;
    // MPEG-2 halves MPEG-1's rates, MPEG-2.5 quarters them.
    let rate = [44100, 48000, 32000][ri]
        >> match version {
            3 => 0,
            2 => 1,
            _ => 2,
        };
    let len = match layer {
        3 => (12 * bitrate / rate + pad) * 4,
        1 if !mpeg1 => 72 * bitrate / rate + pad,
        _ => 144 * bitrate / rate + pad,
    };
    (len >= 4).then_some(len)
}

/// A FLAC stream with only its STREAMINFO metadata blocks: tags, pictures, cue sheets and
/// seek tables are never needed to decode, and symphonia sizes buffers for some of them (a
/// Vorbis comment's length) from the file before reading them. `Ok(None)`: not FLAC.
fn flac_audio_only(b: &[u8]) -> Result<Option<Vec<u8>>, String> {
    if !b.starts_with(b"fLaC") {
        return Ok(None);
    }
    // The first block must be STREAMINFO (the format says so); it is the one kept.
    let mut out = b"fLaC".to_vec();
    let mut pos = 4;
    loop {
        let Some(h) = b.get(pos..pos + 4) else {
            return Err(format!(
                "FLAC metadata block header at byte {pos} is truncated"
            ));
        };
        let (last, ty) = (h[0] & 0x80 != 0, h[0] & 0x7f);
        let len = u32::from_be_bytes([0, h[1], h[2], h[3]]) as usize;
        let end = pos + 4 + len;
        if end > b.len() {
            return Err(format!(
                "FLAC metadata block at byte {pos} ({len} bytes) runs past the end ({} bytes)",
                b.len()
            ));
        }
        if pos == 4 {
            if ty != 0 {
                return Err(format!(
                    "FLAC stream starts with metadata block type {ty}, not STREAMINFO"
                ));
            }
            out.push(0x80); // the only block kept, so the last
            out.extend_from_slice(&b[pos + 1..end]);
        }
        pos = end;
        if last {
            break;
        }
    }
    out.extend_from_slice(&b[pos..]);
    Ok(Some(out))
}

fn decode_inner(bytes: Vec<u8>, ext: Option<&str>, path: &Path) -> Result<Decoded, AudioError> {
    if bytes.is_empty() {
        return Err(AudioError::Empty { path: path.into() });
    }
    let not_audio = |why: String| AudioError::NotAudio {
        path: path.into(),
        why,
    };
    let corrupt = |why: String| AudioError::Corrupt {
        path: path.into(),
        why,
    };
    let (start, container) = stream_start(&bytes).map_err(not_audio)?;
    if container == Container::Ogg && crate::opus::is_ogg_opus(&bytes[start..]) {
        let (samples, channels) = crate::opus::decode(&bytes[start..]).map_err(corrupt)?;
        return checked(samples, channels, 48_000, path);
    }
    let bytes = match flac_audio_only(&bytes[start..]).map_err(corrupt)? {
        Some(stripped) => stripped,
        None if start == 0 => bytes,
        None => bytes[start..].to_vec(),
    };
    let mss = MediaSourceStream::new(
        Box::new(std::io::Cursor::new(bytes)),
        MediaSourceStreamOptions::default(),
    );
    // The header chose the reader: no probe, which would scan the file for other formats'
    // markers. (The extension is not trusted over the bytes.)
    let _ = ext;
    let opts = FormatOptions::default();
    let format: Result<Box<dyn FormatReader>, SymError> = match container {
        Container::Wav => WavReader::try_new(mss, &opts).map(|r| Box::new(r) as _),
        Container::Flac => FlacReader::try_new(mss, &opts).map(|r| Box::new(r) as _),
        Container::Ogg => OggReader::try_new(mss, &opts).map(|r| Box::new(r) as _),
        Container::Mpeg => MpaReader::try_new(mss, &opts).map(|r| Box::new(r) as _),
    };
    let mut format = format.map_err(|e| not_audio(e.to_string()))?;
    let track = format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL)
        .ok_or_else(|| not_audio("no audio track".into()))?;
    let track_id = track.id;
    let mut rate = track.codec_params.sample_rate.unwrap_or(0);
    let mut channels = track.codec_params.channels.map_or(0, |c| c.count());
    let mut decoder = symphonia::default::get_codecs()
        .make(&track.codec_params, &DecoderOptions::default())
        .map_err(|e| not_audio(format!("unsupported codec: {e}")))?;

    let mut samples = Vec::new();
    let mut buf: Option<(u64, SignalSpec, SampleBuffer<f32>)> = None;
    let (mut good, mut bad) = (0usize, 0usize);
    let mut last_err = String::new();
    loop {
        let packet = match format.next_packet() {
            Ok(p) => p,
            // End of stream (or of a truncated file: keep what decoded).
            Err(SymError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(SymError::ResetRequired) => break,
            Err(e) => {
                if good == 0 {
                    return Err(corrupt(e.to_string()));
                }
                break;
            }
        };
        if packet.track_id() != track_id {
            continue;
        }
        match decoder.decode(&packet) {
            Ok(decoded) => {
                let spec = *decoded.spec();
                if decoded.frames() == 0 {
                    continue;
                }
                rate = spec.rate;
                channels = spec.channels.count();
                let need = decoded.capacity() as u64;
                let sb = match &mut buf {
                    Some((cap, s, b)) if *cap >= need && *s == spec => b,
                    _ => &mut buf.insert((need, spec, SampleBuffer::new(need, spec))).2,
                };
                sb.copy_interleaved_ref(decoded);
                samples.extend_from_slice(sb.samples());
                good += 1;
            }
            // A damaged packet: skip it, as players do, unless nothing decodes at all.
            Err(SymError::DecodeError(e)) => {
                bad += 1;
                last_err = e.to_string();
            }
            Err(SymError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(corrupt(e.to_string())),
        }
    }
    if good == 0 && bad > 0 {
        return Err(corrupt(format!(
            "no packet decodes ({bad} bad: {last_err})"
        )));
    }
    checked(samples, channels, rate, path)
}

/// The decoded samples, unless there are none or some are not numbers.
fn checked(
    samples: Vec<f32>,
    channels: usize,
    rate: u32,
    path: &Path,
) -> Result<Decoded, AudioError> {
    let corrupt = |why: &str| AudioError::Corrupt {
        path: path.into(),
        why: why.into(),
    };
    if samples.is_empty() || channels == 0 {
        return Err(AudioError::NoSamples { path: path.into() });
    }
    if rate == 0 {
        return Err(corrupt("sample rate is 0"));
    }
    if samples.iter().any(|s| !s.is_finite()) {
        return Err(corrupt("non-finite samples"));
    }
    Ok(Decoded {
        samples,
        channels,
        rate,
    })
}
