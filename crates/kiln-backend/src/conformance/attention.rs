//! RoPE and attention: one sequence, several in one call, fused norm + RoPE + store, KV copies, dense and self attention.

use super::*;
use crate::{LlmOps, SpeechOps, TensorOps};

fn rope_cfg(style: RopeStyle, dims: usize, head_dim: usize, scaling: RopeScaling) -> RopeConfig {
    RopeConfig {
        style,
        dims,
        head_dim,
        theta: 10000.0,
        scaling,
    }
}

/// `rope`: both styles, partial rotation, Llama 3 and per-frequency scaling, heads of 64,
/// 128 and 80, at positions 0 to 4000, 1 to 70 tokens.
pub fn rope<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x3001));
    let llama3 = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_ctx: 8192.0,
    };
    let factors = RopeScaling::Factors((0..40).map(|i| 1.0 + i as f32 / 10.0).collect());
    for cfg in [
        rope_cfg(RopeStyle::Neox, 64, 64, RopeScaling::None),
        rope_cfg(RopeStyle::Interleaved, 128, 128, RopeScaling::None),
        rope_cfg(RopeStyle::Neox, 64, 128, llama3),
        rope_cfg(RopeStyle::Neox, 80, 80, factors),
        rope_cfg(RopeStyle::Interleaved, 32, 64, RopeScaling::None),
    ] {
        let heads = 3;
        let cols = heads * cfg.head_dim;
        for (pos0, n) in [(0, 1), (0, 70), (130, 9), (4000, 1)] {
            let x = rng.v(n * cols);
            let (mut xt, mut xr) = both(b, &rf, n, cols, &x);
            b.rope(&mut xt, &cfg, heads, pos0, n);
            rf.r.rope(&mut xr, &cfg, heads, pos0, n);
            let case = format!(
                "{:?} dims={} hd={} {:?} pos0={pos0} n={n}",
                cfg.style,
                cfg.dims,
                cfg.head_dim,
                std::mem::discriminant(&cfg.scaling)
            );
            check_rel(
                &name,
                "rope",
                case,
                &read(b, &xt, n, cols),
                &read(&rf.r, &xr, n, cols),
                tol.rope,
            );
        }
    }
}

/// Attention shapes: (heads, kv_heads, head_dim, qk_norm, rope style, rotated dims): groups
/// of 4, 1, 3, 1 and 8, heads of 128, 64, 80, one rotated in part.
const ATTN_SHAPES: [(usize, usize, usize, bool, RopeStyle, usize); 5] = [
    (8, 2, 128, true, RopeStyle::Neox, 128),
    (6, 6, 64, false, RopeStyle::Interleaved, 64),
    (12, 4, 64, false, RopeStyle::Neox, 32),
    (8, 8, 80, false, RopeStyle::Neox, 80),
    (16, 2, 64, true, RopeStyle::Neox, 64),
];

/// The backend's cache of `ty` and the reference's cache of the type the backend stores, or
/// None after a line saying why the backend does not run this shape or type.
fn caches<B: Backend>(
    b: &B,
    rf: &Ref,
    op: &str,
    (layers, n_ctx, heads, kvh, hd): (usize, usize, usize, usize, usize),
    ty: KvType,
) -> Option<(B::KvCache, crate::cpu::CpuKvCache)> {
    let (name, case) = (
        b.name(),
        format!("heads={heads}/{kvh} hd={hd} kv={}", ty.name()),
    );
    if let Err(e) = b.check_attention(heads, kvh, hd) {
        assert!(is_unsupported(&e), "{name}: check_attention [{case}]: {e}");
        declined(&name, op, &case, e);
        return None;
    }
    let cb = match b.kv_cache_typed(layers, n_ctx, kvh, hd, ty) {
        Ok(c) => c,
        Err(e) if is_unsupported(&e) => {
            declined(&name, op, &case, e);
            return None;
        }
        Err(e) => panic!("{name}: kv_cache_typed [{case}]: {e}"),
    };
    let stored = b.kv_type_stored(ty);
    let cr =
        rf.r.kv_cache_typed(layers, n_ctx, kvh, hd, stored)
            .unwrap_or_else(|e| panic!("the reference cache of {}: {e}", stored.name()));
    Some((cb, cr))
}

