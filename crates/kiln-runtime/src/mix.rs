//! Choosing per-tensor types under a size budget from a sensitivity table.
//!
//! Model: the loss of a mix is the sum of its tensors' measured losses (each tensor's KL
//! with only that tensor quantized; the usual first-order, independent-errors assumption).
//! Budget: bits per weight over every quantized matrix, as llama.cpp counts it (matrix bits
//! / matrix elements; norms and biases stay f32 and are not counted).
//!
//! Method: an exact multiple-choice knapsack by dynamic programming. Every tensor starts at
//! its cheapest candidate; upgrading it to another candidate costs its extra bits, measured
//! in units of 1/65536 of the whole range (all tensors at their largest candidate minus all
//! at their smallest), rounded up, so the answer never exceeds the budget. The unit does not
//! depend on the target, so a larger budget only ever adds feasible mixes and the chosen
//! loss never rises with it (a greedy marginal-gain pass can: a big upgrade that fits a
//! larger budget may crowd out several small ones). Cost: tensors x choices x 65536 steps.

use kiln_quant::GgmlType;

use crate::calibrate::SensitivityTable;

/// Units the budget range is cut into.
const UNITS: usize = 1 << 16;

/// The chosen type of every tensor of a table, in its order.
#[derive(Debug, Clone, PartialEq)]
pub struct Mix {
    pub types: Vec<GgmlType>,
    /// Bits per weight over the matrices.
    pub bpw: f64,
    /// Sum of the chosen choices' KL (nats per token).
    pub loss: f64,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MixError {
    #[error("--target-bpw must be a number, got {0}")]
    NotANumber(f64),
    #[error("a target of {target} bits per weight is below the smallest mix ({min:.4} bpw: every tensor in its smallest candidate)")]
    BelowSmallest { target: f64, min: f64 },
    #[error("a target of {target} bits per weight is above f16's 16; nothing is quantized there")]
    AboveF16 { target: f64 },
    #[error("the sensitivity table has no tensors")]
    Empty,
    #[error("tensor '{0}' has no candidate types")]
    NoChoices(String),
}

/// Bits per weight of `types` over the table's matrices.
pub fn mix_bpw(table: &SensitivityTable, types: &[GgmlType]) -> f64 {
    let bits: u64 = table
        .tensors
        .iter()
        .zip(types)
        .map(|(t, &ty)| t.bits(ty))
        .sum();
    bits as f64 / elements(table) as f64
}

fn elements(table: &SensitivityTable) -> u64 {
    table.tensors.iter().map(|t| t.n_elements()).sum()
}

/// The least-loss mix whose bits per weight are at most `target_bpw`.
pub fn choose_mix(table: &SensitivityTable, target_bpw: f64) -> Result<Mix, MixError> {
    if !target_bpw.is_finite() {
        return Err(MixError::NotANumber(target_bpw));
    }
    if target_bpw > 16.0 {
        return Err(MixError::AboveF16 { target: target_bpw });
    }
    if table.tensors.is_empty() {
        return Err(MixError::Empty);
    }
    // Per tensor: choices sorted by bits; extra bits over the cheapest.
    let mut opts: Vec<Vec<(u64, f64, GgmlType)>> = Vec::with_capacity(table.tensors.len());
    for t in &table.tensors {
        let mut v: Vec<(u64, f64, GgmlType)> = t
            .choices
            .iter()
            .map(|c| (t.bits(c.ty), c.kl, c.ty))
            .collect();
        if v.is_empty() {
            return Err(MixError::NoChoices(t.name.clone()));
        }
        v.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        opts.push(v);
    }
    let n_el = elements(table) as f64;
    let min_bits: u64 = opts.iter().map(|v| v[0].0).sum();
    let max_bits: u64 = opts.iter().map(|v| v[v.len() - 1].0).sum();
    let budget = target_bpw * n_el;
    if budget < min_bits as f64 {
        return Err(MixError::BelowSmallest {
            target: target_bpw,
            min: min_bits as f64 / n_el,
        });
    }
    let range = max_bits - min_bits;
    let unit = (range as f64 / UNITS as f64).max(1.0);
    // Cost of each choice in units (rounded up: the rounded budget is never exceeded).
    let cost = |v: &(u64, f64, GgmlType), base: u64| ((v.0 - base) as f64 / unit).ceil() as usize;
    // Every tensor at its largest choice, in units (rounding makes it a little over UNITS).
    let full: usize = opts.iter().map(|v| cost(&v[v.len() - 1], v[0].0)).sum();
    let cap = if budget >= max_bits as f64 {
        full
    } else {
        (((budget - min_bits as f64) / unit).floor() as usize).min(full)
    };

    // best[c]: least loss of the tensors so far within c units; pick[i][c]: tensor i's choice.
    let mut best = vec![0f64; cap + 1];
    let mut pick: Vec<Vec<u8>> = Vec::with_capacity(opts.len());
    let mut next = vec![0f64; cap + 1];
    for v in &opts {
        let base = v[0].0;
        let costs: Vec<usize> = v.iter().map(|o| cost(o, base)).collect();
        let mut p = vec![0u8; cap + 1];
        for c in 0..=cap {
            let (mut bl, mut bk) = (f64::INFINITY, 0u8);
            for (k, o) in v.iter().enumerate() {
                if costs[k] <= c {
                    let l = best[c - costs[k]] + o.1;
                    // Strictly better only: ties keep the cheaper choice.
                    if l < bl {
                        (bl, bk) = (l, k as u8);
                    }
                }
            }
            next[c] = bl;
            p[c] = bk;
        }
        std::mem::swap(&mut best, &mut next);
        pick.push(p);
    }
    // Walk back from the full budget.
    let mut types = vec![GgmlType::F32; opts.len()];
    let mut c = cap;
    let mut loss = 0.0;
    for i in (0..opts.len()).rev() {
        let k = pick[i][c] as usize;
        let o = &opts[i][k];
        types[i] = o.2;
        loss += o.1;
        c -= cost(o, opts[i][0].0);
    }
    Ok(Mix {
        bpw: mix_bpw(table, &types),
        types,
        loss,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibrate::{Choice, TensorSensitivity};
    use GgmlType::*;

    fn tensor(name: &str, rows: usize, kl: [f64; 3]) -> TensorSensitivity {
        TensorSensitivity {
            name: name.into(),
            rows,
            cols: 256,
            choices: [Q4_0, Q5_0, Q8_0]
                .into_iter()
                .zip(kl)
                .map(|(ty, kl)| Choice { ty, kl })
                .collect(),
        }
    }

    fn table() -> SensitivityTable {
        SensitivityTable {
            tokens: 64,
            tensors: vec![
                tensor("a", 64, [0.10, 0.04, 0.001]),
                tensor("b", 64, [0.50, 0.20, 0.002]),
                tensor("c", 128, [0.05, 0.02, 0.0005]),
                tensor("d", 32, [0.30, 0.01, 0.0001]),
            ],
        }
    }

    #[test]
    fn the_sensitive_tensor_gets_the_bits() {
        // Two tensors of one size; budget for one upgrade to Q8_0 (4.5 -> 6.5 average).
        let t = SensitivityTable {
            tokens: 8,
            tensors: vec![
                tensor("robust", 64, [0.01, 0.005, 0.0]),
                tensor("sensitive", 64, [0.9, 0.3, 0.0]),
            ],
        };
        let m = choose_mix(&t, 6.5).unwrap();
        assert_eq!(m.types, vec![Q4_0, Q8_0]);
        assert!(m.bpw <= 6.5);
        assert!((m.loss - 0.01).abs() < 1e-12);
    }

    #[test]
    fn within_budget_and_monotone() {
        let t = table();
        let mut last = f64::INFINITY;
        let mut b = 4.5;
        while b <= 8.6 {
            let m = choose_mix(&t, b).unwrap();
            assert!(m.bpw <= b + 1e-12, "bpw {} over {b}", m.bpw);
            assert!(
                m.loss <= last + 1e-15,
                "loss rose at {b}: {} > {last}",
                m.loss
            );
            last = m.loss;
            b += 0.05;
        }
        // Everything at Q8_0 at its size.
        let top = choose_mix(&t, 8.5).unwrap();
        assert!(top.types.iter().all(|&t| t == Q8_0));
        assert_eq!(choose_mix(&t, 16.0).unwrap().types, top.types);
    }

    #[test]
    fn exact_on_small_tables() {
        // Brute force over every mix of a 4-tensor table: the chosen loss is the best within
        // the budget, and no worse than the best within the budget less the rounding slack
        // (one unit per tensor).
        let t = table();
        let el = elements(&t) as f64;
        let slack = 4.0 * (4.0 * el / UNITS as f64) / el;
        for b in [4.6, 5.0, 5.3, 5.8, 6.4, 7.2] {
            let m = choose_mix(&t, b).unwrap();
            let (mut best, mut best_slack) = (f64::INFINITY, f64::INFINITY);
            for code in 0..81usize {
                let ks: Vec<usize> = (0..4).map(|i| code / 3usize.pow(i) % 3).collect();
                let types: Vec<GgmlType> = ks.iter().map(|&k| [Q4_0, Q5_0, Q8_0][k]).collect();
                let bpw = mix_bpw(&t, &types);
                let l: f64 = t
                    .tensors
                    .iter()
                    .zip(&ks)
                    .map(|(x, &k)| x.choices[k].kl)
                    .sum();
                if bpw <= b {
                    best = best.min(l);
                }
                if bpw <= b - slack {
                    best_slack = best_slack.min(l);
                }
            }
            assert!(m.loss >= best - 1e-12, "at {b}: {} below {best}", m.loss);
            assert!(
                m.loss <= best_slack + 1e-12,
                "at {b}: {} vs {best_slack}",
                m.loss
            );
        }
    }

    #[test]
    fn budget_errors() {
        let t = table();
        assert!(matches!(
            choose_mix(&t, 4.0),
            Err(MixError::BelowSmallest { .. })
        ));
        assert!(matches!(
            choose_mix(&t, 16.5),
            Err(MixError::AboveF16 { .. })
        ));
        assert!(matches!(
            choose_mix(&t, f64::NAN),
            Err(MixError::NotANumber(_))
        ));
        let e = choose_mix(&t, 3.0).unwrap_err().to_string();
        assert!(e.contains("4.5000"), "{e}");
    }
}
