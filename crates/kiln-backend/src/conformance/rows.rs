//! Row ops: embeddings, norms, elementwise ops, copies, argmax and sampling candidates.

use super::*;
use crate::{LlmOps, SpeechOps, TensorOps};

/// `embed` (repeated ids, the first and last rows) and `embed_positions`, every format,
/// 301 rows; an id or position past the table is an error.
pub fn embed<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x2001));
    let vocab = 301;
    for ty in FORMATS {
        let mut dims = vec![256];
        if is_float(ty) {
            dims.push(333);
        }
        for dim in dims {
            let bytes = weight_data(ty, vocab, dim, &mut rng);
            let Some(wb) = load(b, "embed", ty, vocab, dim, &bytes) else {
                continue;
            };
            let wr = rf.load(ty, vocab, dim, &bytes);
            let case = format!("{} {vocab}x{dim}", ty.name());
            let ids = [0u32, 300, 17, 17, 255];
            let (mut o, mut orf) = (b.tensor(5, dim), rf.r.tensor(5, dim));
            b.embed(&wb, &ids, &mut o)
                .unwrap_or_else(|e| panic!("{name}: embed [{case}]: {e}"));
            rf.r.embed(&wr, &ids, &mut orf).unwrap();
            // Float formats convert exactly: the same bits.
            let check_rows = |op: &str, case: &str, got: &[f32], want: &[f32]| match is_float(ty) {
                true => check_exact(&name, op, case, got, want),
                false => check_rel(&name, op, case, got, want, tol.embed),
            };
            check_rows(
                "embed",
                &case,
                &read(b, &o, 5, dim),
                &read(&rf.r, &orf, 5, dim),
            );
            assert!(
                b.embed(&wb, &[vocab as u32], &mut o).is_err(),
                "{name}: embed [{case}]: id {vocab} past the table is no error"
            );
            let (mut o, mut orf) = (b.tensor(3, dim), rf.r.tensor(3, dim));
            b.embed_positions(&wb, vocab - 3, 3, &mut o)
                .unwrap_or_else(|e| panic!("{name}: embed_positions [{case}]: {e}"));
            rf.r.embed_positions(&wr, vocab - 3, 3, &mut orf).unwrap();
            let case_p = format!("{case} pos0={}", vocab - 3);
            check_rows(
                "embed_positions",
                &case_p,
                &read(b, &o, 3, dim),
                &read(&rf.r, &orf, 3, dim),
            );
            assert!(
                b.embed_positions(&wb, vocab - 2, 3, &mut o).is_err(),
                "{name}: embed_positions [{case}]: positions past the table are no error"
            );
        }
    }
}

/// `rms_norm` (rows of 333, 256 and 4096) and `rms_norm_heads` (heads of 64, 128 and 80).
pub fn rms_norm<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x2002));
    for cols in [333, 256, 4096] {
        let w = rng.v(cols);
        for n in [1, 3, 70] {
            let x: Vec<f32> = rng.v(n * cols).iter().map(|v| v * 4.0).collect();
            let (xt, _) = both(b, &rf, n, cols, &x);
            let mut o = b.tensor(n, cols);
            b.rms_norm(&xt, &b.tensor_from(1, cols, &w), 1e-6, n, &mut o);
            let want = rf.rms_norm(&x, n, &w, 1e-6);
            check_rel(
                &name,
                "rms_norm",
                format!("{n}x{cols}"),
                &read(b, &o, n, cols),
                &want,
                tol.norm,
            );
            // x += rms_norm(y) w (the post-norm and its residual add).
            let base = rng.v(n * cols);
            let mut acc = b.tensor_from(n, cols, &base);
            b.add_rms_norm(
                &mut acc,
                &xt,
                &b.tensor_from(1, cols, &w),
                1e-6,
                n,
                &mut o,
                None,
            );
            let want: Vec<f32> = base.iter().zip(&want).map(|(a, v)| a + v).collect();
            check_rel(
                &name,
                "add_rms_norm",
                format!("{n}x{cols}"),
                &read(b, &acc, n, cols),
                &want,
                tol.norm,
            );
        }
    }
    for (heads, hd) in [(3, 64), (8, 128), (5, 80)] {
        let w = rng.v(hd);
        for n in [1, 9] {
            let x = rng.v(n * heads * hd);
            let (mut xt, mut xr) = both(b, &rf, n, heads * hd, &x);
            b.rms_norm_heads(&mut xt, &b.tensor_from(1, hd, &w), 1e-6, n);
            rf.r.rms_norm_heads(&mut xr, &rf.t(1, hd, &w), 1e-6, n);
            let case = format!("n={n} heads={heads} hd={hd}");
            check_rel(
                &name,
                "rms_norm_heads",
                case,
                &read(b, &xt, n, heads * hd),
                &read(&rf.r, &xr, n, heads * hd),
                tol.norm,
            );
        }
    }
}

