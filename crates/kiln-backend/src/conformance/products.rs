//! Products: every format and token count, the fused forms, batches, MLX weights, recorded steps.

use super::*;
use crate::{LlmOps, TensorOps};

/// `matmul` (with a bias) and `matmul_add` on top of it, then `rms_norm_matmul`, every
/// format, rows 75 and 33 (and 333 columns for the float formats), 1 to 130 tokens (decode
/// kernels and tiled GEMMs).
pub fn matmul<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x1001));
    let eps = 1e-5;
    for ty in FORMATS {
        // (1280 columns: activations prepared in more than one piece of 1024 on wgpu.)
        let mut shapes = vec![(75, 256), (33, 512), (20, 1280)];
        if is_float(ty) {
            shapes.push((75, 333));
        }
        for (rows, cols) in shapes {
            let bytes = weight_data(ty, rows, cols, &mut rng);
            let Some(wb) = load(b, "matmul", ty, rows, cols, &bytes) else {
                continue;
            };
            let wr = rf.load(ty, rows, cols, &bytes);
            let bias = rng.v(rows);
            let bt = b.tensor_from(1, rows, &bias);
            for n in [1, 3, 9, 70, 130] {
                let case = format!("{} {rows}x{cols} n={n}", ty.name());
                let x = rng.v(n * cols);
                let xt = b.tensor_from(n, cols, &x);
                let mut o = b.tensor(n, rows);
                b.matmul(&wb, &xt, Some(&bt), n, &mut o);
                let want = rf.mm2(&wr, &x, n, Some(&bias));
                check_either(
                    &name,
                    "matmul",
                    &case,
                    &read(b, &o, n, rows),
                    &want,
                    tol.product,
                );
                b.matmul_add(&wb, &xt, n, &mut o);
                let plain = rf.mm2(&wr, &x, n, None);
                let want = [0, 1].map(|i| added(&want[i], &plain[i]));
                let got = read(b, &o, n, rows);
                check_either(&name, "matmul_add", &case, &got, &want, tol.product);
                let norm = rng.v(cols);
                let nt = b.tensor_from(1, cols, &norm);
                let mut h = b.tensor(n, cols);
                b.rms_norm_matmul(&xt, &nt, eps, &wb, n, &mut h, &mut o);
                let want = rf.mm2(&wr, &rf.rms_norm(&x, n, &norm, eps), n, None);
                let got = read(b, &o, n, rows);
                let op = "rms_norm_matmul";
                check_either(&name, op, &case, &got, &want, tol.fused_product);
            }
        }
    }
}

/// `matmul3` (biases and none) and `rms_norm_matmul3`: each format as the first of three
/// different ones, outputs of 75, 33 and 33 rows; then llama.cpp's K-quant attention mix (Q4_K
/// queries and keys, Q6_K values) in rows of multiples of 4 (the GPUs' four-row decode
/// kernels); 1, 9 and 70 tokens.
pub fn matmul3<B: Backend>(b: &B, tol: &Tolerances) {
    use GgmlType::{Q4_K, Q6_K};
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x1002));
    let (dim, eps) = (256, 1e-5);
    let cases = (0..FORMATS.len())
        .map(|i| {
            let tys = [0, 5, 10].map(|o| FORMATS[(i + o) % FORMATS.len()]);
            (tys, [75, 33, 33])
        })
        .chain([([Q4_K, Q4_K, Q6_K], [64, 32, 32])]);
    for (tys, outs) in cases {
        let bytes: Vec<Vec<u8>> = (0..3)
            .map(|p| weight_data(tys[p], outs[p], dim, &mut rng))
            .collect();
        let wb: Option<Vec<B::Weight>> = (0..3)
            .map(|p| load(b, "matmul3", tys[p], outs[p], dim, &bytes[p]))
            .collect();
        let Some(wb) = wb else { continue };
        let wr: Vec<CpuWeight> = (0..3)
            .map(|p| rf.load(tys[p], outs[p], dim, &bytes[p]))
            .collect();
        let biases: Vec<Vec<f32>> = outs.iter().map(|&k| rng.v(k)).collect();
        let bt: Vec<B::Tensor> = (0..3)
            .map(|p| b.tensor_from(1, outs[p], &biases[p]))
            .collect();
        let norm = rng.v(dim);
        let nt = b.tensor_from(1, dim, &norm);
        let tys_name = tys.map(|t| t.name()).join("+");
        for n in [1, 9, 70] {
            let with_bias = n != 9;
            let bs = [0, 1, 2].map(|p| with_bias.then_some(&bt[p]));
            let x = rng.v(n * dim);
            let xt = b.tensor_from(n, dim, &x);
            let mut o: Vec<B::Tensor> = outs.iter().map(|&k| b.tensor(n, k)).collect();
            let mut h = b.tensor(n, dim);
            let hr = rf.rms_norm(&x, n, &norm, eps);
            for fused in [false, true] {
                {
                    let [o0, o1, o2] = &mut o[..] else {
                        unreachable!()
                    };
                    let ws = [&wb[0], &wb[1], &wb[2]];
                    match fused {
                        false => b.matmul3(ws, bs, &xt, n, [o0, o1, o2]),
                        true => b.rms_norm_matmul3(&xt, &nt, eps, ws, bs, n, &mut h, [o0, o1, o2]),
                    }
                }
                let op = if fused { "rms_norm_matmul3" } else { "matmul3" };
                let input = if fused { &hr } else { &x };
                for p in 0..3 {
                    let bias = with_bias.then_some(&biases[p][..]);
                    let want = rf.mm2(&wr[p], input, n, bias);
                    let got = read(b, &o[p], n, outs[p]);
                    let case = format!("{tys_name} part {p} dim={dim} n={n} bias={with_bias}");
                    check_either(&name, op, case, &got, &want, tol.fused_product);
                }
            }
        }
    }
}

