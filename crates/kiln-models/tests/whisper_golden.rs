//! Whisper tiny.en (CTranslate2 fp16) on jfk.wav against the golden from an independent
//! numpy forward pass: greedy ids, no timestamps, one 30 s padded window, 80 mel bins.

use kiln_backend::cpu::CpuBackend;
use kiln_backend::Backend;
use kiln_models::whisper::{LoadOptions, Whisper};

mod jfk;
use jfk::{golden, jfk_cross, model_dir};

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy decoding until end-of-text (50256) or `max` tokens; also the logits per step.
fn greedy<B: Backend>(
    b: &B,
    m: &Whisper<B>,
    prompt: &[u32],
    max: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let cross = jfk_cross(b, m);
    let mut st = m.decoder_state(b);
    let mut logits = m.decode(b, &mut st, &cross, prompt, 0).unwrap().to_vec();
    let mut pos = prompt.len();
    let (mut ids, mut all) = (Vec::new(), Vec::new());
    for _ in 0..max {
        let next = argmax(&logits);
        all.push(logits.clone());
        if next == 50256 {
            break;
        }
        ids.push(next);
        logits = m.decode(b, &mut st, &cross, &[next], pos).unwrap().to_vec();
        pos += 1;
    }
    (ids, all)
}

#[test]
fn tiny_en_jfk_greedy_ids_match_golden() {
    let (prompt, want) = golden();
    let b = CpuBackend::new(2);
    let (m, _f) = Whisper::open(&b, &model_dir(), LoadOptions::default()).unwrap();
    assert_eq!(m.cfg.n_mels, 80);
    assert_eq!(m.cfg.n_vocab, 51864);
    let (ids, _) = greedy(&b, &m, &prompt, 64);
    assert_eq!(ids, want);
}

/// `--quant q8_0`: the decoder in Q8_0 and the encoder too, whose products run as int8
/// block products on a CPU with AVX-512 VNNI and without AMX (bf16 tiles with AMX). The
/// same ids as the golden on jfk.wav, whichever the CPU runs (CI runs this file with
/// `KILN_NO_AMX=1` too).
#[test]
fn tiny_en_jfk_q8_0_greedy_ids_match_golden() {
    let (prompt, want) = golden();
    let b = CpuBackend::new(2);
    let opts = LoadOptions {
        quant: Some(kiln_quant::GgmlType::Q8_0),
        ..LoadOptions::default()
    };
    let (m, _f) = Whisper::open(&b, &model_dir(), opts).unwrap();
    let (ids, _) = greedy(&b, &m, &prompt, 64);
    assert_eq!(ids, want);
}

/// A beam step in one pass (`decode_beams`) gives each hypothesis the logits its own
/// forward gives it, bit for bit: three hypotheses forked from the prompt, each continued by
/// a different token, for a few steps, fp16 and Q8_0 weights.
#[test]
fn beams_in_one_pass_equal_one_forward_each() {
    let (prompt, want) = golden();
    let b = CpuBackend::new(2);
    for quant in [None, Some(kiln_quant::GgmlType::Q8_0)] {
        let opts = LoadOptions {
            quant,
            ..LoadOptions::default()
        };
        let (m, _f) = Whisper::open(&b, &model_dir(), opts).unwrap();
        let cross = jfk_cross(&b, &m);
        let n = 3;
        let mut one: Vec<_> = (0..n).map(|_| m.decoder_state(&b)).collect();
        let mut all: Vec<_> = (0..n).map(|_| m.decoder_state(&b)).collect();
        for st in one.iter_mut().chain(all.iter_mut()) {
            m.decode(&b, st, &cross, &prompt, 0).unwrap();
        }
        let mut scratch = m.beam_scratch(&b, n);
        // The golden's tokens, shifted by hypothesis: each row continues differently.
        let mut pos = prompt.len();
        for step in 0..4 {
            let toks: Vec<u32> = (0..n).map(|j| want[step + j]).collect();
            let rows = m
                .decode_beams(&b, &mut all, &mut scratch, &cross, &toks, pos)
                .unwrap()
                .to_vec();
            let vocab = m.cfg.n_vocab;
            assert_eq!(rows.len(), n * vocab);
            for (j, st) in one.iter_mut().enumerate() {
                let alone = m.decode(&b, st, &cross, &[toks[j]], pos).unwrap();
                let row = &rows[j * vocab..(j + 1) * vocab];
                let same = alone
                    .iter()
                    .zip(row)
                    .all(|(a, r)| a.to_bits() == r.to_bits());
                assert!(same, "{quant:?} step {step} hypothesis {j}: logits differ");
            }
            pos += 1;
        }
        // Too many tokens for the sequences, or for the scratch, is an error.
        let e = m.decode_beams(&b, &mut all[..2], &mut scratch, &cross, &[1, 2, 3], pos);
        assert!(e.is_err());
    }
}
