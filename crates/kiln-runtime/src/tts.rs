//! Text-to-speech sessions: text -> sentences -> phonemes -> Kokoro audio, one sentence at a
//! time, handed to the caller as soon as it is synthesized (streaming by sentence).

use std::path::{Path, PathBuf};

use kiln_backend::cpu::CpuBackend;
use kiln_backend::Backend;
use kiln_models::kokoro::{load_voices, Kokoro, Voice};
use kiln_models::ModelError;
use kiln_text::speech::{
    chunk, espeak_phonemes, normalize, sentences, voice_language, English, G2p, G2pError, Language,
    Phonemizer,
};
use thiserror::Error;

pub use kiln_models::kokoro::SAMPLE_RATE;

#[derive(Debug, Error)]
pub enum TtsError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    G2p(#[from] G2pError),
    #[error("unknown voice '{name}' (voices: {known})")]
    UnknownVoice { name: String, known: String },
    #[error("{0}")]
    Input(String),
    /// Nothing to pronounce: the text is empty or symbols only.
    #[error("nothing to say: the text is empty")]
    Empty,
    #[error("writing audio: {0}")]
    Sink(String),
}

/// Kokoro's limit on phonemes per utterance (510 tokens plus the two pads).
pub const MAX_PHONEMES: usize = 510;

/// A Kokoro session on a backend (the CPU's unless loaded with [`Tts::load_files_on`]).
pub struct Tts<B: Backend = CpuBackend> {
    backend: B,
    model: Kokoro<B>,
    voices: Vec<Voice>,
    /// American English (misaki's US lexicons).
    g2p: Option<G2p>,
    /// British English: where misaki's GB lexicons are (found, and fetched if need be, by
    /// the caller's function), loaded on the first British voice's text.
    british: Option<(BritishLexicons, std::sync::OnceLock<Result<G2p, String>>)>,
    /// The text's language for every voice (None: each voice's own).
    language: Option<Language>,
    /// [`Tts::without_espeak`].
    no_espeak: bool,
}

/// Finds misaki's British lexicons' directory (a path, or a fetch on first use).
type BritishLexicons = Box<dyn Fn() -> Result<PathBuf, String> + Send + Sync>;

/// Timing of one utterance.
#[derive(Debug, Clone, Default)]
pub struct TtsStats {
    pub first_audio_s: f64,
    pub total_s: f64,
    pub audio_s: f64,
    pub chunks: usize,
}

/// The model, config and voices of a Kokoro directory: config.json, the model
/// (`kokoro-v1.0.int8.onnx`, the catalog's; else `kokoro-v1.0.onnx` or hexgrad's
/// `kokoro-v1_0.pth`) and the voices (`voices.npz`, else a `voices/` directory of `.pt`
/// files, as hexgrad's repository has).
pub fn model_dir_files(model_dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let first = |names: &[&str]| {
        names
            .iter()
            .map(|n| model_dir.join(n))
            .find(|p| p.exists())
            .unwrap_or_else(|| model_dir.join(names[0]))
    };
    (
        first(&[
            "kokoro-v1.0.int8.onnx",
            "kokoro-v1.0.onnx",
            "kokoro-v1_0.pth",
        ]),
        model_dir.join("config.json"),
        // The catalog's directory holds both: `voices/` has all 54 (kokoro-js's), the
        // pack the export's five.
        first(&["voices", "voices.npz"]),
    )
}

impl Tts {
    /// `model_dir`: a Kokoro directory ([`model_dir_files`]); `lexicon_dir`: misaki's
    /// lexicons, or None for phoneme input only.
    pub fn load(
        model_dir: &Path,
        lexicon_dir: Option<&Path>,
        threads: usize,
    ) -> Result<Tts, TtsError> {
        let (model, config, voices) = model_dir_files(model_dir);
        Self::load_files(&model, &config, &voices, lexicon_dir, threads)
    }

    /// `model`: a Kokoro model file (ONNX export or hexgrad's `.pth`); `voices`: an `.npz`
    /// pack, one `.npy` / `.pt` voice, or a directory of them (see [`load_voices`]).
    pub fn load_files(
        model: &Path,
        config: &Path,
        voices: &Path,
        lexicon_dir: Option<&Path>,
        threads: usize,
    ) -> Result<Tts, TtsError> {
        Tts::load_files_on(CpuBackend::new(threads), model, config, voices, lexicon_dir)
    }
}

