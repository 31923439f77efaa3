//! Speech written to a file: WAV (its length filled in at the end), FLAC for a name ending
//! `.flac`, Ogg Opus for `.opus` or `.ogg`, encoded as the audio comes; the file replaces
//! any old one only once everything is written ([`AudioFile::commit`]).

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use anyhow::Context;
use kiln_audio::encode::{Compressed, StreamEncoder};
use kiln_formats::OutputFile;
use kiln_runtime::tts::{pcm16, wav_header};

pub struct AudioFile {
    out: OutputFile,
    enc: Option<StreamEncoder>,
    /// PCM bytes written (WAV).
    written: u64,
}

impl AudioFile {
    /// A file at `path` for mono audio at `rate` Hz, in the format its name asks for.
    pub fn create(path: &Path, rate: u32) -> anyhow::Result<Self> {
        let format = path.to_str().and_then(Compressed::for_path);
        let mut enc = match format {
            Some(f) => {
                Some(StreamEncoder::new(f, rate).map_err(|e| anyhow::anyhow!("{f:?}: {e}"))?)
            }
            None => None,
        };
        let mut out = OutputFile::create(path)?;
        match &mut enc {
            Some(e) => out.file().write_all(&e.header())?,
            None => out.file().write_all(&wav_header(0))?,
        }
        Ok(AudioFile {
            out,
            enc,
            written: 0,
        })
    }

    pub fn write(&mut self, samples: &[f32]) -> std::io::Result<()> {
        let b = pcm16(samples);
        match &mut self.enc {
            Some(e) => {
                let b = e.push_s16le(&b).map_err(std::io::Error::other)?;
                self.out.file().write_all(&b)
            }
            None => {
                self.written += b.len() as u64;
                self.out.file().write_all(&b)
            }
        }
    }

    /// Ends the stream (WAV: the header's lengths) and puts the file in place.
    pub fn commit(mut self) -> anyhow::Result<()> {
        let f = self.out.file();
        match self.enc.take() {
            Some(e) => {
                let (rest, header) = e.finish().map_err(|e| anyhow::anyhow!("encoding: {e}"))?;
                f.write_all(&rest)?;
                if let Some(h) = header {
                    f.seek(SeekFrom::Start(0))?;
                    f.write_all(&h)?;
                }
            }
            None => {
                let len =
                    u32::try_from(self.written).context("audio longer than a WAV file holds")?;
                f.seek(SeekFrom::Start(0))?;
                f.write_all(&wav_header(len))?;
            }
        }
        self.out.commit()?;
        Ok(())
    }
}