/// `qk_norm_rope_store` (with and without the per-head norm) then `attention`, every KV
/// type: a prompt of 130 at 0, 9 at 130, then two single tokens; for the first shape
/// a context past 512 instead (300 at 0, 37, 1, 250 and 1: key chunks and decode splits
/// with the softmax carried across them); q and k as rotated, and the attention output.
pub fn attention<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x3002));
    for (si, (heads, kvh, hd, qk, style, dims)) in ATTN_SHAPES.into_iter().enumerate() {
        let steps: &[usize] = if si == 0 {
            &[300, 37, 1, 250, 1]
        } else {
            &[130, 9, 1, 1]
        };
        let n_ctx = steps.iter().sum::<usize>() + 8;
        for ty in KV_TYPES {
            let Some((mut cb, mut cr)) =
                caches(b, &rf, "attention", (2, n_ctx, heads, kvh, hd), ty)
            else {
                continue;
            };
            let rope = rope_cfg(style, dims, hd, RopeScaling::None);
            let (qn, kn) = (rng.v(hd), rng.v(hd));
            let (qnt, qnr) = both(b, &rf, 1, hd, &qn);
            let (knt, knr) = both(b, &rf, 1, hd, &kn);
            let (qd, kd) = (heads * hd, kvh * hd);
            let mut pos0 = 0;
            for &n in steps {
                let (q, k, v) = (rng.v(n * qd), rng.v(n * kd), rng.v(n * kd));
                let (mut qt, mut qr) = both(b, &rf, n, qd, &q);
                let (mut kt, mut kr) = both(b, &rf, n, kd, &k);
                let (vt, vr) = both(b, &rf, n, kd, &v);
                let nb = qk.then_some((&qnt, &knt, 1e-6));
                let nr = qk.then_some((&qnr, &knr, 1e-6));
                b.qk_norm_rope_store(
                    &mut qt, &mut kt, &vt, nb, &rope, heads, kvh, &mut cb, 1, pos0, n,
                );
                rf.r.qk_norm_rope_store(
                    &mut qr, &mut kr, &vr, nr, &rope, heads, kvh, &mut cr, 1, pos0, n,
                );
                let case = format!("heads={heads}/{kvh} hd={hd} rope dims={dims} qk_norm={qk} kv={} pos0={pos0} n={n}", ty.name());
                let op = "qk_norm_rope_store";
                check_rel(
                    &name,
                    op,
                    format!("{case} q"),
                    &read(b, &qt, n, qd),
                    &read(&rf.r, &qr, n, qd),
                    tol.rope,
                );
                check_rel(
                    &name,
                    op,
                    format!("{case} k"),
                    &read(b, &kt, n, kd),
                    &read(&rf.r, &kr, n, kd),
                    tol.rope,
                );
                let shape = AttnShape {
                    n_heads: heads,
                    n_kv_heads: kvh,
                    head_dim: hd,
                    pos0,
                    n_tokens: n,
                    window: 0,
                };
                let (mut o, mut orf) = (b.tensor(n, qd), rf.r.tensor(n, qd));
                b.attention(&qt, &cb, 1, shape, &mut o);
                rf.r.attention(&qr, &cr, 1, shape, &mut orf);
                check_rel(
                    &name,
                    "attention",
                    case.clone(),
                    &read(b, &o, n, qd),
                    &read(&rf.r, &orf, n, qd),
                    kv_bound(tol, ty),
                );
                // A sliding window, where the backend has them.
                if b.check_window().is_ok() {
                    let shape = AttnShape { window: 7, ..shape };
                    b.attention(&qt, &cb, 1, shape, &mut o);
                    rf.r.attention(&qr, &cr, 1, shape, &mut orf);
                    check_rel(
                        &name,
                        "attention",
                        format!("{case} window=7"),
                        &read(b, &o, n, qd),
                        &read(&rf.r, &orf, n, qd),
                        kv_bound(tol, ty),
                    );
                }
                pos0 += n;
            }
        }
    }
}