/// `gate_up_silu` and `rms_norm_gate_up_silu` (and their GeGLU forms, `gate_up_gelu` and
/// `rms_norm_gate_up_gelu`), every format as gate, up in the same format or another, 75
/// rows, 1, 3 and 70 tokens.
pub fn gate_up_silu<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x1003));
    let (dim, ffn, eps) = (256, 75, 1e-5);
    for i in 0..FORMATS.len() {
        // Gate and up alike for even i, of two formats for odd i.
        {
            let j = if i % 2 == 0 {
                i
            } else {
                (i + 4) % FORMATS.len()
            };
            let tys = [FORMATS[i], FORMATS[j]];
            let bytes = tys.map(|t| weight_data(t, ffn, dim, &mut rng));
            let (Some(g), Some(u)) = (
                load(b, "gate_up_silu", tys[0], ffn, dim, &bytes[0]),
                load(b, "gate_up_silu", tys[1], ffn, dim, &bytes[1]),
            ) else {
                continue;
            };
            let [gr, ur] = [0, 1].map(|p| rf.load(tys[p], ffn, dim, &bytes[p]));
            let norm = rng.v(dim);
            let nt = b.tensor_from(1, dim, &norm);
            for n in [1, 3, 70] {
                let x = rng.v(n * dim);
                let xt = b.tensor_from(n, dim, &x);
                let (mut h, mut o, mut up) = (b.tensor(n, dim), b.tensor(n, ffn), b.tensor(n, ffn));
                let hr = rf.rms_norm(&x, n, &norm, eps);
                for (fused, gelu) in [(false, false), (true, false), (false, true), (true, true)] {
                    match (fused, gelu) {
                        (false, false) => b.gate_up_silu(&g, &u, &xt, n, &mut o),
                        (true, false) => {
                            b.rms_norm_gate_up_silu(&xt, &nt, eps, &g, &u, n, &mut h, &mut o)
                        }
                        (false, true) => b.gate_up_gelu(&g, &u, &xt, n, &mut o, &mut up),
                        (true, true) => b.rms_norm_gate_up_gelu(
                            &xt, &nt, eps, &g, &u, n, &mut h, &mut o, &mut up,
                        ),
                    }
                    let input = if fused { &hr } else { &x };
                    let (gw, uw) = (rf.mm2(&gr, input, n, None), rf.mm2(&ur, input, n, None));
                    // Each product on either activations (the two formats may differ).
                    let act = if gelu { gelu_tanh_mul } else { silu_mul };
                    let want: Vec<Vec<f32>> = (0..4).map(|c| act(&gw[c / 2], &uw[c % 2])).collect();
                    let op = match (fused, gelu) {
                        (false, false) => "gate_up_silu",
                        (true, false) => "rms_norm_gate_up_silu",
                        (false, true) => "gate_up_gelu",
                        (true, true) => "rms_norm_gate_up_gelu",
                    };
                    let case = format!("{}+{} {ffn}x{dim} n={n}", tys[0].name(), tys[1].name());
                    check_either(
                        &name,
                        op,
                        case,
                        &read(b, &o, n, ffn),
                        &want,
                        tol.fused_product,
                    );
                }
            }
        }
    }
}