/// Whisper's `layer_norm` and `gelu` (erf) on its output.
pub fn layer_norm<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x2003));
    for (n, cols) in [(7, 384), (3, 1500), (1, 333), (70, 256)] {
        let x: Vec<f32> = rng.v(n * cols).iter().map(|v| v * 3.0 + 0.5).collect();
        let (gm, bt) = (rng.v(cols), rng.v(cols));
        let (xt, xr) = both(b, &rf, n, cols, &x);
        let (gt, gr) = both(b, &rf, 1, cols, &gm);
        let (btt, btr) = both(b, &rf, 1, cols, &bt);
        let (mut o, mut orf) = (b.tensor(n, cols), rf.r.tensor(n, cols));
        b.layer_norm(&xt, &gt, &btt, 1e-5, n, &mut o);
        rf.r.layer_norm(&xr, &gr, &btr, 1e-5, n, &mut orf);
        let case = format!("{n}x{cols}");
        check_rel(
            &name,
            "layer_norm",
            &case,
            &read(b, &o, n, cols),
            &read(&rf.r, &orf, n, cols),
            tol.norm,
        );
        b.gelu(&mut o, n);
        rf.r.gelu(&mut orf, n);
        check_rel(
            &name,
            "gelu",
            &case,
            &read(b, &o, n, cols),
            &read(&rf.r, &orf, n, cols),
            tol.elementwise,
        );
    }
}

/// Kokoro's norms: `layer_norm_rows` (affine and not), `ada_in` over (c, len) channels,
/// `ada_layer_norm` over (len, c) steps.
pub fn signal_norms<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x2004));
    for (rows, cols, eps) in [(31, 768, 1e-12), (1, 333, 1e-5), (70, 256, 1e-5)] {
        let x: Vec<f32> = rng.v(rows * cols).iter().map(|v| v * 2.0 - 0.3).collect();
        let (w, bb) = (rng.v(cols), rng.v(cols));
        let (wt, wr) = both(b, &rf, 1, cols, &w);
        let (bt, br) = both(b, &rf, 1, cols, &bb);
        for affine in [true, false] {
            let (mut xt, mut xr) = both(b, &rf, rows, cols, &x);
            b.layer_norm_rows(
                &mut xt,
                affine.then_some(&wt),
                affine.then_some(&bt),
                eps,
                rows,
                cols,
            );
            rf.r.layer_norm_rows(
                &mut xr,
                affine.then_some(&wr),
                affine.then_some(&br),
                eps,
                rows,
                cols,
            );
            let case = format!("{rows}x{cols} affine={affine}");
            check_rel(
                &name,
                "layer_norm_rows",
                case,
                &read(b, &xt, rows, cols),
                &read(&rf.r, &xr, rows, cols),
                tol.signal_norm,
            );
        }
    }
    for (c, len) in [(48, 300), (5, 1), (3, 77)] {
        let x: Vec<f32> = rng.v(c * len).iter().map(|v| v * 3.0 + 0.5).collect();
        let gb = rng.v(2 * c);
        let (gbt, gbr) = both(b, &rf, 1, 2 * c, &gb);
        let (mut xt, mut xr) = both(b, &rf, c, len, &x);
        b.ada_in(&mut xt, &gbt, c, len, 1e-5);
        rf.r.ada_in(&mut xr, &gbr, c, len, 1e-5);
        let case = format!("c={c} len={len}");
        check_rel(
            &name,
            "ada_in",
            &case,
            &read(b, &xt, c, len),
            &read(&rf.r, &xr, c, len),
            tol.signal_norm,
        );
        let (mut xt, mut xr) = both(b, &rf, len, c, &x);
        b.ada_layer_norm(&mut xt, &gbt, len, c, 1e-5);
        rf.r.ada_layer_norm(&mut xr, &gbr, len, c, 1e-5);
        check_rel(
            &name,
            "ada_layer_norm",
            &case,
            &read(b, &xt, len, c),
            &read(&rf.r, &xr, len, c),
            tol.signal_norm,
        );
    }
}