fn kv_bound(tol: &Tolerances, ty: KvType) -> f32 {
    match ty {
        KvType::F32 => tol.attention,
        KvType::F16 | KvType::Q8_0 => tol.attention_packed,
    }
}

/// Sequence lengths before the steps of the batched tests, and the steps' token counts.
const SEQ_LENS: [usize; 4] = [5, 300, 41, 1];
const SEQ_CTX: [usize; 4] = [64, 400, 128, 32];
const SEQ_STEPS: [[usize; 4]; 3] = [[1, 1, 1, 1], [1, 1, 1, 1], [1, 7, 1, 3]];

/// Several sequences' caches on the backend and the reference, their prompts stored (other
/// values in layer 0, so a layer mix-up shows).
#[allow(clippy::type_complexity)]
fn seq_caches<B: Backend>(
    b: &B,
    rf: &Ref,
    op: &str,
    (heads, kvh, hd): (usize, usize, usize),
    ty: KvType,
    rng: &mut Rng,
    copies: usize,
) -> Option<(Vec<Vec<B::KvCache>>, Vec<crate::cpu::CpuKvCache>)> {
    let kd = kvh * hd;
    let mut cb: Vec<Vec<B::KvCache>> = (0..copies).map(|_| Vec::new()).collect();
    let mut cr = Vec::new();
    for (i, &n) in SEQ_LENS.iter().enumerate() {
        for c in cb.iter_mut() {
            c.push(caches(b, rf, op, (2, SEQ_CTX[i], heads, kvh, hd), ty)?.0);
        }
        cr.push(caches(b, rf, op, (2, SEQ_CTX[i], heads, kvh, hd), ty)?.1);
        for layer in 0..2 {
            let (k, v) = (rng.v(n * kd), rng.v(n * kd));
            let (kt, kr) = both(b, rf, n, kd, &k);
            let (vt, vr) = both(b, rf, n, kd, &v);
            for c in cb.iter_mut() {
                b.kv_store(&mut c[i], layer, &kt, &vt, 0, n);
            }
            rf.r.kv_store(&mut cr[i], layer, &kr, &vr, 0, n);
        }
    }
    Some((cb, cr))
}

/// `kv_store` and `attention_batch` over four sequences (own caches, lengths 1 to 300): two
/// decode steps and a mixed one, against the reference; each sequence's rows exactly what
/// `attention` gives it alone (the trait's contract).
pub fn attention_batch<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x3003));
    for (heads, kvh, hd, _, _, _) in [ATTN_SHAPES[0], ATTN_SHAPES[2], ATTN_SHAPES[3]] {
        for ty in KV_TYPES {
            let Some((mut cb, mut cr)) =
                seq_caches(b, &rf, "attention_batch", (heads, kvh, hd), ty, &mut rng, 1)
            else {
                continue;
            };
            let mut cb = cb.pop().unwrap();
            let (qd, kd) = (heads * hd, kvh * hd);
            let mut pos = SEQ_LENS;
            for tokens in SEQ_STEPS {
                let rows: usize = tokens.iter().sum();
                let shapes: Vec<AttnShape> = (0..4)
                    .map(|i| AttnShape {
                        n_heads: heads,
                        n_kv_heads: kvh,
                        head_dim: hd,
                        pos0: pos[i],
                        n_tokens: tokens[i],
                        window: 0,
                    })
                    .collect();
                for i in 0..4 {
                    let n = tokens[i];
                    let (k, v) = (rng.v(n * kd), rng.v(n * kd));
                    let (kt, kr) = both(b, &rf, n, kd, &k);
                    let (vt, vr) = both(b, &rf, n, kd, &v);
                    b.kv_store(&mut cb[i], 1, &kt, &vt, pos[i], n);
                    rf.r.kv_store(&mut cr[i], 1, &kr, &vr, pos[i], n);
                }
                let q = rng.v(rows * qd);
                let (qt, qr) = both(b, &rf, rows, qd, &q);
                let (mut o, mut orf) = (b.tensor(rows, qd), rf.r.tensor(rows, qd));
                b.attention_batch(&qt, cb.iter().zip(shapes.iter().copied()), 1, &mut o);
                rf.r.attention_batch(&qr, cr.iter().zip(shapes.iter().copied()), 1, &mut orf);
                let got = read(b, &o, rows, qd);
                let case = format!(
                    "heads={heads}/{kvh} hd={hd} kv={} tokens={tokens:?}",
                    ty.name()
                );
                check_rel(
                    &name,
                    "attention_batch",
                    &case,
                    &got,
                    &read(&rf.r, &orf, rows, qd),
                    kv_bound(tol, ty),
                );
                let mut r0 = 0;
                for i in 0..4 {
                    let n = tokens[i];
                    let mut oa = b.tensor(n, qd);
                    b.attention(
                        &b.tensor_from(n, qd, &q[r0 * qd..(r0 + n) * qd]),
                        &cb[i],
                        1,
                        shapes[i],
                        &mut oa,
                    );
                    let op = "attention_batch vs attention alone";
                    check_exact(
                        &name,
                        op,
                        format!("{case} sequence {i}"),
                        &got[r0 * qd..(r0 + n) * qd],
                        &read(b, &oa, n, qd),
                    );
                    r0 += n;
                    pos[i] += n;
                }
            }
        }
    }
}

