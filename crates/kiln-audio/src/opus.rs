//! Ogg Opus (RFC 7845) out, as a stream, and in: mono 16-bit audio encoded in 20 ms frames
//! (the `opus-pure` crate's encoder and Ogg writer) as samples arrive, so a response or a
//! file can start before the audio is all made; and Ogg Opus files decoded for Whisper (what
//! voice messages and browsers' recorders send).
//!
//! The end of the audio is exact: the last frame is padded with silence and the final page's
//! granule position says where the audio stops (the end-trim of RFC 7845 section 4.4), so a
//! decoder gives back as many samples as went in.

use opus_pure::{
    Application, OggOpusReader, OggOpusWriter, OpusEncoder, OpusHead, Trim, MAX_PACKET_BYTES,
    MAX_PACKET_SAMPLES,
};

/// Bits per second of the encoded speech: transparent for a 24 kHz voice (OpenAI's opus
/// speech is in this range), a tenth of FLAC's size.
pub const BITRATE: i32 = 48_000;

/// Payload bytes a page collects before it is written out (about a quarter second of speech
/// at [`BITRATE`]): small enough that a streamed response moves at the pace of the audio.
const PAGE_BYTES: usize = 1536;

/// Opus's clock: granule positions count 48 kHz samples whatever the input rate.
const GRANULE_RATE: u64 = 48_000;

/// An encoder of one mono stream.
pub struct OpusStream {
    enc: OpusEncoder,
    w: OggOpusWriter<Vec<u8>>,
    /// Samples a frame (20 ms).
    frame: usize,
    /// 48 kHz ticks a sample.
    ticks: u64,
    pre_skip: u64,
    pending: Vec<f32>,
    packet: Vec<u8>,
    total: u64,
}

impl OpusStream {
    /// A stream at `rate` Hz: one of Opus's input rates (8, 12, 16, 24 or 48 kHz).
    pub fn new(rate: u32) -> Result<Self, String> {
        if ![8_000, 12_000, 16_000, 24_000, 48_000].contains(&rate) {
            return Err(format!(
                "Opus takes 8, 12, 16, 24 or 48 kHz audio, not {rate} Hz"
            ));
        }
        let mut enc =
            OpusEncoder::new(rate as i32, 1, Application::Audio).map_err(|e| e.to_string())?;
        enc.bitrate_bps = BITRATE;
        let head = OpusHead::for_encoder(&enc, rate);
        let pre_skip = u64::from(head.pre_skip);
        let mut w = OggOpusWriter::new(Vec::new(), head).map_err(|e| e.to_string())?;
        w.set_page_target(PAGE_BYTES);
        Ok(OpusStream {
            enc,
            w,
            frame: rate as usize / 50,
            ticks: GRANULE_RATE / rate as u64,
            pre_skip,
            pending: Vec::new(),
            packet: vec![0; MAX_PACKET_BYTES],
            total: 0,
        })
    }

    /// The two header pages (`OpusHead`, `OpusTags`) once; after that, nothing until
    /// samples come.
    pub fn header(&mut self) -> Vec<u8> {
        self.take()
    }

    /// Adds `samples`; returns the Ogg pages finished so far (the header pages first, unless
    /// [`OpusStream::header`] took them).
    pub fn push(&mut self, samples: &[i16]) -> Result<Vec<u8>, String> {
        self.add(samples.iter().copied())
    }

    /// [`OpusStream::push`] for samples as s16le bytes (what `pcm16` makes).
    pub fn push_s16le(&mut self, pcm: &[u8]) -> Result<Vec<u8>, String> {
        self.add(
            pcm.chunks_exact(2)
                .map(|b| i16::from_le_bytes([b[0], b[1]])),
        )
    }

    /// Queues `samples` and encodes every full frame.
    fn add(&mut self, samples: impl ExactSizeIterator<Item = i16>) -> Result<Vec<u8>, String> {
        self.total += samples.len() as u64;
        self.pending.extend(samples.map(|s| s as f32 / 32768.0));
        let full = self.pending.len() / self.frame * self.frame;
        for i in (0..full).step_by(self.frame) {
            let n = self
                .enc
                .encode(
                    &self.pending[i..i + self.frame],
                    self.frame,
                    &mut self.packet,
                )
                .map_err(|e| e.to_string())?;
            self.w
                .write_packet(&self.packet[..n])
                .map_err(|e| e.to_string())?;
        }
        self.pending.drain(..full);
        Ok(self.take())
    }