/// `add`, `silu_mul`, `scale`, `gelu_tanh`, `leaky_relu` (the value-count ops on a count
/// that ends inside a row) and `snake`.
pub fn elementwise<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x2005));
    for (n, cols) in [(1, 333), (3, 256), (70, 96)] {
        let (x, y) = (rng.v(n * cols), rng.v(n * cols));
        let x: Vec<f32> = x.iter().map(|v| v * 4.0).collect();
        let case = format!("{n}x{cols}");
        let count = n * cols - 5;
        let (yt, yr) = both(b, &rf, n, cols, &y);
        type Op<'a, T> = &'a dyn Fn(&mut T);
        // (op, backend, reference, exact: one IEEE operation per value)
        let cases: [(&str, Op<B::Tensor>, Op<CpuTensor>, bool); 6] = [
            ("add", &|t| b.add(t, &yt, n), &|t| rf.r.add(t, &yr, n), true),
            (
                "silu_mul",
                &|t| b.silu_mul(t, &yt, n),
                &|t| rf.r.silu_mul(t, &yr, n),
                false,
            ),
            (
                "gelu_tanh_mul",
                &|t| b.gelu_tanh_mul(t, &yt, n),
                &|t| rf.r.gelu_tanh_mul(t, &yr, n),
                false,
            ),
            (
                "scale",
                &|t| b.scale(t, 0.37, count),
                &|t| rf.r.scale(t, 0.37, count),
                true,
            ),
            (
                "gelu_tanh",
                &|t| b.gelu_tanh(t, count),
                &|t| rf.r.gelu_tanh(t, count),
                false,
            ),
            (
                "leaky_relu",
                &|t| b.leaky_relu(t, 0.2, count),
                &|t| rf.r.leaky_relu(t, 0.2, count),
                true,
            ),
        ];
        for (op, fb, fr, exact) in cases {
            let (mut xt, mut xr) = both(b, &rf, n, cols, &x);
            fb(&mut xt);
            fr(&mut xr);
            let (got, want) = (read(b, &xt, n, cols), read(&rf.r, &xr, n, cols));
            match exact {
                true => check_exact(&name, op, &case, &got, &want),
                false => check_rel(&name, op, &case, &got, &want, tol.elementwise),
            }
        }
    }
    for (c, len) in [(48, 300), (3, 1)] {
        let x: Vec<f32> = rng.v(c * len).iter().map(|v| v * 4.0).collect();
        let alpha: Vec<f32> = rng.v(c).iter().map(|v| 0.3 + v.abs()).collect();
        let (at, ar) = both(b, &rf, 1, c, &alpha);
        let (mut xt, mut xr) = both(b, &rf, c, len, &x);
        b.snake(&mut xt, &at, c, len);
        rf.r.snake(&mut xr, &ar, c, len);
        check_rel(
            &name,
            "snake",
            format!("c={c} len={len}"),
            &read(b, &xt, c, len),
            &read(&rf.r, &xr, c, len),
            tol.elementwise,
        );
    }
}