/// A decode layer's products chained in one step as a model runs them, each format:
/// `matmul_add_before_norm` (o and down projections) feeding `rms_norm_gate_up_silu` and
/// `rms_norm_matmul3` with the norm it was told about, then a last down projection feeding
/// `rms_norm_matmul` (a model's head), in 9 formats. Each op's output is checked against
/// the reference given the backend's own input to that op (the two residuals are separate
/// tensors, so every intermediate can be read): an int8 rounding step taken the other way
/// upstream (a value at a rounding midpoint) then cannot grow along the chain.
pub fn matmul_add_before_norm<B: Backend>(b: &B, tol: &Tolerances) {
    use GgmlType::*;
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x1004));
    let (dim, ffn, eps) = (256, 256, 1e-5);
    // The formats of the GPUs' own kernels and two they widen (every format's products are
    // `matmul`'s; this is about the hand-over between ops).
    for ty in [F32, F16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, Q5_0, Q5_K] {
        let shapes = [(dim, dim), (ffn, dim), (ffn, dim), (dim, ffn)];
        let bytes: Vec<Vec<u8>> = shapes
            .iter()
            .map(|&(r, c)| weight_data(ty, r, c, &mut rng))
            .collect();
        let wb: Option<Vec<B::Weight>> = (0..4)
            .map(|i| {
                load(
                    b,
                    "matmul_add_before_norm",
                    ty,
                    shapes[i].0,
                    shapes[i].1,
                    &bytes[i],
                )
            })
            .collect();
        let Some(wb) = wb else { continue };
        let wr: Vec<CpuWeight> = (0..4)
            .map(|i| rf.load(ty, shapes[i].0, shapes[i].1, &bytes[i]))
            .collect();
        let (n1, n2) = (rng.v(dim), rng.v(dim));
        let (n1t, n2t) = (b.tensor_from(1, dim, &n1), b.tensor_from(1, dim, &n2));
        for n in [1, 9, 70] {
            let (x0, y0, a) = (rng.v(n * dim), rng.v(n * dim), rng.v(n * dim));
            let (mut x, mut y) = (b.tensor_from(n, dim, &x0), b.tensor_from(n, dim, &y0));
            let at = b.tensor_from(n, dim, &a);
            let (mut h, mut f) = (b.tensor(n, dim), b.tensor(n, ffn));
            let (mut q, mut k, mut v) = (b.tensor(n, dim), b.tensor(n, dim), b.tensor(n, dim));
            let z0 = rng.v(n * dim);
            let (mut z, mut logits) = (b.tensor_from(n, dim, &z0), b.tensor(n, dim));
            b.step(None, &[], 0, &mut || {
                b.matmul_add_before_norm(&wb[0], &at, n, &mut x, (&n1t, eps));
                b.rms_norm_gate_up_silu(&x, &n1t, eps, &wb[1], &wb[2], n, &mut h, &mut f);
                b.matmul_add_before_norm(&wb[3], &f, n, &mut y, (&n2t, eps));
                let w = &wb[0];
                let outs = [&mut q, &mut k, &mut v];
                b.rms_norm_matmul3(&y, &n2t, eps, [w, w, w], [None; 3], n, &mut h, outs);
                b.matmul_add_before_norm(&wb[3], &f, n, &mut z, (&n1t, eps));
                b.rms_norm_matmul(&z, &n1t, eps, &wb[0], n, &mut h, &mut logits);
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{name}: step: {e}"));
            let (xg, fg, yg) = (
                read(b, &x, n, dim),
                read(b, &f, n, ffn),
                read(b, &y, n, dim),
            );
            let want_x = rf.mm2(&wr[0], &a, n, None).map(|p| added(&x0, &p));
            let h1 = rf.rms_norm(&xg, n, &n1, eps);
            let (g1, u1) = (rf.mm2(&wr[1], &h1, n, None), rf.mm2(&wr[2], &h1, n, None));
            let want_f = [0, 1].map(|i| silu_mul(&g1[i], &u1[i]));
            let want_y = rf.mm2(&wr[3], &fg, n, None).map(|p| added(&y0, &p));
            let want_q = rf.mm2(&wr[0], &rf.rms_norm(&yg, n, &n2, eps), n, None);
            let zg = read(b, &z, n, dim);
            let want_z = rf.mm2(&wr[3], &fg, n, None).map(|p| added(&z0, &p));
            let want_logits = rf.mm2(&wr[0], &rf.rms_norm(&zg, n, &n1, eps), n, None);
            let case = format!("{} dim={dim} ffn={ffn} n={n}", ty.name());
            let op = "matmul_add_before_norm";
            check_either(
                &name,
                op,
                format!("{case} residual"),
                &xg,
                &want_x,
                tol.fused_product,
            );
            check_either(
                &name,
                op,
                format!("{case} gate/up after it"),
                &fg,
                &want_f,
                tol.fused_product,
            );
            check_either(
                &name,
                op,
                format!("{case} second residual"),
                &yg,
                &want_y,
                tol.fused_product,
            );
            check_either(
                &name,
                op,
                format!("{case} matmul3 after it"),
                &read(b, &q, n, dim),
                &want_q,
                tol.fused_product,
            );
            let case = format!("{case} last residual");
            check_either(&name, op, &case, &zg, &want_z, tol.fused_product);
            let case = format!("{case}, the head after it");
            let got = read(b, &logits, n, dim);
            check_either(&name, op, case, &got, &want_logits, tol.fused_product);
        }
    }
}

/// Products over weights marked `prefer_batches`, for a token and for prompts.
pub fn prefer_batches<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x1005));
    let (rows, cols) = (75, 256);
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        let bytes = weight_data(ty, rows, cols, &mut rng);
        let wr = rf.load(ty, rows, cols, &bytes);
        for (int8, n) in [(false, 1), (false, 130), (true, 1), (true, 130)] {
            let Some(mut wb) = load(b, "prefer_batches", ty, rows, cols, &bytes) else {
                break;
            };
            b.prefer_batches(&mut wb, int8);
            let x = rng.v(n * cols);
            let mut o = b.tensor(n, rows);
            b.matmul(&wb, &b.tensor_from(n, cols, &x), None, n, &mut o);
            let want = rf.mm2(&wr, &x, n, None);
            let case = format!("{} {rows}x{cols} n={n} int8={int8}", ty.name());
            check_either(
                &name,
                "prefer_batches matmul",
                case,
                &read(b, &o, n, rows),
                &want,
                tol.batched,
            );
        }
    }
}

