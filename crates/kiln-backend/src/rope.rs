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

#[cfg(test)]
mod tests {
    use super::*;

    /// Llama-3.2-3B's rope: theta 500000, head 128, llama3 scaling (factor 32, low 1, high 4,
    /// original context 8192). Expected values from the published float64 formula (numpy).
    #[test]
    fn llama3_scaling_matches_reference_formula() {
        let cfg = RopeConfig {
            style: RopeStyle::Interleaved,
            dims: 128,
            head_dim: 128,
            theta: 500000.0,
            scaling: RopeScaling::Llama3 {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_ctx: 8192.0,
            },
        };
        let f = cfg.inv_freqs();
        let want = [
            (0, 1.0),
            (10, 0.12868737343265052),
            (20, 0.016560440080994446),
            (30, 0.001290547928209264),
            (40, 8.570255489881478e-06),
            (45, 3.0744096694909034e-06),
            (50, 1.102883668639601e-06),
            (63, 7.672314972286278e-08),
        ];
        for (i, w) in want {
            let rel = ((f[i] as f64 - w) / w).abs();
            assert!(rel < 1e-6, "freq {i}: {} vs {w}", f[i]);
        }
    }
}
