//! Text embeddings from a decoder model: the final-normed hidden states of a text's tokens,
//! pooled as the model's configuration says (the last token, as Qwen3-Embedding does, by
//! default; the mean or the first token where it says so) and scaled to unit length.

use std::path::Path;

use kiln_formats::GgufFile;

/// How a text's token states become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The last token's state (decoder embedding models: Qwen3-Embedding, e5-mistral).
    Last,
    /// The mean over the tokens.
    Mean,
    /// The first token's state.
    First,
}

impl Pooling {
    /// A GGUF file's `{arch}.pooling_type` (llama.cpp's numbering: 1 mean, 2 cls, 3 last);
    /// absent or another value: the last token.
    pub fn from_gguf(g: &GgufFile) -> Pooling {
        let arch = g.architecture().unwrap_or("llama").to_string();
        match g
            .get(&format!("{arch}.pooling_type"))
            .and_then(|v| v.as_u64())
        {
            Some(1) => Pooling::Mean,
            Some(2) => Pooling::First,
            _ => Pooling::Last,
        }
    }

    /// A sentence-transformers directory's `1_Pooling/config.json`
    /// (`pooling_mode_mean_tokens`, `pooling_mode_cls_token`, `pooling_mode_lasttoken`);
    /// absent: the last token.
    pub fn from_dir(dir: &Path) -> Pooling {
        let cfg = std::fs::read_to_string(dir.join("1_Pooling/config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
        let on = |k: &str| {
            cfg.as_ref()
                .and_then(|c| c.get(k))
                .and_then(|v| v.as_bool())
                == Some(true)
        };
        if on("pooling_mode_mean_tokens") {
            Pooling::Mean
        } else if on("pooling_mode_cls_token") {
            Pooling::First
        } else {
            Pooling::Last
        }
    }

    /// `states` (`n x dim`, row-major) pooled and scaled to unit length.
    pub fn pool(self, states: &[f32], dim: usize) -> Vec<f32> {
        let n = states.len() / dim.max(1);
        let mut v = vec![0f32; dim];
        if n == 0 {
            return v;
        }
        match self {
            Pooling::Last => v.copy_from_slice(&states[(n - 1) * dim..n * dim]),
            Pooling::First => v.copy_from_slice(&states[..dim]),
            Pooling::Mean => {
                for row in states.chunks_exact(dim) {
                    for (a, x) in v.iter_mut().zip(row) {
                        *a += x;
                    }
                }
                v.iter_mut().for_each(|a| *a /= n as f32);
            }
        }
        normalize(&mut v);
        v
    }
}

/// Scales `v` to unit length (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| (x as f64) * (x as f64))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_and_normalizes() {
        let s = [3.0, 4.0, 0.0, 0.0, 1.0, 1.0];
        assert_eq!(Pooling::Last.pool(&s, 2), [0.70710677, 0.70710677]);
        assert_eq!(Pooling::First.pool(&s, 2), [0.6, 0.8]);
        let m = Pooling::Mean.pool(&s, 2);
        let want = [4.0f32 / 3.0, 5.0 / 3.0];
        let n = (want[0] * want[0] + want[1] * want[1]).sqrt();
        assert!((m[0] - want[0] / n).abs() < 1e-6 && (m[1] - want[1] / n).abs() < 1e-6);
        assert_eq!(Pooling::Last.pool(&[0.0, 0.0], 2), [0.0, 0.0]);
    }
}
