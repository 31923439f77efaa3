//! What llguidance's masks cost over a vocabulary: a JSON schema's masks computed step by
//! step, each step's token drawn at random from the allowed ones (as a model with random
//! weights picks), the document restarted when it ends. Prints the distribution of a mask's
//! time and the mean excess over a device step (what a mask computed beside a forward of that
//! length adds to the step), and the slowest masks with the text before them.
//!
//! cargo run --release -p kiln-runtime --example mask_times -- TOKENIZER.json SCHEMA.json \
//!     [STEPS (3000)] [STEP_US (700)] [--llguidance-slices]
use kiln_runtime::grammar::{Grammar, Grammars};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut a: Vec<String> = std::env::args().collect();
    let theirs = a.iter().any(|s| s == "--llguidance-slices");
    a.retain(|s| s != "--llguidance-slices");
    if a.len() < 3 {
        return Err("usage: mask_times TOKENIZER.json SCHEMA.json [STEPS] [STEP_US]".into());
    }
    let tok = kiln_text::Tokenizer::from_file(&a[1])?;
    let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&a[2])?)?;
    let steps: usize = a.get(3).map_or(Ok(3000), |s| s.parse())?;
    let step_us: f64 = a.get(4).map_or(Ok(700.0), |s| s.parse())?;
    let t = Instant::now();
    let g = match theirs {
        true => Grammars::with_llguidance_slices(&tok)?,
        false => Grammars::new(&tok)?,
    };
    println!(
        "vocabulary tables: {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let mut c = g.compile(&Grammar::JsonSchema(schema))?;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let (mut ts, mut text, mut slow) = (Vec::new(), Vec::new(), Vec::new());
    let mut acc_us = Vec::new();
    for _ in 0..steps {
        let t = Instant::now();
        c.prepare();
        let dt = t.elapsed().as_secs_f64() * 1e6;
        ts.push(dt);
        let w = c.allowed_words().ok_or("the grammar failed")?.to_vec();
        let allowed: Vec<u32> = (0..w.len() * 32)
            .filter(|&i| w[i / 32] >> (i % 32) & 1 == 1)
            .map(|i| i as u32)
            .collect();
        if dt > step_us {
            let tail = tok.decode(&text[text.len().saturating_sub(8)..], false)?;
            slow.push((dt, allowed.len(), tail));
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let p = allowed[(rng % allowed.len() as u64) as usize];
        let t = Instant::now();
        let accepted = !g.is_end(p) && c.accept(p).is_ok();
        acc_us.push(t.elapsed().as_secs_f64() * 1e6);
        if !accepted || c.done() {
            c.reset()?;
            text.clear();
        } else {
            text.push(p);
        }
    }
    slow.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (dt, n, t) in slow.iter().take(10) {
        println!("{dt:7.0} us  {n:6} allowed  after ...{t:?}");
    }
    let n = ts.len() as f64;
    let mean = ts.iter().sum::<f64>() / n;
    let excess = ts.iter().map(|t| (t - step_us).max(0.0)).sum::<f64>() / n;
    ts.sort_by(|a, b| a.total_cmp(b));
    let q = |f: f64| ts[((ts.len() - 1) as f64 * f) as usize];
    println!(
        "{steps} masks: mean {mean:.1} us, median {:.1}, p90 {:.1}, p99 {:.1}, max {:.1}; \
         mean excess over a {step_us} us step {excess:.1} us",
        q(0.5),
        q(0.9),
        q(0.99),
        q(1.0)
    );
    acc_us.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{} accepts: mean {:.1} us, median {:.1}, p90 {:.1}, max {:.1}",
        acc_us.len(),
        acc_us.iter().sum::<f64>() / acc_us.len() as f64,
        acc_us[acc_us.len() / 2],
        acc_us[(acc_us.len() - 1) * 9 / 10],
        acc_us[acc_us.len() - 1]
    );
    Ok(())
}