/// `load_weight_mlx` (4 and 8 bits, groups of 32, 64 and 128) and products over it.
pub fn mlx_weights<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x1006));
    let (rows, cols) = (75, 256);
    for (bits, group) in [(4, 32), (4, 64), (8, 64), (4, 128), (8, 128)] {
        let layout = MlxLayout::new(bits, group, cols).expect("a valid MLX layout");
        let (qb, g) = (layout.q_bytes(cols), layout.groups(cols));
        let (mut q, mut s, mut bi) = (
            vec![0u8; rows * qb],
            vec![0f32; rows * g],
            vec![0f32; rows * g],
        );
        for r in 0..rows {
            let w = rng.v(cols);
            kiln_quant::mlx_quantize_row(
                layout,
                &w,
                &mut q[r * qb..(r + 1) * qb],
                &mut s[r * g..(r + 1) * g],
                &mut bi[r * g..(r + 1) * g],
            );
        }
        let data = MlxWeightData {
            name: "w",
            layout,
            rows,
            cols,
            q: &q,
            scales: &s,
            biases: &bi,
        };
        let case0 = format!("mlx {bits}-bit group {group} {rows}x{cols}");
        let wb = match b.load_weight_mlx(data) {
            Ok(w) => w,
            Err(e) if is_unsupported(&e) => {
                declined(&name, "load_weight_mlx", &case0, e);
                continue;
            }
            Err(e) => panic!("{name}: load_weight_mlx [{case0}]: {e}"),
        };
        assert_eq!(
            b.weight_shape(&wb),
            (rows, cols),
            "{name}: weight_shape [{case0}]"
        );
        let wr = rf.r.load_weight_mlx(data).expect("the reference reads MLX");
        for n in [1, 9, 70] {
            let x = rng.v(n * cols);
            let mut o = b.tensor(n, rows);
            b.matmul(&wb, &b.tensor_from(n, cols, &x), None, n, &mut o);
            let mut want = [Act::F32, Act::Int8, Act::Int16].map(|a| rf.mm(&wr, &x, n, None, a));
            // The CPU's MLX kernels: q . x on x in int16 blocks, the bias term on x as given
            // (bias[g] * sum of the group's x), so the int16 reference gets the bias term's
            // share of the rounding back.
            let x16 = round_act(&x, cols, 32767.0);
            for t in 0..n {
                for r in 0..rows {
                    let d: f32 = (0..cols)
                        .map(|j| bi[r * g + j / group] * (x[t * cols + j] - x16[t * cols + j]))
                        .sum();
                    want[2][t * rows + r] += d;
                }
            }
            check_either(
                &name,
                "load_weight_mlx matmul",
                format!("{case0} n={n}"),
                &read(b, &o, n, rows),
                &want,
                tol.product,
            );
        }
    }
}

