//! The text front end of text-to-speech: normalisation, sentence splitting, English G2P into
//! Kokoro's phonemes, and chunking under the model's 510-phoneme limit.

mod g2p;
mod normalize;

pub use g2p::{chunk, map_espeak, G2p, G2pError};
pub use normalize::{cardinal, normalize, ordinal, sentences, year};