/// `copy_row`, `copy_rows`, `transpose`, `upsample_nearest`: exact.
pub fn copies<B: Backend>(b: &B, _tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x2006));
    for cols in [333, 64] {
        let (src, dst) = (rng.v(5 * cols), rng.v(4 * cols));
        let (st, sr) = both(b, &rf, 5, cols, &src);
        let (mut dt, mut dr) = both(b, &rf, 4, cols, &dst);
        b.copy_rows(&st, 1, 3, &mut dt, 1);
        rf.r.copy_rows(&sr, 1, 3, &mut dr, 1);
        check_exact(
            &name,
            "copy_rows",
            format!("3 of 5x{cols} to row 1"),
            &read(b, &dt, 4, cols),
            &read(&rf.r, &dr, 4, cols),
        );
        b.copy_row(&st, 4, &mut dt);
        rf.r.copy_row(&sr, 4, &mut dr);
        check_exact(
            &name,
            "copy_row",
            format!("row 4 of 5x{cols}"),
            &read(b, &dt, 4, cols),
            &read(&rf.r, &dr, 4, cols),
        );
        // Repeats, a run of consecutive rows, a step back (Kokoro's alignment and more).
        let rows = [0, 0, 0, 2, 3, 4, 1, 4, 4];
        let mut gt = b.tensor(rows.len() + 1, cols);
        b.gather_rows(&st, &rows, &mut gt);
        let want: Vec<f32> = rows
            .iter()
            .flat_map(|&r| src[r * cols..(r + 1) * cols].iter().copied())
            .chain(std::iter::repeat_n(0.0, cols))
            .collect();
        check_exact(
            &name,
            "gather_rows",
            format!("{rows:?} of 5x{cols}"),
            &read(b, &gt, rows.len() + 1, cols),
            &want,
        );
    }
    for (rows, cols) in [(33, 75), (1, 7), (64, 48)] {
        let x = rng.v(rows * cols);
        let (xt, xr) = both(b, &rf, rows, cols, &x);
        let (mut o, mut orf) = (b.tensor(cols, rows), rf.r.tensor(cols, rows));
        b.transpose(&xt, rows, cols, &mut o);
        rf.r.transpose(&xr, rows, cols, &mut orf);
        check_exact(
            &name,
            "transpose",
            format!("{rows}x{cols}"),
            &read(b, &o, cols, rows),
            &read(&rf.r, &orf, cols, rows),
        );
    }
    for (c, len, factor) in [(5, 17, 3), (1, 1, 2), (48, 300, 2)] {
        let x = rng.v(c * len);
        let (xt, xr) = both(b, &rf, c, len, &x);
        let (mut o, mut orf) = (b.tensor(c, len * factor), rf.r.tensor(c, len * factor));
        b.upsample_nearest(&xt, c, len, factor, &mut o);
        rf.r.upsample_nearest(&xr, c, len, factor, &mut orf);
        let case = format!("c={c} len={len} x{factor}");
        check_exact(
            &name,
            "upsample_nearest",
            case,
            &read(b, &o, c, len * factor),
            &read(&rf.r, &orf, c, len * factor),
        );
    }
}

/// `argmax_rows`: the first of equal maxima, within a row's first columns only, rows longer
/// than any one workgroup's part; exact.
pub fn argmax_rows<B: Backend>(b: &B, _tol: &Tolerances) {
    let (name, mut rng) = (b.name(), Rng(0x2007));
    let cols = 70001;
    let mut l = rng.v(3 * cols);
    l[5] = 9.0;
    l[900] = 9.0;
    l[cols + 69999] = 3.0;
    l[cols + 12295] = 3.0;
    l[2 * cols + 3] = 5.0;
    l[2 * cols + 69000] = 9.0;
    let t = b.tensor_from(3, cols, &l);
    let want = |n: usize, c: usize| -> Vec<u32> {
        l.chunks_exact(cols)
            .take(n)
            .map(|r| crate::argmax_first(&r[..c]))
            .collect()
    };
    for (n, c) in [(3, cols), (1, cols), (3, 60000), (1, 800), (2, 1)] {
        let got = b.argmax_rows(&t, n, c);
        assert_eq!(
            got,
            want(n, c),
            "{name}: argmax_rows [{n} rows, first {c} of {cols} columns]: exact"
        );
    }
}

