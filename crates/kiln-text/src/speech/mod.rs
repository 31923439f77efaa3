//! The text front end of text-to-speech: normalisation, sentence splitting, G2P into Kokoro's
//! phonemes (English from misaki's lexicons, other languages through espeak-ng), and chunking
//! under the model's 510-phoneme limit.

mod g2p;
mod language;
mod neural;
mod normalize;

pub use g2p::{chunk, map_espeak, English, G2p, G2pError, NEURAL_G2P_FILE};
pub use language::{espeak_phonemes, language_by_code, voice_language, Language, Phonemizer};
pub use neural::{arpabet_to_kokoro, NeuralG2p};
pub use normalize::{cardinal, normalize, number, ordinal, sentences, year};
