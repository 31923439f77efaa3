//! Compressed audio out, as a stream: FLAC (lossless) or Ogg Opus, picked by name (a
//! response format, a file's extension), mono 16-bit samples in, bytes out as they are made.

use crate::flac::FlacStream;
use crate::opus::OpusStream;

/// A compressed stream format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compressed {
    Flac,
    Opus,
}

impl Compressed {
    /// The format a file name asks for by its extension (`.flac`; `.opus` or `.ogg`), if any.
    pub fn for_path(name: &str) -> Option<Self> {
        let ext = std::path::Path::new(name).extension()?.to_str()?;
        match ext.to_ascii_lowercase().as_str() {
            "flac" => Some(Compressed::Flac),
            "opus" | "ogg" => Some(Compressed::Opus),
            _ => None,
        }
    }

    /// Its media type.
    pub fn content_type(self) -> &'static str {
        match self {
            Compressed::Flac => "audio/flac",
            Compressed::Opus => "audio/ogg",
        }
    }
}

/// One stream being encoded.
pub enum StreamEncoder {
    Flac(FlacStream),
    Opus(OpusStream),
}

impl StreamEncoder {
    pub fn new(format: Compressed, rate: u32) -> Result<Self, String> {
        Ok(match format {
            Compressed::Flac => StreamEncoder::Flac(FlacStream::new(rate)?),
            Compressed::Opus => StreamEncoder::Opus(OpusStream::new(rate)?),
        })
    }

    /// What opens the stream: FLAC's header with the length unknown, Opus's header pages.
    pub fn header(&mut self) -> Vec<u8> {
        match self {
            StreamEncoder::Flac(f) => f.header(0).to_vec(),
            StreamEncoder::Opus(o) => o.header(),
        }
    }

    /// Adds samples as s16le bytes; returns what they complete.
    pub fn push_s16le(&mut self, pcm: &[u8]) -> Result<Vec<u8>, String> {
        match self {
            StreamEncoder::Flac(f) => f.push_s16le(pcm),
            StreamEncoder::Opus(o) => o.push_s16le(pcm),
        }
    }

    /// The rest of the stream, and for FLAC the header again with the length, for a writer
    /// that can go back to the start.
    pub fn finish(self) -> Result<(Vec<u8>, Option<Vec<u8>>), String> {
        match self {
            StreamEncoder::Flac(mut f) => {
                let rest = f.finish()?;
                Ok((rest, Some(f.header(f.total()).to_vec())))
            }
            StreamEncoder::Opus(o) => Ok((o.finish()?, None)),
        }
    }
}
