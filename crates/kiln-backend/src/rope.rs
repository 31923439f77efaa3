//! Rotary position embedding: the per-dimension frequencies, shared by every backend.

/// Which dimensions form a rotated pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// (x[2i], x[2i+1]) — Llama weights as stored in GGUF.
    Interleaved,
    /// (x[i], x[i + d/2]) — Hugging Face layout, Qwen2/Qwen3 in GGUF.
    Neox,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Llama 3.x "llama3" frequency scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_ctx: f32,
    },
    /// Per-frequency divisors given by the file (GGUF `rope_freqs.weight`).
    Factors(Vec<f32>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    pub style: RopeStyle,
    /// Rotated dimensions per head (may be less than the head size).
    pub dims: usize,
    pub head_dim: usize,
    pub theta: f32,
    pub scaling: RopeScaling,
}

impl RopeConfig {
    /// Angle per position of each rotated pair: theta^(-2i/dims), after scaling.
    pub fn inv_freqs(&self) -> Vec<f32> {
        let half = self.dims / 2;
        (0..half)
            .map(|i| {
                let f = 1.0 / (self.theta as f64).powf(2.0 * i as f64 / self.dims as f64);
                let f = match &self.scaling {
                    RopeScaling::None => f,
                    RopeScaling::Factors(div) => f / div.get(i).copied().unwrap_or(1.0) as f64,
                    RopeScaling::Llama3 {
                        factor,
                        low_freq_factor,
                        high_freq_factor,
                        original_ctx,
                    } => {
                        let (factor, lo, hi, ctx) = (
                            *factor as f64,
                            *low_freq_factor as f64,
                            *high_freq_factor as f64,
                            *original_ctx as f64,
                        );
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        let (low_wavelen, high_wavelen) = (ctx / lo, ctx / hi);
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (ctx / wavelen - lo) / (hi - lo);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    }
                };
                f as f32
            })
            .collect()
    }
}