/// `step` with a key, run again with other token ids and positions (a backend that records
/// replays the first recording, its only inputs the step's tokens and pos0): token
/// embeddings plus positional rows through a product, every time equal to the reference.
pub fn step<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x4007));
    let (vocab, dim, rows) = (301, 256, 75);
    for ty in [GgmlType::F32, GgmlType::Q4_0, GgmlType::Q8_0] {
        let (tb, pb, wbytes) = (
            weight_data(ty, vocab, dim, &mut rng),
            weight_data(GgmlType::F32, vocab, dim, &mut rng),
            weight_data(ty, rows, dim, &mut rng),
        );
        let (Some(tab), Some(pos), Some(w)) = (
            load(b, "step", ty, vocab, dim, &tb),
            load(b, "step", GgmlType::F32, vocab, dim, &pb),
            load(b, "step", ty, rows, dim, &wbytes),
        ) else {
            continue;
        };
        let (tab_r, pos_r, w_r) = (
            rf.load(ty, vocab, dim, &tb),
            rf.load(GgmlType::F32, vocab, dim, &pb),
            rf.load(ty, rows, dim, &wbytes),
        );
        for n in [1, 3] {
            let key = crate::next_step_key();
            let (mut x, mut p, mut o) = (b.tensor(n, dim), b.tensor(n, dim), b.tensor(n, rows));
            for (round, pos0) in [(0u32, 0usize), (1, 7), (2, 290)] {
                let tokens: Vec<u32> = (0..n as u32)
                    .map(|i| (round * 97 + i * 31 + 5) % vocab as u32)
                    .collect();
                b.step(Some(key), &tokens, pos0, &mut || {
                    b.embed(&tab, &tokens, &mut x)?;
                    b.embed_positions(&pos, pos0, n, &mut p)?;
                    b.add(&mut x, &p, n);
                    b.matmul(&w, &x, None, n, &mut o);
                    Ok(())
                })
                .unwrap_or_else(|e| panic!("{name}: step: {e}"));
                let (mut xr, mut prr) = (rf.r.tensor(n, dim), rf.r.tensor(n, dim));
                rf.r.embed(&tab_r, &tokens, &mut xr).unwrap();
                rf.r.embed_positions(&pos_r, pos0, n, &mut prr).unwrap();
                rf.r.add(&mut xr, &prr, n);
                let want = rf.mm2(&w_r, &read(&rf.r, &xr, n, dim), n, None);
                let case = format!(
                    "{} n={n} tokens={tokens:?} pos0={pos0} (run {round} of one key)",
                    ty.name()
                );
                check_either(
                    &name,
                    "step",
                    case,
                    &read(b, &o, n, rows),
                    &want,
                    tol.product,
                );
            }
        }
    }
}