/// One `qk_norm_rope_attention` over the sequences whose rows of q, k, v are stacked.
fn step_seqs<B: Backend>(
    b: &B,
    caches: &mut [B::KvCache],
    shapes: &[AttnShape],
    [q, k, v]: [&[f32]; 3],
    norms: Option<(&B::Tensor, &B::Tensor, f32)>,
    rope: &RopeConfig,
) -> Vec<f32> {
    let s = shapes[0];
    let (qd, kd) = (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
    let rows: usize = shapes.iter().map(|s| s.n_tokens).sum();
    let (mut qt, mut kt, vt) = (
        b.tensor_from(rows, qd, q),
        b.tensor_from(rows, kd, k),
        b.tensor_from(rows, kd, v),
    );
    let mut out = b.tensor(rows, qd);
    let mut seqs: Vec<_> = caches
        .iter_mut()
        .zip(shapes)
        .map(|(cache, &shape)| SeqKv { cache, shape })
        .collect();
    let (mut t0, mut t1, mut t2) = (b.tensor(rows, qd), b.tensor(rows, kd), b.tensor(rows, kd));
    b.qk_norm_rope_attention(
        &mut qt,
        &mut kt,
        &vt,
        norms,
        rope,
        &mut seqs,
        1,
        &mut out,
        [&mut t0, &mut t1, &mut t2],
    );
    read(b, &out, rows, qd)
}

/// `qk_norm_rope_attention` over four sequences (two decode steps, then a prompt chunk beside
/// decode tokens), with and without the per-head norm, against the reference; in a decode
/// step each sequence's rows are bit for bit what it gets alone.
pub fn qk_norm_rope_attention<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x3004));
    for (heads, kvh, hd, qk, style, dims) in [ATTN_SHAPES[0], ATTN_SHAPES[1], ATTN_SHAPES[3]] {
        for ty in KV_TYPES {
            let op = "qk_norm_rope_attention";
            let Some((mut cb, mut cr)) = seq_caches(b, &rf, op, (heads, kvh, hd), ty, &mut rng, 2)
            else {
                continue;
            };
            let (mut alone, mut cb) = (cb.pop().unwrap(), cb.pop().unwrap());
            let rope = rope_cfg(style, dims, hd, RopeScaling::None);
            let (qn, kn) = (rng.v(hd), rng.v(hd));
            let (qnt, qnr) = both(b, &rf, 1, hd, &qn);
            let (knt, knr) = both(b, &rf, 1, hd, &kn);
            let nb = qk.then_some((&qnt, &knt, 1e-6));
            let nr = qk.then_some((&qnr, &knr, 1e-6));
            let (qd, kd) = (heads * hd, kvh * hd);
            let mut pos = SEQ_LENS;
            for tokens in SEQ_STEPS {
                let rows: usize = tokens.iter().sum();
                let (q, k, v) = (rng.v(rows * qd), rng.v(rows * kd), rng.v(rows * kd));
                let shapes: Vec<AttnShape> = (0..4)
                    .map(|i| AttnShape {
                        n_heads: heads,
                        n_kv_heads: kvh,
                        head_dim: hd,
                        pos0: pos[i],
                        n_tokens: tokens[i],
                        window: 0,
                    })
                    .collect();
                let got = step_seqs(b, &mut cb, &shapes, [&q, &k, &v], nb, &rope);
                let want = step_seqs(&rf.r, &mut cr, &shapes, [&q, &k, &v], nr, &rope);
                let case = format!(
                    "heads={heads}/{kvh} hd={hd} qk_norm={qk} kv={} tokens={tokens:?}",
                    ty.name()
                );
                check_rel(&name, op, &case, &got, &want, kv_bound(tol, ty));
                let mut r0 = 0;
                for i in 0..4 {
                    let n = tokens[i];
                    let part = |x: &[f32], d: usize| x[r0 * d..(r0 + n) * d].to_vec();
                    let one = [part(&q, qd), part(&k, kd), part(&v, kd)];
                    let a = step_seqs(
                        b,
                        std::slice::from_mut(&mut alone[i]),
                        &shapes[i..=i],
                        [&one[0], &one[1], &one[2]],
                        nb,
                        &rope,
                    );
                    let g = &got[r0 * qd..(r0 + n) * qd];
                    let case = format!("{case} sequence {i}");
                    if tokens == [1, 1, 1, 1] {
                        check_exact(
                            &name,
                            "qk_norm_rope_attention batched vs alone",
                            case,
                            g,
                            &a,
                        );
                    } else {
                        check_rel(
                            &name,
                            "qk_norm_rope_attention batched vs alone",
                            case,
                            g,
                            &a,
                            kv_bound(tol, ty),
                        );
                    }
                    r0 += n;
                    pos[i] += n;
                }
            }
        }
    }
}

