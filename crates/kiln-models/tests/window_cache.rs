//! Sliding-window layers' KV caches (`LlmOps::kv_cache_window`): on the tiny Gemma 3 fixture
//! (window 5 on six of seven layers), a sequence run on caches that hold about a window's
//! positions gets, bit for bit, the logits it gets on caches of every position: in steps of
//! several sizes, long past the window, going back up to a step, two sequences in one
//! forward, and a cache copied from another; and it holds less.

use std::path::Path;

use kiln_backend::cpu::CpuBackend;
use kiln_backend::KvType;
use kiln_models::llm::{HfCheckpoint, Llama, LlamaCache, Logits, SeqChunk};

fn gemma3(b: &CpuBackend) -> Llama<CpuBackend> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/gemma3");
    let ck = HfCheckpoint::open(&dir).unwrap();
    assert_eq!(ck.cfg.layer_window, [5, 5, 5, 5, 5, 0, 5]);
    Llama::load_hf(b, &ck, None).unwrap()
}

/// A reproducible stream of token ids below `vocab`.
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

const N_CTX: usize = 700;
const STEP: usize = 4;

/// Every logit row of `tokens` fed at `pos0` to each of `caches` (one forward).
fn run(
    b: &CpuBackend,
    m: &Llama<CpuBackend>,
    caches: &mut [&mut LlamaCache<CpuBackend>],
    tokens: &[&[u32]],
    pos0: &[usize],
) -> Vec<f32> {
    let rows: usize = tokens.iter().map(|t| t.len()).sum();
    let mut sc = m.new_scratch(b, rows, caches.len(), rows);
    let mut seqs: Vec<SeqChunk<'_, CpuBackend>> = caches
        .iter_mut()
        .zip(tokens)
        .zip(pos0)
        .map(|((c, &t), &p)| SeqChunk {
            cache: &mut **c,
            tokens: t,
            pos0: p,
        })
        .collect();
    let n = m.forward_seqs(b, &mut sc, &mut seqs, Logits::All).unwrap();
    m.logits(b, &mut sc, n).to_vec()
}

#[test]
fn window_caches_give_the_full_caches_logits() {
    let b = CpuBackend::new(2);
    let m = gemma3(&b);
    let vocab = m.cfg.vocab_size;
    for ty in [KvType::F32, KvType::F16] {
        let mut full = m.new_cache_kv(&b, N_CTX, N_CTX, ty).unwrap();
        let mut win = m.new_cache_kv(&b, N_CTX, STEP, ty).unwrap();
        let (hf, hw) = (full.held_bytes(&b), win.held_bytes(&b));
        // (A packed cache's bytes include an f32 layer to widen into, the global layer's
        // full length in both.)
        let less = if ty == KvType::F32 {
            hw * 2 < hf
        } else {
            hw < hf
        };
        assert!(less, "{}: window cache {hw} B, full {hf} B", ty.name());
        let toks = tokens(N_CTX, vocab, 7);
        let (mut pos, mut step) = (0, 0);
        while pos < N_CTX - STEP {
            // Steps of 1..=4 positions; now and then one goes back first (a rejected draft,
            // a prompt that differs from what the cache holds near its end).
            let n = 1 + step % STEP;
            if step % 37 == 36 {
                let back = 1 + step % STEP;
                assert!(win.resumes(&b, pos, pos - back));
                pos -= back;
            }
            let t = &toks[(pos + step) % (N_CTX - STEP)..][..n];
            let want = run(&b, &m, &mut [&mut full], &[t], &[pos]);
            let got = run(&b, &m, &mut [&mut win], &[t], &[pos]);
            assert!(
                got == want,
                "{}: positions {pos}..{} differ",
                ty.name(),
                pos + n
            );
            pos += n;
            step += 1;
        }
        // Past the window and a step's worth before it, the window cache cannot go back;
        // the full one can, and both can start over.
        assert!(!win.resumes(&b, pos, pos - 300));
        assert!(full.resumes(&b, pos, pos - 300));
        assert!(win.resumes(&b, pos, 0));
        let t = &toks[..3];
        let want = run(&b, &m, &mut [&mut full], &[t], &[0]);
        assert!(run(&b, &m, &mut [&mut win], &[t], &[0]) == want);
    }
}

#[test]
fn window_caches_in_one_forward_and_copied() {
    let b = CpuBackend::new(2);
    let m = gemma3(&b);
    let vocab = m.cfg.vocab_size;
    let (ta, tb) = (tokens(N_CTX, vocab, 11), tokens(N_CTX, vocab, 12));
    let mut fa = m.new_cache(&b, N_CTX, N_CTX);
    let mut fb = m.new_cache(&b, N_CTX, N_CTX);
    let mut wa = m.new_cache(&b, N_CTX, STEP);
    let mut wb = m.new_cache(&b, N_CTX, STEP);
    // Sequence b starts 3 positions behind a: their caches move at different steps.
    let (mut pa, mut pb) = (0, 0);
    let mut i = 0;
    while pa + STEP < N_CTX - 100 {
        let (na, nb) = (1 + i % STEP, 1 + (i + 1) % STEP);
        let nb = if i == 0 { 1 } else { nb };
        let (sa, sb) = (&ta[pa..pa + na], &tb[pb..pb + nb]);
        let mut want = run(&b, &m, &mut [&mut fa], &[sa], &[pa]);
        want.extend(run(&b, &m, &mut [&mut fb], &[sb], &[pb]));
        let got = run(&b, &m, &mut [&mut wa, &mut wb], &[sa, sb], &[pa, pb]);
        assert!(got == want, "step {i} at positions {pa} and {pb} differs");
        (pa, pb) = (pa + na, pb + nb);
        i += 1;
    }
    // A copy of a's window cache (a prefix another sequence holds) goes on as a does.
    let mut wc = m.new_cache(&b, N_CTX, STEP);
    wc.copy_prefix(&b, &wa, pa);
    let t = &ta[pa..pa + 2];
    let want = run(&b, &m, &mut [&mut fa], &[t], &[pa]);
    assert!(run(&b, &m, &mut [&mut wc], &[t], &[pa]) == want);
    assert!(run(&b, &m, &mut [&mut wa], &[t], &[pa]) == want);
}
