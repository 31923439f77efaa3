//! The text front end of text-to-speech: normalisation, sentence splitting, English G2P into
//! Kokoro's phonemes, and chunking under the model's 510-phoneme limit.

mod g2p;
mod neural;
mod normalize;

pub use g2p::{chunk, map_espeak, G2p, G2pError, NEURAL_G2P_FILE};
pub use neural::{arpabet_to_kokoro, NeuralG2p};
pub use normalize::{cardinal, normalize, number, ordinal, sentences, year};