/// `kv_copy`: a fork's attention over the copied positions is exactly the source's.
pub fn kv_copy<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x3005));
    let (heads, kvh, hd, _, _, _) = ATTN_SHAPES[0];
    let (qd, kd, n) = (heads * hd, kvh * hd, 41);
    for ty in KV_TYPES {
        let dims = (2, 64, heads, kvh, hd);
        let (Some((mut src, mut src_r)), Some((mut dst, mut dst_r))) = (
            caches(b, &rf, "kv_copy", dims, ty),
            caches(b, &rf, "kv_copy", dims, ty),
        ) else {
            continue;
        };
        for layer in 0..2 {
            let (k, v) = (rng.v(n * kd), rng.v(n * kd));
            let (kt, kr) = both(b, &rf, n, kd, &k);
            let (vt, vr) = both(b, &rf, n, kd, &v);
            b.kv_store(&mut src, layer, &kt, &vt, 0, n);
            rf.r.kv_store(&mut src_r, layer, &kr, &vr, 0, n);
        }
        b.kv_copy(&src, &mut dst, n);
        rf.r.kv_copy(&src_r, &mut dst_r, n);
        let shape = AttnShape {
            n_heads: heads,
            n_kv_heads: kvh,
            head_dim: hd,
            pos0: n - 3,
            n_tokens: 3,
            window: 0,
        };
        let q = rng.v(3 * qd);
        let (qt, qr) = both(b, &rf, 3, qd, &q);
        let case = format!("{n} positions, kv={}", ty.name());
        for layer in 0..2 {
            let (mut os, mut od, mut orf) = (b.tensor(3, qd), b.tensor(3, qd), rf.r.tensor(3, qd));
            b.attention(&qt, &src, layer, shape, &mut os);
            b.attention(&qt, &dst, layer, shape, &mut od);
            rf.r.attention(&qr, &dst_r, layer, shape, &mut orf);
            let got = read(b, &od, 3, qd);
            check_exact(
                &name,
                "kv_copy",
                format!("{case} layer {layer} copy vs source"),
                &got,
                &read(b, &os, 3, qd),
            );
            check_rel(
                &name,
                "kv_copy",
                format!("{case} layer {layer}"),
                &got,
                &read(&rf.r, &orf, 3, qd),
                kv_bound(tol, ty),
            );
        }
    }
}

/// Window and most positions a step of [`kv_window`]'s caches.
const WIN: usize = 40;
const WIN_CHUNK: usize = 70;