impl<B: Backend> Tts<B> {
    /// [`Tts::load_files`] on `backend`.
    pub fn load_files_on(
        backend: B,
        model: &Path,
        config: &Path,
        voices: &Path,
        lexicon_dir: Option<&Path>,
    ) -> Result<Tts<B>, TtsError> {
        // The lexicons and letter-to-sound model are read on a thread of their own while the
        // model loads; the model's error comes first, as before.
        let (model, g2p) = std::thread::scope(|s| {
            let g2p = lexicon_dir.map(|d| s.spawn(move || G2p::load(d)));
            let model = Kokoro::load(&backend, model, config);
            (model, g2p.map(crate::join_scoped))
        });
        let model = model?;
        let voices = load_voices(voices, 2 * model.config.style_dim)?;
        let g2p = g2p.transpose()?;
        Ok(Tts {
            backend,
            model,
            voices,
            g2p,
            british: None,
            language: None,
            no_espeak: false,
        })
    }

    /// English words outside the lexicons go to the neural letter-to-sound model even where
    /// espeak-ng is installed (what machines without it do, whatever this one has).
    pub fn without_espeak(mut self) -> Self {
        self.g2p = self.g2p.map(G2p::without_espeak);
        self.no_espeak = true;
        self
    }

    /// Reads text as `lang` whatever the voice (None: each voice's own language).
    pub fn with_language(mut self, lang: Option<Language>) -> Self {
        self.language = lang;
        self
    }

    /// Where misaki's British lexicons are (`gb_gold.json`, `gb_silver.json`), for the
    /// British voices (`bf_*`, `bm_*`); without them those voices' text is an error.
    pub fn with_british_lexicons(self, dir: &Path) -> Self {
        let dir = dir.to_path_buf();
        self.with_british_lexicons_from(move || Ok(dir.clone()))
    }

    /// As [`Tts::with_british_lexicons`], the directory found by `find` when a British
    /// voice first speaks text (so that only users of those voices fetch them).
    pub fn with_british_lexicons_from(
        mut self,
        find: impl Fn() -> Result<PathBuf, String> + Send + Sync + 'static,
    ) -> Self {
        self.british = Some((Box::new(find), std::sync::OnceLock::new()));
        self
    }

    /// `sentence` (normalised) in Kokoro's phonemes for `voice`'s language.
    fn phonemize(&self, sentence: &str, voice: &str) -> Result<String, TtsError> {
        let lang = self.language.or_else(|| voice_language(voice));
        let no_lexicons = || TtsError::Input("no G2P lexicons loaded: pass --phonemes".into());
        match lang.map(|l| l.phonemizer) {
            Some(Phonemizer::English(English::American)) | None => {
                let g2p = self.g2p.as_ref().ok_or_else(no_lexicons)?;
                Ok(g2p.phonemize(&normalize(sentence))?)
            }
            Some(Phonemizer::English(English::British)) => {
                let (find, g2p) = self.british.as_ref().ok_or_else(|| {
                    TtsError::Input(format!(
                        "voice {voice} speaks British English, and misaki's British lexicons \
                         are not loaded"
                    ))
                })?;
                let g2p = g2p
                    .get_or_init(|| {
                        let g = find().and_then(|dir| {
                            G2p::load_english(&dir, English::British).map_err(|e| e.to_string())
                        });
                        g.map(|g| {
                            if self.no_espeak {
                                g.without_espeak()
                            } else {
                                g
                            }
                        })
                    })
                    .as_ref()
                    .map_err(|e| TtsError::Input(e.clone()))?;
                Ok(g2p.phonemize(&normalize(sentence))?)
            }
            Some(Phonemizer::Espeak(v)) => {
                let name = lang.map_or("", |l| l.name);
                if self.no_espeak {
                    return Err(TtsError::Input(format!(
                        "voice {voice} speaks {name}, which kiln reads with espeak-ng, and \
                         espeak-ng is turned off here"
                    )));
                }
                let p = espeak_phonemes(sentence, v).map_err(|e| {
                    TtsError::Input(format!(
                        "voice {voice} speaks {name}: {e} (or pass --phonemes)"
                    ))
                })?;
                // Letters Kokoro has no token for are dropped, as its own pipeline does.
                Ok(p.chars().filter(|&c| self.model.knows(c)).collect())
            }
            Some(Phonemizer::None(why)) => Err(TtsError::Input(format!(
                "voice {voice} speaks {}: {why}; pass Kokoro phonemes with --phonemes, or \
                 pick an English voice",
                lang.map_or("", |l| l.name)
            ))),
        }
    }

    pub fn voices(&self) -> impl Iterator<Item = &str> {
        self.voices.iter().map(|v| v.name.as_str())
    }

    /// The backend's name (`cpu`, `cuda`, ...).
    pub fn backend_name(&self) -> String {
        self.backend.name()
    }

    fn voice(&self, name: &str) -> Result<&Voice, TtsError> {
        self.voices
            .iter()
            .find(|v| v.name == name)
            .ok_or_else(|| TtsError::UnknownVoice {
                name: name.into(),
                known: self.voices().collect::<Vec<_>>().join(", "),
            })
    }