/// `top_candidates` where the backend selects: the row's top k under `f32::total_cmp` (ties
/// by the lower column; a NaN, infinities, a negative zero) among what it returns.
pub fn top_candidates<B: Backend>(b: &B, _tol: &Tolerances) {
    let (name, mut rng) = (b.name(), Rng(0x2008));
    let order = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    for (cols, k) in [
        (151936, 40),
        (151936, 1),
        (5000, 256),
        (100, 40),
        (3000, 2048),
    ] {
        let mut v: Vec<f32> = rng
            .v(cols)
            .iter()
            .map(|x| (x * 30.0).floor() / 4.0)
            .collect();
        v[cols / 3] = f32::NAN;
        v[cols / 2] = f32::INFINITY;
        v[cols - 1] = f32::NEG_INFINITY;
        v[0] = -0.0;
        let x = b.tensor_from(1, cols, &v);
        let mut got = Vec::new();
        if !b.top_candidates(&x, cols, k, &mut got) {
            declined(
                &name,
                "top_candidates",
                format!("{cols} columns, k={k}"),
                "the backend does not select (returns false)",
            );
            continue;
        }
        got.sort_by(order);
        got.truncate(k);
        let mut want: Vec<(f32, u32)> = v.iter().enumerate().map(|(i, &l)| (l, i as u32)).collect();
        want.sort_by(order);
        want.truncate(k);
        let bits = |x: &[(f32, u32)]| x.iter().map(|&(l, i)| (l.to_bits(), i)).collect::<Vec<_>>();
        assert_eq!(
            bits(&got),
            bits(&want),
            "{name}: top_candidates [{cols} columns, k={k}]: exact"
        );
    }
}

/// LFM2's `short_conv` (where the backend has it: `check_short_conv`) against the host
/// reference: one sequence's rows in the middle of a batch, its state carried from rows
/// written before, then started fresh; the output rows and the state after them.
pub fn short_conv<B: Backend>(b: &B, tol: &Tolerances) {
    if b.check_short_conv().is_err() {
        return;
    }
    let (name, mut rng) = (b.name(), Rng(0x2009));
    for (dim, k, row0, n) in [(64, 3, 2, 5), (200, 4, 0, 1), (96, 2, 3, 17), (32, 1, 1, 3)] {
        let s = k - 1;
        let srow = 2 * s;
        let rows = row0 + n + 2;
        let bcx = rng.v(rows * 3 * dim);
        let taps = rng.v(dim * k);
        let state = rng.v((srow + s + 1) * dim);
        for fresh in [false, true] {
            let bt = b.tensor_from(rows, 3 * dim, &bcx);
            let tt = b.tensor_from(dim, k, &taps);
            let mut st = b.tensor_from(srow + s + 1, dim, &state);
            let mut out = b.tensor_from(rows, dim, &vec![0.5; rows * dim]);
            b.short_conv(
                &bt,
                &tt,
                &mut st,
                srow,
                (dim, k),
                (row0, n),
                fresh,
                &mut out,
            );
            let prev = match fresh {
                true => vec![0.0; s * dim],
                false => state[srow * dim..(srow + s) * dim].to_vec(),
            };
            let (want, next) = crate::short_conv_host(
                &bcx[row0 * 3 * dim..(row0 + n) * 3 * dim],
                &taps,
                &prev,
                dim,
                k,
                n,
            );
            let case = format!("dim={dim} k={k} rows {row0}..{} fresh={fresh}", row0 + n);
            let got = read(b, &out, rows, dim);
            check_rel(
                &name,
                "short_conv",
                &case,
                &got[row0 * dim..(row0 + n) * dim],
                &want,
                tol.elementwise,
            );
            // Rows outside the sequence's are left alone.
            let others: Vec<f32> = got[..row0 * dim]
                .iter()
                .chain(&got[(row0 + n) * dim..])
                .copied()
                .collect();
            let halves = vec![0.5; others.len()];
            check_exact(
                &name,
                "short_conv",
                format!("{case} other rows"),
                &others,
                &halves,
            );
            let st_got = read(b, &st, srow + s + 1, dim);
            check_rel(
                &name,
                "short_conv",
                format!("{case} state"),
                &st_got[srow * dim..(srow + s) * dim],
                &next,
                tol.elementwise,
            );
        }
    }
}