/// A sliding-window cache (`kv_cache_window`, window 40, steps of up to 70) against the
/// reference's cache of every position: `kv_store` then `attention` of window 40 in steps of
/// 70, 1, 7, 3, 1, 1, 12 positions to past 900, every fifth step first going back 1 to 70
/// positions (which `kv_kept_from` must allow), layer 0 holding other values; then a
/// `kv_copy` of it, and both in one `attention_batch`, each exactly as alone.
pub fn kv_window<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x3008));
    if let Err(e) = b.check_window() {
        return declined(&name, "kv_window", "sliding windows", e);
    }
    const STEPS: [usize; 7] = [WIN_CHUNK, 1, 7, 3, 1, 1, 12];
    let n_ctx = 1000;
    let win = crate::KvWindow {
        window: WIN,
        chunk: WIN_CHUNK,
    };
    for (heads, kvh, hd, _, _, _) in [ATTN_SHAPES[0], ATTN_SHAPES[1], ATTN_SHAPES[3]] {
        for ty in KV_TYPES {
            let case = format!("heads={heads}/{kvh} hd={hd} kv={}", ty.name());
            if let Err(e) = b.check_attention(heads, kvh, hd) {
                declined(&name, "kv_window", &case, e);
                continue;
            }
            let window_cache = || b.kv_cache_window(2, n_ctx, kvh, hd, Some(ty), win);
            let (mut cw, mut cc) = match (window_cache(), window_cache()) {
                (Ok(a), Ok(c)) => (a, c),
                (Err(e), _) | (_, Err(e)) if is_unsupported(&e) => {
                    declined(&name, "kv_window", &case, e);
                    continue;
                }
                (Err(e), _) | (_, Err(e)) => panic!("{name}: kv_cache_window [{case}]: {e}"),
            };
            let stored = b.kv_type_stored(ty);
            let mut cr = rf.r.kv_cache_typed(2, n_ctx, kvh, hd, stored).unwrap();
            let (qd, kd) = (heads * hd, kvh * hd);
            let shape = |pos0, n_tokens| AttnShape {
                n_heads: heads,
                n_kv_heads: kvh,
                head_dim: hd,
                pos0,
                n_tokens,
                window: WIN,
            };
            let (mut pos, mut i) = (0, 0);
            let (mut got, mut want) = (Vec::new(), Vec::new());
            while pos < 900 {
                if i % 5 == 4 {
                    let back = (1 + i * 13 % WIN_CHUNK).min(pos);
                    let kept = b.kv_kept_from(&cw);
                    assert!(
                        crate::KvWindow::resumes(WIN, kept, pos - back),
                        "{name}: kv_window [{case}]: going back {back} from {pos} (kept from \
                         {kept})"
                    );
                    pos -= back;
                }
                let n = STEPS[i % STEPS.len()];
                for layer in [0, 1] {
                    let (k, v) = (rng.v(n * kd), rng.v(n * kd));
                    let (kt, kr) = both(b, &rf, n, kd, &k);
                    let (vt, vr) = both(b, &rf, n, kd, &v);
                    b.kv_store(&mut cw, layer, &kt, &vt, pos, n);
                    rf.r.kv_store(&mut cr, layer, &kr, &vr, pos, n);
                }
                let q = rng.v(n * qd);
                let (qt, qr) = both(b, &rf, n, qd, &q);
                let (mut o, mut orf) = (b.tensor(n, qd), rf.r.tensor(n, qd));
                b.attention(&qt, &cw, 1, shape(pos, n), &mut o);
                rf.r.attention(&qr, &cr, 1, shape(pos, n), &mut orf);
                got.extend(read(b, &o, n, qd));
                want.extend(read(&rf.r, &orf, n, qd));
                pos += n;
                i += 1;
            }
            check_rel(
                &name,
                "kv_window",
                format!("{case}, {i} steps to {pos}"),
                &got,
                &want,
                kv_bound(tol, ty),
            );
            b.kv_copy(&cw, &mut cc, pos);
            let n = 2;
            let (k, v) = (rng.v(n * kd), rng.v(n * kd));
            let (kt, vt) = (b.tensor_from(n, kd, &k), b.tensor_from(n, kd, &v));
            for c in [&mut cw, &mut cc] {
                for layer in [0, 1] {
                    b.kv_store(c, layer, &kt, &vt, pos, n);
                }
            }
            // The same queries for both.
            let q = rng.v(n * qd).repeat(2);
            let qt = b.tensor_from(2 * n, qd, &q);
            let mut o = b.tensor(2 * n, qd);
            let seqs = [(&cw, shape(pos, n)), (&cc, shape(pos, n))];
            b.attention_batch(&qt, seqs.into_iter(), 1, &mut o);
            let got = read(b, &o, 2 * n, qd);
            check_exact(
                &name,
                "kv_window",
                format!("{case} copy vs source"),
                &got[..n * qd],
                &got[n * qd..],
            );
            let mut oa = b.tensor(n, qd);
            b.attention(
                &b.tensor_from(n, qd, &q[..n * qd]),
                &cw,
                1,
                shape(pos, n),
                &mut oa,
            );
            check_exact(
                &name,
                "kv_window",
                format!("{case} attention_batch vs alone"),
                &got[..n * qd],
                &read(b, &oa, n, qd),
            );
        }
    }
}

