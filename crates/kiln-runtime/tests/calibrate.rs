//! Calibrated quantization on the tiny Qwen3 Hugging Face fixture (2 layers, dim 64, vocab
//! 320, f32 weights): sensitivities, the chooser over them, and their errors.

use std::path::{Path, PathBuf};

use kiln_backend::cpu::CpuBackend;
use kiln_quant::GgmlType::{self, *};
use kiln_runtime::{choose_mix, CalibOptions, Llm, MixError, SensitivityTable};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../kiln-models/tests/fixtures/hf/qwen3")
}

/// Deterministic token ids below the vocabulary (the fixture's tokenizer is random too).
fn tokens(n: usize) -> Vec<u32> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 320) as u32
        })
        .collect()
}

fn opts(n: usize) -> CalibOptions {
    CalibOptions {
        tokens: n,
        ctx: 24,
        candidates: vec![Q4_0, Q4_K, Q5_0, Q8_0],
    }
}

fn bits(ty: GgmlType, cols: usize) -> usize {
    ty.row_bytes(cols).unwrap()
}

fn measure() -> (Llm<CpuBackend>, SensitivityTable) {
    let mut llm = Llm::load(CpuBackend::new(2), &fixture()).unwrap();
    let t = tokens(48);
    let mut steps = 0;
    let table = llm
        .sensitivities(&t, false, &opts(48), &mut |_, _, _| steps += 1)
        .unwrap();
    assert!(steps > table.tensors.len());
    (llm, table)
}

#[test]
fn sensitivities_are_sane_and_leave_the_model_as_loaded() {
    let before = {
        let llm = Llm::load(CpuBackend::new(2), &fixture()).unwrap();
        let mut s = llm.session(24, 24);
        s.eval(&tokens(24), true).unwrap()
    };
    let (llm, table) = measure();
    // Every matrix once (tied output: the embedding table), in GGUF order.
    assert_eq!(table.tensors.len(), 1 + 2 * 7);
    assert_eq!(table.tensors[0].name, "token_embd.weight");
    assert_eq!(table.tokens, 48);
    for t in &table.tensors {
        // Rows of 64 or 128: Q4_K falls back to Q5_0, so three distinct candidates.
        let tys: Vec<GgmlType> = t.choices.iter().map(|c| c.ty).collect();
        assert_eq!(tys, vec![Q4_0, Q5_0, Q8_0], "{}", t.name);
        for c in &t.choices {
            assert!(c.kl.is_finite() && c.kl >= 0.0, "{} {:?}", t.name, c);
        }
        // 8 bits disturb the output less than 4.
        let (q4, q8) = (t.choices[0].kl, t.choices[2].kl);
        assert!(q4 > 0.0 && q8 < q4, "{}: q4_0 {q4} q8_0 {q8}", t.name);
    }
    // The swapped weights were put back: same logits as a fresh load.
    let mut s = llm.session(24, 24);
    assert_eq!(s.eval(&tokens(24), true).unwrap(), before);
    // The JSON form reads back as the same table.
    let back = SensitivityTable::from_json(&table.to_json(), Path::new("t.json")).unwrap();
    assert_eq!(back, table);
}

#[test]
fn chooser_meets_the_budget_and_never_loses_with_more_bits() {
    let (_, table) = measure();
    let mut last = f64::INFINITY;
    let mut b = 4.5;
    while b <= 8.6 {
        let m = choose_mix(&table, b).unwrap();
        assert!(m.bpw <= b, "bpw {} over {b}", m.bpw);
        assert!(m.loss <= last, "loss rose at {b}: {} > {last}", m.loss);
        // The estimate is the sum of the chosen choices' KL.
        let sum: f64 = table
            .tensors
            .iter()
            .zip(&m.types)
            .map(|(t, ty)| t.choices.iter().find(|c| c.ty == *ty).unwrap().kl)
            .sum();
        assert!((sum - m.loss).abs() < 1e-12);
        // Exchange argument: of two tensors with the same shape and candidates, the one kept
        // coarser is not the one whose upgrade would have bought more.
        for (i, a) in table.tensors.iter().enumerate() {
            for (j, c) in table.tensors.iter().enumerate() {
                let same = a.rows * a.cols == c.rows * c.cols && a.cols == c.cols;
                let (ta, tc) = (m.types[i], m.types[j]);
                if !same || bits(ta, a.cols) >= bits(tc, c.cols) {
                    continue;
                }
                let kl = |t: &kiln_runtime::TensorSensitivity, ty| {
                    t.choices.iter().find(|x| x.ty == ty).unwrap().kl
                };
                let kept = kl(a, ta) + kl(c, tc);
                let swapped = kl(a, tc) + kl(c, ta);
                assert!(
                    kept <= swapped + 1e-15,
                    "at {b}: {} in {} and {} in {} ({kept}), swapped {swapped}",
                    a.name,
                    ta.name(),
                    c.name,
                    tc.name()
                );
            }
        }
        last = m.loss;
        b += 0.25;
    }
    // Somewhere in between, the mix is really mixed.
    let m = choose_mix(&table, 6.0).unwrap();
    assert!(m.types.contains(&Q4_0) || m.types.contains(&Q5_0));
    assert!(m.types.contains(&Q8_0));
}

#[test]
fn measured_mix_kl_follows_the_budget() {
    let (mut llm, table) = measure();
    let t = tokens(48);
    let kl = |llm: &mut Llm<CpuBackend>, types: &[GgmlType]| {
        llm.mix_kl(&t, false, &opts(48), types).unwrap()
    };
    let n = table.tensors.len();
    let all_q8 = kl(&mut llm, &vec![Q8_0; n]);
    let (lo, hi) = (kl(&mut llm, &vec![Q4_0; n]), all_q8);
    assert!(hi < lo, "all Q8_0 {hi} vs all Q4_0 {lo}");
    let (m5, m7) = (
        choose_mix(&table, 5.0).unwrap(),
        choose_mix(&table, 7.0).unwrap(),
    );
    let (k5, k7) = (kl(&mut llm, &m5.types), kl(&mut llm, &m7.types));
    assert!(
        k7 < k5 && k5 < lo,
        "measured: 5 bpw {k5}, 7 bpw {k7}, all Q4_0 {lo}"
    );
    // A wrong length is an error.
    assert!(llm.mix_kl(&t, false, &opts(48), &[Q4_0]).is_err());
}

#[test]
fn budget_and_text_errors() {
    let (mut llm, table) = measure();
    assert!(matches!(
        choose_mix(&table, 4.2),
        Err(MixError::BelowSmallest { .. })
    ));
    assert!(matches!(
        choose_mix(&table, 17.0),
        Err(MixError::AboveF16 { .. })
    ));
    let e = llm
        .sensitivities(&tokens(40), false, &opts(48), &mut |_, _, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("40 tokens") && e.contains("longer text"), "{e}");
    let mut bad = opts(48);
    bad.candidates = vec![Q2_K];
    let e = llm
        .sensitivities(&tokens(48), false, &bad, &mut |_, _, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("Q2_K"), "{e}");
}
