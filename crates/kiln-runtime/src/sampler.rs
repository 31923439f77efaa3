//! Token sampling: penalties, then top-k, top-p, min-p, temperature, then a seeded draw.
//! Temperature <= 0 is greedy (argmax after penalties).

use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1.0 disables.
    pub top_p: f32,
    /// 0.0 disables.
    pub min_p: f32,
    /// 1.0 disables. Divides positive logits (multiplies negative) of recent tokens.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0x5eed,
        }
    }
}

impl SamplerConfig {
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        }
    }

    /// Picks the argmax of the logits as they come (greedy, no penalty changes them): the
    /// pick a backend can make on the device (ties: the lowest id, as [`Sampler`] breaks them).
    pub fn is_plain_argmax(&self) -> bool {
        self.temperature <= 0.0 && !self.penalises()
    }

    fn penalises(&self) -> bool {
        self.repeat_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }

    /// Some(k) when a pick needs only the k largest logits (sampling with top-k and no
    /// penalties): [`Sampler::sample_candidates`] then takes any list holding them.
    pub fn top_k_only(&self) -> Option<usize> {
        (self.temperature > 0.0 && !self.penalises() && self.top_k > 0).then_some(self.top_k)
    }
}

pub struct Sampler {
    pub cfg: SamplerConfig,
    rng: SplitMix64,
    cand: Vec<(f32, u32)>,
    /// Scratch for the unfiltered draw's weights (kept from token to token).
    weights: Vec<f32>,
    counts: HashMap<u32, u32>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Self {
        let rng = SplitMix64(cfg.seed);
        Sampler {
            cfg,
            rng,
            cand: Vec::new(),
            weights: Vec::new(),
            counts: HashMap::new(),
        }
    }

