//! FLAC out, as a stream: mono 16-bit audio encoded in fixed blocks (the `flacenc` crate's
//! frame encoder) as samples arrive, so a response or file can start before the audio is
//! all made. The header is written first with the totals unknown (as FLAC allows for
//! streams); a seekable file can take [`FlacStream::header`] again with the total at the end.

use flacenc::bitsink::ByteSink;
use flacenc::component::{BitRepr, StreamInfo};
use flacenc::error::{Verified, Verify};
use flacenc::source::{Fill, FrameBuf};

/// Samples per frame (flacenc's and libFLAC's default).
const BLOCK: usize = 4096;

/// An encoder of one mono 16-bit stream.
pub struct FlacStream {
    rate: u32,
    config: Verified<flacenc::config::Encoder>,
    info: StreamInfo,
    fb: FrameBuf,
    pending: Vec<i32>,
    frames: usize,
    total: u64,
}

impl FlacStream {
    /// A stream at `rate` Hz (1..=655350).
    pub fn new(rate: u32) -> Result<Self, String> {
        let config = flacenc::config::Encoder::default()
            .into_verified()
            .map_err(|(_, e)| e.to_string())?;
        Ok(FlacStream {
            rate,
            config,
            info: StreamInfo::new(rate as usize, 1, 16).map_err(|e| e.to_string())?,
            fb: FrameBuf::with_size(1, BLOCK).map_err(|e| e.to_string())?,
            pending: Vec::new(),
            frames: 0,
            total: 0,
        })
    }

    /// `fLaC` and the STREAMINFO block: fixed blocks of 4096, frame sizes and MD5 unknown,
    /// `total` samples (0: unknown).
    pub fn header(&self, total: u64) -> [u8; 42] {
        let mut h = [0u8; 42];
        h[..4].copy_from_slice(b"fLaC");
        // The last metadata block (bit 7), type 0 (STREAMINFO), 34 bytes.
        h[4..8].copy_from_slice(&[0x80, 0, 0, 34]);
        let b = &mut h[8..];
        b[0..2].copy_from_slice(&(BLOCK as u16).to_be_bytes());
        b[2..4].copy_from_slice(&(BLOCK as u16).to_be_bytes());
        // Minimum and maximum frame sizes (24 bits each) stay 0: unknown.
        // Then 20 bits of rate, 3 of channels - 1, 5 of bits per sample - 1, 36 of total.
        let packed: u64 = (self.rate as u64 & 0xf_ffff) << 44 | 15 << 36 | (total & 0xf_ffff_ffff);
        b[10..18].copy_from_slice(&packed.to_be_bytes());
        // The MD5 signature (16 bytes) stays 0: not computed.
        h
    }

    /// Adds `samples`; returns the frames they complete.
    pub fn push(&mut self, samples: &[i16]) -> Result<Vec<u8>, String> {
        self.pending.extend(samples.iter().map(|&s| s as i32));
        self.total += samples.len() as u64;
        self.full_frames()
    }

    /// [`FlacStream::push`] for samples as s16le bytes (what `pcm16` makes).
    pub fn push_s16le(&mut self, pcm: &[u8]) -> Result<Vec<u8>, String> {
        let samples = pcm.chunks_exact(2);
        self.total += samples.len() as u64;
        self.pending
            .extend(samples.map(|b| i16::from_le_bytes([b[0], b[1]]) as i32));
        self.full_frames()
    }

    /// The frames of every whole block pending.
    fn full_frames(&mut self) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        let full = self.pending.len() / BLOCK * BLOCK;
        for block in self.pending[..full].chunks_exact(BLOCK) {
            out.extend(encode(
                &self.config,
                &mut self.fb,
                block,
                self.frames,
                &mut self.info,
            )?);
            self.frames += 1;
        }
        self.pending.drain(..full);
        Ok(out)
    }

    /// The last, shorter frame of what is left (nothing when nothing is).
    pub fn finish(&mut self) -> Result<Vec<u8>, String> {
        if self.pending.is_empty() {
            return Ok(Vec::new());
        }
        let rest = std::mem::take(&mut self.pending);
        let out = encode(
            &self.config,
            &mut self.fb,
            &rest,
            self.frames,
            &mut self.info,
        )?;
        self.frames += 1;
        Ok(out)
    }

    /// Samples pushed so far.
    pub fn total(&self) -> u64 {
        self.total
    }
}

fn encode(
    config: &Verified<flacenc::config::Encoder>,
    fb: &mut FrameBuf,
    block: &[i32],
    number: usize,
    info: &mut StreamInfo,
) -> Result<Vec<u8>, String> {
    // FLAC's smallest block is 16 samples: a last block shorter than that is padded with
    // silence (under 1 ms at the end of the audio).
    let mut padded;
    let block = if block.len() < 16 {
        padded = block.to_vec();
        padded.resize(16, 0);
        &padded[..]
    } else {
        block
    };
    fb.fill_interleaved(block).map_err(|e| e.to_string())?;
    let frame =
        flacenc::encode_fixed_size_frame(config, fb, number, info).map_err(|e| e.to_string())?;
    info.update_frame_info(&frame);
    let mut sink = ByteSink::with_capacity(frame.count_bits());
    frame.write(&mut sink).map_err(|e| e.to_string())?;
    Ok(sink.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream encoded in uneven pushes decodes (with kiln's reader, symphonia's FLAC) to
    /// exactly the samples pushed: FLAC is lossless.
    #[test]
    fn streamed_flac_decodes_to_the_same_samples() {
        let mut x = 0x1234_5678u32;
        let samples: Vec<i16> = (0..20_000)
            .map(|i| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let tone = (i as f32 * 0.05).sin() * 8000.0;
                (tone + (x >> 24) as f32 - 128.0) as i16
            })
            .collect();
        let mut f = FlacStream::new(24000).unwrap();
        let mut bytes = f.header(0).to_vec();
        for part in [&samples[..100], &samples[100..9000], &samples[9000..]] {
            bytes.extend(f.push(part).unwrap());
        }
        bytes.extend(f.finish().unwrap());
        assert_eq!(f.total(), samples.len() as u64);
        let d = crate::decode_bytes(bytes.clone(), Some("flac"), std::path::Path::new("t.flac"))
            .unwrap();
        assert_eq!((d.rate, d.channels), (24000, 1));
        let back: Vec<i16> = d
            .samples
            .iter()
            .map(|&v| (v * 32768.0).round() as i16)
            .collect();
        assert_eq!(back, samples);
        assert!(
            bytes.len() < samples.len() * 2,
            "compressed: {} bytes",
            bytes.len()
        );
        // The header again, with the total: the same file, its length known.
        bytes[..42].copy_from_slice(&f.header(f.total()));
        let d = crate::decode_bytes(bytes, None, std::path::Path::new("t.flac")).unwrap();
        assert_eq!(d.samples.len(), samples.len());
    }
}