    /// What the writer has put out since the last call.
    fn take(&mut self) -> Vec<u8> {
        self.w.get_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The rest: the pending samples and the encoder's delay flushed through in frames of
    /// silence, the last page marked as the end with the granule of the last real sample.
    pub fn finish(mut self) -> Result<Vec<u8>, String> {
        // The decoder drops the first `pre_skip` (48 kHz) samples, the encoder's delay: the
        // input runs that much past the audio, rounded up to whole frames.
        let delay = self.pre_skip.div_ceil(self.ticks) as usize;
        let fed = self.total as usize - self.pending.len();
        let frames = (self.total as usize + delay - fed)
            .div_ceil(self.frame)
            .max(1);
        let end = self.pre_skip + self.total * self.ticks;
        self.pending.resize(frames * self.frame, 0.0);
        let mut out = self.take();
        for f in 0..frames {
            let pcm = &self.pending[f * self.frame..(f + 1) * self.frame];
            let n = self
                .enc
                .encode(pcm, self.frame, &mut self.packet)
                .map_err(|e| e.to_string())?;
            let at = self.w.granule() as u64;
            let full = self.frame as u64 * self.ticks;
            // The last packet's duration ends the stream where the audio ends.
            let dur = if f + 1 == frames {
                end.saturating_sub(at).min(full)
            } else {
                full
            };
            self.w
                .write_packet_with_duration(&self.packet[..n], dur as u32)
                .map_err(|e| e.to_string())?;
        }
        out.extend(self.w.finish().map_err(|e| e.to_string())?);
        Ok(out)
    }

    /// Samples pushed so far.
    pub fn total(&self) -> u64 {
        self.total
    }
}

/// Whether `b` (an Ogg stream's start) holds Opus: its first packet is an `OpusHead`.
pub fn is_ogg_opus(b: &[u8]) -> bool {
    // The first page: 27 header bytes, its segment table, then the first packet.
    if b.len() < 27 || &b[..4] != b"OggS" {
        return false;
    }
    let body = 27 + b[26] as usize;
    b.get(body..body + 8) == Some(b"OpusHead")
}

/// Decodes a whole Ogg Opus stream to interleaved samples at 48 kHz (Opus's own rate);
/// returns (samples, channels).
pub fn decode(bytes: &[u8]) -> Result<(Vec<f32>, usize), String> {
    let mut r = OggOpusReader::new(std::io::Cursor::new(bytes)).map_err(|e| e.to_string())?;
    let head = r.head().clone();
    let channels = head.channel_count as usize;
    let rate = GRANULE_RATE as i32;
    let mut dec = head.decoder(rate).map_err(|e| e.to_string())?;
    let mut trim = Trim::new(&head, rate, channels).map_err(|e| e.to_string())?;
    let mut block = vec![0.0f32; MAX_PACKET_SAMPLES * channels];
    let mut out = Vec::new();
    for p in r.packets() {
        let p = p.map_err(|e| e.to_string())?;
        let n = dec
            .decode(&p.data, MAX_PACKET_SAMPLES, &mut block)
            .map_err(|e| e.to_string())?;
        out.extend_from_slice(trim.keep(&p, &block[..n * channels]));
    }
    Ok((out, channels))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A voiced sound: a 150 Hz fundamental with a few harmonics, swelling and fading.
    fn voice(n: usize, rate: f32) -> Vec<i16> {
        (0..n)
            .map(|i| {
                let t = i as f32 / rate;
                let env = (std::f32::consts::PI * i as f32 / n as f32).sin();
                let s: f32 = (1..6)
                    .map(|h| (2.0 * std::f32::consts::PI * 150.0 * h as f32 * t).sin() / h as f32)
                    .sum();
                (s * env * 8000.0) as i16
            })
            .collect()
    }

    #[test]
    fn streamed_opus_decodes_to_the_same_length_and_sound() {
        // An odd length, pushed in uneven pieces (as sentences arrive).
        let pcm = voice(24_000 * 2 + 331, 24_000.0);
        let mut s = OpusStream::new(24_000).unwrap();
        let mut bytes = Vec::new();
        for piece in pcm.chunks(7_001) {
            bytes.extend(s.push(piece).unwrap());
        }
        assert_eq!(s.total(), pcm.len() as u64);
        bytes.extend(s.finish().unwrap());
        assert!(is_ogg_opus(&bytes));
        // 48 kb/s for 2 s: about 12 kB (FLAC would take ~60 kB).
        assert!(bytes.len() < 16_000, "{} bytes", bytes.len());

        let (out, channels) = decode(&bytes).unwrap();
        assert_eq!(channels, 1);
        // Decoded at 48 kHz: exactly twice the samples that went in.
        assert_eq!(out.len(), pcm.len() * 2);
        // Back at 24 kHz (every other sample of a band-limited signal), the waveform is close:
        // a lossy codec's noise, not a shift or a gap.
        let (mut sig, mut err) = (0.0f64, 0.0f64);
        for (i, &x) in pcm.iter().enumerate() {
            let x = x as f64 / 32768.0;
            let y = out[2 * i] as f64;
            sig += x * x;
            err += (x - y) * (x - y);
        }
        let snr = 10.0 * (sig / err).log10();
        assert!(snr > 15.0, "SNR {snr:.1} dB");
    }

    #[test]
    fn an_empty_stream_is_still_a_stream() {
        let s = OpusStream::new(24_000).unwrap();
        let bytes = s.finish().unwrap();
        assert!(is_ogg_opus(&bytes));
        let (out, _) = decode(&bytes).unwrap();
        assert!(out.is_empty(), "{} samples", out.len());
    }

    #[test]
    fn rates_opus_does_not_take_are_refused() {
        let e = OpusStream::new(22_050).err().unwrap();
        assert!(e.contains("22050 Hz"), "{e}");
    }
}