    /// Picks the next token from `logits` given the tokens so far (`history`).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        self.draw(logits, history, None)
    }

    /// Picks the token at a position for which a drafter guessed `draft` (speculative
    /// decoding). Greedy: the argmax, as `sample`. Otherwise the guess is kept with its
    /// probability p(draft), and when refused a token is drawn from p without it; the result
    /// has `sample`'s distribution exactly (speculative sampling with a deterministic
    /// drafter), though it draws from the random stream differently.
    pub fn sample_draft(&mut self, logits: &[f32], history: &[u32], draft: u32) -> u32 {
        self.draw(logits, history, Some(draft))
    }

    /// [`Sampler::sample`]'s pick from (logit, id) candidates that include the `k` largest
    /// logits, for `k` = [`SamplerConfig::top_k_only`]: the same pick as from all the logits
    /// (the same top k in the same order, the same draws from the random stream).
    /// The list is taken over, not copied (`candidates` gets another buffer back to fill
    /// next time: a CPU row's candidates are the whole vocabulary).
    pub fn sample_candidates(&mut self, candidates: &mut Vec<(f32, u32)>) -> u32 {
        debug_assert!(self.cfg.top_k_only().is_some());
        std::mem::swap(&mut self.cand, candidates);
        self.pick(None)
    }

    fn draw(&mut self, logits: &[f32], history: &[u32], draft: Option<u32>) -> u32 {
        self.cand.clear();
        self.cand
            .extend(logits.iter().enumerate().map(|(i, &l)| (l, i as u32)));
        self.apply_penalties(history);
        self.pick(draft)
    }

    /// The pick from `self.cand` (penalties applied).
    fn pick(&mut self, draft: Option<u32>) -> u32 {
        if self.cfg.temperature <= 0.0 {
            return argmax(&self.cand);
        }
        let c = &self.cfg;
        if c.top_k == 0 && c.top_p >= 1.0 && c.min_p <= 0.0 {
            return self.pick_unfiltered(draft);
        }
        let (c2, cand) = (&self.cfg, &mut self.cand);
        top_sorted(cand, c2.top_k);
        // Probabilities at temperature 1 for top-p / min-p (as the filters are usually defined).
        let max = cand[0].0;
        let probs: Vec<f32> = cand.iter().map(|&(l, _)| (l - max).exp()).collect();
        let total: f32 = probs.iter().sum();
        let mut keep = cand.len();
        if c2.top_p < 1.0 {
            let mut cum = 0.0;
            for (i, p) in probs.iter().enumerate() {
                cum += p / total;
                if cum >= c2.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        if c2.min_p > 0.0 {
            let floor = c2.min_p * probs[0];
            keep = keep.min(probs.iter().take_while(|&&p| p >= floor).count().max(1));
        }
        cand.truncate(keep);
        let weights: Vec<f32> = cand
            .iter()
            .map(|&(l, _)| ((l - max) / c2.temperature).exp())
            .collect();
        if let Some(id) = draw_weighted(&mut self.rng, cand, &weights, draft) {
            return id;
        }
        cand.iter()
            .rev()
            .map(|c| c.1)
            .find(|&id| Some(id) != draft)
            .or(draft)
            .unwrap_or(cand[cand.len() - 1].1)
    }

    /// The pick from all of `self.cand` at the temperature, no filter: softmax(l / T) drawn
    /// in one pass in the candidates' order (the distribution [`Self::pick`]'s sorted scan
    /// draws from, without sorting a vocabulary: 151936 logits sorted cost ~3.5 ms a
    /// token, this pass ~0.3 ms). NaN logits never win; with no finite logit, the argmax.
    fn pick_unfiltered(&mut self, draft: Option<u32>) -> u32 {
        let t = self.cfg.temperature;
        let max = self
            .cand
            .iter()
            .map(|c| c.0)
            .filter(|l| !l.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            return argmax(&self.cand);
        }
        self.weights.clear();
        self.weights.extend(self.cand.iter().map(|&(l, _)| {
            let w = ((l - max) / t).exp();
            if w.is_nan() {
                0.0
            } else {
                w
            }
        }));
        if let Some(id) = draw_weighted(&mut self.rng, &self.cand, &self.weights, draft) {
            return id;
        }
        let last = self
            .cand
            .iter()
            .zip(&self.weights)
            .rev()
            .find(|(c, &w)| w > 0.0 && Some(c.1) != draft)
            .map(|(c, _)| c.1);
        // Rounding left the draw without a pick: the last token with weight.
        last.or(draft).unwrap_or_else(|| argmax(&self.cand))
    }

    fn apply_penalties(&mut self, history: &[u32]) {
        let c = &self.cfg;
        let no_repeat = c.repeat_penalty == 1.0;
        if no_repeat && c.presence_penalty == 0.0 && c.frequency_penalty == 0.0 {
            return;
        }
        self.counts.clear();
        let start = history.len().saturating_sub(c.repeat_last_n);
        for &t in &history[start..] {
            *self.counts.entry(t).or_insert(0) += 1;
        }
        for (&t, &n) in &self.counts {
            let Some(cand) = self.cand.get_mut(t as usize) else {
                continue;
            };
            let l = &mut cand.0;
            if *l > 0.0 {
                *l /= c.repeat_penalty;
            } else {
                *l *= c.repeat_penalty;
            }
            *l -= c.presence_penalty + c.frequency_penalty * n as f32;
        }
    }
}

/// An id of `cand` drawn with probability proportional to its weight (zero weights never);
/// a draft, when given, is kept with its probability and otherwise left out of the draw
/// (speculative sampling: the result has the plain draw's distribution). None when rounding
/// leaves the scan without a pick.
fn draw_weighted(
    rng: &mut SplitMix64,
    cand: &[(f32, u32)],
    weights: &[f32],
    draft: Option<u32>,
) -> Option<u32> {
    let sum: f32 = weights.iter().sum();
    let mut total = sum;
    if let Some(d) = draft {
        let w_d = cand
            .iter()
            .zip(weights)
            .find(|(c, _)| c.1 == d)
            .map_or(0.0, |(_, &w)| w);
        if rng.next_f32() * sum < w_d {
            return Some(d);
        }
        total = sum - w_d;
    }
    let mut r = rng.next_f32() * total;
    for (&w, &(_, id)) in weights.iter().zip(cand) {
        if Some(id) == draft || w <= 0.0 {
            continue;
        }
        r -= w;
        if r <= 0.0 {
            return Some(id);
        }
    }
    None
}

/// Descending by logit, ties by lower id first (a total order, so runs repeat exactly).
fn by_logit_desc(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// `cand` cut to its first `k` in [`by_logit_desc`] order and sorted so (all of it when k is
/// 0 or not smaller): the same list as sorting everything and truncating, but the top k are
/// selected in linear time first (a vocabulary of 150k sorted whole costs milliseconds a
/// token).
fn top_sorted(cand: &mut Vec<(f32, u32)>, k: usize) {
    if k > 0 && k < cand.len() {
        cand.select_nth_unstable_by(k - 1, by_logit_desc);
        cand.truncate(k);
    }
    cand.sort_unstable_by(by_logit_desc);
}

fn argmax(cand: &[(f32, u32)]) -> u32 {
    let mut best = (f32::NEG_INFINITY, 0u32);
    for &(l, id) in cand {
        if l > best.0 {
            best = (l, id);
        }
    }
    best.1
}

/// A small, seedable generator (SplitMix64): runs with the same seed repeat exactly.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With no filter (top-k 0, top-p 1, min-p 0) the one-pass draw follows softmax(l / T):
    /// 60000 seeded draws over 6 logits (one NaN, one -inf: never drawn) land within 4
    /// standard deviations of each probability; and a draft is kept or refused so that
    /// the result has the same distribution.
    #[test]
    fn unfiltered_draw_follows_the_softmax() {
        let logits = [1.0f32, f32::NAN, 2.5, -0.5, f32::NEG_INFINITY, 2.0];
        let t = 0.8f32;
        let w: Vec<f64> = logits
            .iter()
            .map(|&l| {
                if l.is_finite() {
                    ((l - 2.5) / t).exp() as f64
                } else {
                    0.0
                }
            })
            .collect();
        let total: f64 = w.iter().sum();
        for draft in [None, Some(5u32)] {
            let mut s = Sampler::new(SamplerConfig {
                temperature: t,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed: 3,
                ..Default::default()
            });
            let n = 60000;
            let mut counts = [0usize; 6];
            for _ in 0..n {
                let id = match draft {
                    None => s.sample(&logits, &[]),
                    Some(d) => s.sample_draft(&logits, &[], d),
                };
                counts[id as usize] += 1;
            }
            for (i, &c) in counts.iter().enumerate() {
                let p = w[i] / total;
                let sd = (n as f64 * p * (1.0 - p)).sqrt();
                let got = c as f64;
                assert!(
                    (got - n as f64 * p).abs() <= 4.0 * sd + 1e-9,
                    "{draft:?}: token {i} drawn {c} times, expected {:.0} +- {sd:.0}",
                    n as f64 * p
                );
            }
        }
    }

    /// Selecting the top k first gives exactly the list sorting everything and truncating
    /// gives, ties (same logit, several ids) and NaNs included.
    #[test]
    fn top_k_selection_equals_full_sort() {
        let mut rng = SplitMix64(9);
        for (n, k) in [
            (1000, 40),
            (1000, 1),
            (1000, 999),
            (1000, 1000),
            (1000, 0),
            (7, 3),
        ] {
            let v: Vec<(f32, u32)> = (0..n)
                .map(|i| {
                    let r = rng.next_f32();
                    // Coarse values, so many ties; an occasional NaN.
                    let l = if i % 97 == 5 {
                        f32::NAN
                    } else {
                        (r * 20.0).floor()
                    };
                    (l, i as u32)
                })
                .collect();
            let mut want = v.clone();
            want.sort_unstable_by(by_logit_desc);
            if k > 0 && k < n {
                want.truncate(k);
            }
            let mut got = v;
            top_sorted(&mut got, k);
            let bits =
                |x: &[(f32, u32)]| x.iter().map(|&(l, i)| (l.to_bits(), i)).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "n {n} k {k}");
        }
    }

    /// Picking from a superset of the top k (shuffled, as a device's chunks give it) is
    /// picking from all the logits, draw for draw.
    #[test]
    fn candidates_pick_what_all_logits_pick() {
        let mut rng = SplitMix64(11);
        let logits: Vec<f32> = (0..5000)
            .map(|_| (rng.next_f32() * 40.0).floor() / 4.0)
            .collect();
        let cfg = SamplerConfig {
            temperature: 0.9,
            top_k: 40,
            seed: 5,
            ..Default::default()
        };
        let k = cfg.top_k_only().unwrap();
        // The top 3k in some order other than the sorted one.
        let mut all: Vec<(f32, u32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (l, i as u32))
            .collect();
        top_sorted(&mut all, 3 * k);
        all.reverse();
        let (mut a, mut b) = (Sampler::new(cfg.clone()), Sampler::new(cfg));
        for _ in 0..200 {
            assert_eq!(
                a.sample(&logits, &[]),
                b.sample_candidates(&mut all.clone())
            );
        }
    }

    #[test]
    fn greedy_takes_argmax_after_penalty() {
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            ..SamplerConfig::greedy()
        });
        let logits = [1.0, 3.0, 2.5];
        assert_eq!(s.sample(&logits, &[]), 1);
        // 3.0 / 2 = 1.5 < 2.5
        assert_eq!(s.sample(&logits, &[1]), 2);
    }

    #[test]
    fn top_k_one_is_greedy_and_seed_repeats() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 101) as f32 / 10.0).collect();
        let best = argmax(
            &logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (l, i as u32))
                .collect::<Vec<_>>(),
        );
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.5,
            top_k: 1,
            ..Default::default()
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&logits, &[]), best);
        }
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        };
        let a: Vec<u32> = {
            let mut s = Sampler::new(cfg.clone());
            (0..50).map(|_| s.sample(&logits, &[])).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(cfg);
            (0..50).map(|_| s.sample(&logits, &[])).collect()
        };
        assert_eq!(a, b);
        assert!(
            a.iter().any(|&t| t != a[0]),
            "temperature 1 over 100 tokens should vary"
        );
    }

    #[test]
    fn min_p_and_top_p_cut_the_tail() {
        // One dominant token: min_p 0.5 leaves only it.
        let logits = [10.0, 0.0, 0.0, 0.0];
        let mut s = Sampler::new(SamplerConfig {
            temperature: 5.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            ..Default::default()
        });
        for _ in 0..50 {
            assert_eq!(s.sample(&logits, &[]), 0);
        }
        let mut s = Sampler::new(SamplerConfig {
            temperature: 5.0,
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            ..Default::default()
        });
        for _ in 0..50 {
            assert_eq!(s.sample(&logits, &[]), 0);
        }
    }

    #[test]
    fn sampling_with_a_draft_keeps_the_distribution() {
        // p = softmax([2, 1, 0, 1.5]); the draft is token 1, then a filtered-out token.
        let logits = [2.0, 1.0, 0.0, 1.5];
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 3,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        };
        let kept = [2.0f32, 1.0, f32::NEG_INFINITY, 1.5];
        let z: f32 = kept.iter().map(|l| l.exp()).sum();
        for draft in [1u32, 2] {
            let mut s = Sampler::new(cfg.clone());
            let n = 40_000;
            let mut counts = [0usize; 4];
            for _ in 0..n {
                counts[s.sample_draft(&logits, &[], draft) as usize] += 1;
            }
            for (i, &c) in counts.iter().enumerate() {
                let p = kept[i].exp() / z;
                let f = c as f32 / n as f32;
                assert!((f - p).abs() < 0.01, "draft {draft}: token {i} {f} vs {p}");
            }
        }
        let mut g = Sampler::new(SamplerConfig::greedy());
        assert_eq!(g.sample_draft(&logits, &[], 3), 0);
        assert_eq!(g.sample_draft(&logits, &[], 0), 0);
    }

    #[test]
    fn presence_and_frequency_penalties() {
        let logits = [2.0, 1.9];
        let mut s = Sampler::new(SamplerConfig {
            presence_penalty: 0.06,
            frequency_penalty: 0.06,
            ..SamplerConfig::greedy()
        });
        assert_eq!(s.sample(&logits, &[0]), 1); // 2.0 - 0.12 < 1.9
        assert_eq!(s.sample(&logits, &[]), 0);
    }
}