/// `attention_dense`: an encoder's (many queries), cross-attention's (a few over 1500 keys),
/// causal and not, heads of 64 and 80.
pub fn attention_dense<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x3006));
    for (heads, hd, n_q, n_kv, causal) in [
        (6, 64, 300, 300, false),
        (6, 64, 150, 150, false),
        (6, 64, 75, 75, true),
        (3, 64, 37, 200, true),
        (6, 64, 1, 1500, false),
        (6, 64, 2, 1500, false),
        (6, 64, 3, 1500, false),
        (6, 64, 5, 1500, false),
        (4, 128, 3, 333, false),
        (4, 128, 40, 333, false),
        (6, 64, 3, 4000, false),
        (4, 64, 5, 40, true),
        (2, 80, 5, 40, true),
    ] {
        let d = heads * hd;
        let (q, k, v) = (rng.v(n_q * d), rng.v(n_kv * d), rng.v(n_kv * d));
        let shape = DenseAttnShape {
            heads,
            head_dim: hd,
            n_q,
            n_kv,
            causal,
        };
        let (qt, qr) = both(b, &rf, n_q, d, &q);
        let (kt, kr) = both(b, &rf, n_kv, d, &k);
        let (vt, vr) = both(b, &rf, n_kv, d, &v);
        let (mut o, mut orf) = (b.tensor(n_q, d), rf.r.tensor(n_q, d));
        b.attention_dense(&qt, &kt, &vt, shape, &mut o);
        rf.r.attention_dense(&qr, &kr, &vr, shape, &mut orf);
        let case = format!("heads={heads} hd={hd} n_q={n_q} n_kv={n_kv} causal={causal}");
        check_rel(
            &name,
            "attention_dense",
            case,
            &read(b, &o, n_q, d),
            &read(&rf.r, &orf, n_q, d),
            tol.attention_dense,
        );
    }
}

/// `self_attention` (a BERT's, unmasked): heads of 64 and 80, 1 to 40 positions.
pub fn self_attention<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x3007));
    for (heads, hd, len) in [(12, 64, 40), (4, 80, 7), (2, 64, 1)] {
        let d = heads * hd;
        let (q, k, v) = (rng.v(len * d), rng.v(len * d), rng.v(len * d));
        let (qt, qr) = both(b, &rf, len, d, &q);
        let (kt, kr) = both(b, &rf, len, d, &k);
        let (vt, vr) = both(b, &rf, len, d, &v);
        let (mut o, mut orf) = (b.tensor(len, d), rf.r.tensor(len, d));
        b.self_attention(&qt, &kt, &vt, heads, hd, len, &mut o);
        rf.r.self_attention(&qr, &kr, &vr, heads, hd, len, &mut orf);
        let case = format!("heads={heads} hd={hd} len={len}");
        check_rel(
            &name,
            "self_attention",
            case,
            &read(b, &o, len, d),
            &read(&rf.r, &orf, len, d),
            tol.attention_dense,
        );
    }
}