    /// Phoneme chunks of `text` for `voice`'s language (each under the model's limit and in
    /// its vocabulary), sentence by sentence.
    pub fn phonemes(
        &self,
        text: &str,
        is_phonemes: bool,
        voice: &str,
    ) -> Result<Vec<String>, TtsError> {
        Ok(self
            .chunks(text, is_phonemes, voice)?
            .into_iter()
            .map(|(p, _)| p)
            .collect())
    }

    /// [`Tts::phonemes`] with each chunk's token ids: every chunk is checked against the
    /// model's vocabulary here, so a caller that phonemizes first knows the whole text can
    /// be spoken before any of it is.
    fn chunks(
        &self,
        text: &str,
        is_phonemes: bool,
        voice: &str,
    ) -> Result<Vec<(String, Vec<u32>)>, TtsError> {
        let mut out = Vec::new();
        if is_phonemes {
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                out.extend(chunk(line.trim(), MAX_PHONEMES));
            }
        } else {
            for s in sentences(text) {
                let p = self.phonemize(&s, voice)?;
                out.extend(chunk(&p, MAX_PHONEMES));
            }
        }
        if out.is_empty() {
            return Err(TtsError::Empty);
        }
        out.into_iter()
            .map(|p| match self.model.ids(&p) {
                Ok(ids) => Ok((p, ids)),
                Err(e) => Err(TtsError::Input(e.to_string())),
            })
            .collect()
    }

    /// Synthesizes `text` chunk by chunk; `sink` gets each chunk's samples (24 kHz mono f32)
    /// as soon as it is ready.
    pub fn speak(
        &self,
        text: &str,
        is_phonemes: bool,
        voice: &str,
        speed: f32,
        sink: &mut dyn FnMut(&[f32]) -> std::io::Result<()>,
    ) -> Result<TtsStats, TtsError> {
        let t0 = std::time::Instant::now();
        let v = self.voice(voice)?;
        let chunks = self.chunks(text, is_phonemes, voice)?;
        let mut st = TtsStats::default();
        for (p, ids) in &chunks {
            let style = v.style(p.chars().count());
            let audio = self
                .model
                .synthesize(&self.backend, ids, style, speed, None)?;
            if st.chunks == 0 {
                st.first_audio_s = t0.elapsed().as_secs_f64();
            }
            st.chunks += 1;
            st.audio_s += audio.len() as f64 / SAMPLE_RATE as f64;
            sink(&audio).map_err(|e| TtsError::Sink(e.to_string()))?;
        }
        st.total_s = t0.elapsed().as_secs_f64();
        Ok(st)
    }
}

/// WAV header for 24 kHz mono 16-bit PCM followed by `data_len` bytes of samples. A stream
/// whose length is unknown uses `u32::MAX - 36` (as OpenAI's streamed WAV does).
pub fn wav_header(data_len: u32) -> [u8; 44] {
    let mut h = [0u8; 44];
    let mut put = |at: usize, b: &[u8]| h[at..at + b.len()].copy_from_slice(b);
    put(0, b"RIFF");
    put(4, &data_len.saturating_add(36).to_le_bytes());
    put(8, b"WAVEfmt ");
    put(16, &16u32.to_le_bytes());
    put(20, &1u16.to_le_bytes()); // PCM
    put(22, &1u16.to_le_bytes()); // mono
    put(24, &SAMPLE_RATE.to_le_bytes());
    put(28, &(SAMPLE_RATE * 2).to_le_bytes());
    put(32, &2u16.to_le_bytes()); // bytes per frame
    put(34, &16u16.to_le_bytes()); // bits per sample
    put(36, b"data");
    put(40, &data_len.to_le_bytes());
    h
}

/// Samples in [-1, 1] as 16-bit little-endian PCM.
pub fn pcm16(samples: &[f32]) -> Vec<u8> {
    samples
        .iter()
        .flat_map(|&s| ((s.clamp(-1.0, 1.0) * 32767.0).round() as i16).to_le_bytes())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wav_header_fields() {
        let h = wav_header(48_000);
        assert_eq!(&h[..4], b"RIFF");
        assert_eq!(u32::from_le_bytes(h[4..8].try_into().unwrap()), 48_036);
        assert_eq!(u32::from_le_bytes(h[24..28].try_into().unwrap()), 24_000);
        assert_eq!(u16::from_le_bytes(h[34..36].try_into().unwrap()), 16);
        assert_eq!(u32::from_le_bytes(h[40..44].try_into().unwrap()), 48_000);
        assert_eq!(pcm16(&[0.0, 1.0, -2.0]), [0, 0, 0xff, 0x7f, 0x01, 0x80]);
    }
}
