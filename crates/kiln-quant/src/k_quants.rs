//! The K formats: super-blocks of 256 values split into sub-blocks of 16 or 32, whose
//! scales are themselves quantized against one f16 (or f32) super-block scale.
//!
//! Each function takes one super-block: `b` is exactly `type_size` bytes, `y`/`x` exactly
//! 256 values. The 2-, 3- and 6-bit formats spread a quant over several bit planes; the
//! comments give, for value `e`, where each bit lives.
//!
//! The quantizers (Q4_K, Q6_K, Q8_K) follow GGML's `quantize_row_*_ref` step for step:
//! every f32 operation in the same order, no fused multiply-add, so the bytes match a
//! build of the reference without FMA contraction.

use crate::bits::{first_absmax, nearest_int, read_f16, read_f32, write_f16, write_f32};
use crate::types::QK_K;

/// Below this, a group's magnitude counts as zero.
const GROUP_MAX_EPS: f32 = 1e-15;

// ---------------------------------------------------------------- scale packing

/// Scale and min (6 bits each) of sub-block `j` in the 12-byte Q4_K/Q5_K `scales`:
///   bytes 0..4:  scale j (low 6 bits), j < 4; top 2 bits = bits 4..6 of scale j + 4
///   bytes 4..8:  min j   (low 6 bits), j < 4; top 2 bits = bits 4..6 of min j + 4
///   bytes 8..12: low nibble = bits 0..4 of scale j + 4, high nibble = of min j + 4
#[inline]
pub(crate) fn k4_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        let sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        let m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        (sc, m)
    }
}

/// Inverse of `k4_scale_min`: eight 6-bit scales and mins into 12 bytes.
pub(crate) fn pack_k4_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4);
    }
    s
}

/// The sixteen 6-bit Q3_K scales (before the -32 offset) from their 12 bytes:
///   bytes 0..8:  low nibble = bits 0..4 of scale j (j < 8), high nibble = of scale j + 8
///   bytes 8..12: byte 8 + (j % 4), bits 2*(j / 4)..+2 = bits 4..6 of scale j
#[inline]
fn q3k_scales(s: &[u8]) -> [i8; 16] {
    std::array::from_fn(|j| {
        let low = if j < 8 { s[j] & 0x0f } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        ((low | (high << 4)) as i8) - 32
    })
}

// ---------------------------------------------------------------- dequantization

/// Q2_K, 84 bytes: scales[16] (low nibble scale, high nibble min, per 16 values),
/// qs[64] (2-bit), d (f16), dmin (f16). Value `e = 128*h + 32*s + l` (h < 2, s < 4,
/// l < 32) has q = (qs[32*h + l] >> 2*s) & 3 and uses scales[e / 16]:
/// `d * sc * q - dmin * m`.
pub(crate) fn dequant_q2_k(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let d = read_f16(b, 80);
    let dmin = read_f16(b, 82);
    for h in 0..2 {
        for s in 0..4 {
            for l in 0..32 {
                let e = 128 * h + 32 * s + l;
                let sc = scales[e / 16];
                let dl = d * (sc & 0x0f) as f32;
                let ml = dmin * (sc >> 4) as f32;
                let q = (qs[32 * h + l] >> (2 * s)) & 3;
                y[e] = dl * q as f32 - ml;
            }
        }
    }
}

/// Q3_K, 110 bytes: hmask[32], qs[64] (low 2 bits), scales[12] (16 x 6 bits, offset 32),
/// d (f16). Value `e = 128*h + 32*s + l` has low bits (qs[32*h + l] >> 2*s) & 3 and
/// high bit (hmask[l] >> (4*h + s)) & 1; a clear high bit means -4:
/// `d * (scale - 32) * (low - (high ? 0 : 4))`.
pub(crate) fn dequant_q3_k(b: &[u8], y: &mut [f32]) {
    let (hmask, qs) = (&b[0..32], &b[32..96]);
    let scales = q3k_scales(&b[96..108]);
    let d = read_f16(b, 108);
    for h in 0..2 {
        for s in 0..4 {
            for l in 0..32 {
                let e = 128 * h + 32 * s + l;
                let dl = d * scales[e / 16] as f32;
                let low = ((qs[32 * h + l] >> (2 * s)) & 3) as i8;
                let high = (hmask[l] >> (4 * h + s)) & 1;
                let q = if high == 1 { low } else { low - 4 };
                y[e] = dl * q as f32;
            }
        }
    }
}

/// Q4_K, 144 bytes: d (f16), dmin (f16), scales[12] (8 x 6-bit scale + min),
/// qs[128] nibbles. Value `e = 64*c + 32*n + l` (c < 4, n < 2) has
/// q = (qs[32*c + l] >> 4*n) & 15 and sub-block g = e / 32: `d * sc[g] * q - dmin * m[g]`.
pub(crate) fn dequant_q4_k(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let dmin = read_f16(b, 2);
    let (scales, qs) = (&b[4..16], &b[16..144]);
    for g in 0..8 {
        let (sc, m) = k4_scale_min(g, scales);
        let d1 = d * sc as f32;
        let m1 = dmin * m as f32;
        let (c, shift) = (g / 2, 4 * (g % 2));
        for l in 0..32 {
            let q = (qs[32 * c + l] >> shift) & 0x0f;
            y[32 * g + l] = d1 * q as f32 - m1;
        }
    }
}

/// The 256 4-bit values (0..16) of a Q4_K super-block, in value order (as dequant_q4_k
/// reads them).
pub fn q4k_values(b: &[u8]) -> [u8; QK_K] {
    let qs = &b[16..144];
    std::array::from_fn(|e| {
        let (g, l) = (e / 32, e % 32);
        (qs[32 * (g / 2) + l] >> (4 * (g % 2))) & 0x0f
    })
}

/// The scale and min (6 bits each) of each of a Q4_K super-block's eight 32-value sub-blocks
/// (`b`: the 144-byte block), unpacked from its 12 bytes of scales.
pub fn q4k_scale_mins(b: &[u8]) -> [(u8, u8); 8] {
    std::array::from_fn(|j| k4_scale_min(j, &b[4..16]))
}

/// The 256 unsigned 6-bit values (0..64) of a Q6_K super-block, in value order (as
/// dequant_q6_k reads them).
pub fn q6k_values(b: &[u8]) -> [u8; QK_K] {
    let (ql, qh) = (&b[0..128], &b[128..192]);
    std::array::from_fn(|e| {
        let (h, t, l) = (e / 128, (e / 32) % 4, e % 32);
        let low = (ql[64 * h + 32 * (t % 2) + l] >> (4 * (t / 2))) & 0x0f;
        let high = (qh[32 * h + l] >> (2 * t)) & 3;
        low | (high << 4)
    })
}

/// The low 4 bits of 32 values as 16 bytes, byte j holding value j (low nibble) and value
/// j + 16 (high nibble): the block layout of Q4_0/Q4_1, which GPU kernels read whole.
pub fn nibbles32(v: &[u8]) -> [u8; 16] {
    std::array::from_fn(|j| (v[j] & 0x0f) | ((v[j + 16] & 0x0f) << 4))
}

/// Bits 4..5 of 16 values in one word, value e at bits 2e (Q6_K's high bits, per half block).
pub fn high2_16(v: &[u8]) -> u32 {
    (0..16).fold(0, |w, e| w | (((v[e] >> 4) as u32 & 3) << (2 * e)))
}

/// Q5_K, 176 bytes: d, dmin (f16), scales[12] (as Q4_K), qh[32], qs[128]. As Q4_K plus a
/// fifth bit: value `e = 32*g + l` adds 16 when (qh[l] >> g) & 1.
pub(crate) fn dequant_q5_k(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let dmin = read_f16(b, 2);
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for g in 0..8 {
        let (sc, m) = k4_scale_min(g, scales);
        let d1 = d * sc as f32;
        let m1 = dmin * m as f32;
        let (c, shift) = (g / 2, 4 * (g % 2));
        for l in 0..32 {
            let q = ((qs[32 * c + l] >> shift) & 0x0f) | (((qh[l] >> g) & 1) << 4);
            y[32 * g + l] = d1 * q as f32 - m1;
        }
    }
}

/// Q6_K, 210 bytes: ql[128] (low nibbles), qh[64] (2 high bits), scales[16] (i8),
/// d (f16). Value `e = 128*h + 32*t + l` (h < 2, t < 4) has
/// low = (ql[64*h + 32*(t % 2) + l] >> 4*(t / 2)) & 15,
/// high = (qh[32*h + l] >> 2*t) & 3, and `d * scales[e / 16] * ((low | high << 4) - 32)`.
pub(crate) fn dequant_q6_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[192..208];
    let d = read_f16(b, 208);
    for (e, q) in q6k_values(b).into_iter().enumerate() {
        let ds = d * scales[e / 16] as i8 as f32;
        y[e] = ds * (q as i8 - 32) as f32;
    }
}

/// Q8_K, 292 bytes: d (f32), qs[256] (i8), bsums[16] (i16 sums of 16 quants, unused
/// here) -> `d * q`.
pub(crate) fn dequant_q8_k(b: &[u8], y: &mut [f32]) {
    let d = read_f32(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[4..4 + QK_K]) {
        *v = d * q as i8 as f32;
    }
}

// ---------------------------------------------------------------- quantization helpers

/// Asymmetric fit of `x` to `L * scale - the_min`, L in 0..=nmax, minimising the
/// `weights`-weighted squared (or absolute, `use_mad`) error. Starts from the min/max
/// grid, then tries `nstep + 1` grids of `nmax + rmin + rdelta * is` steps over the range
/// and keeps the best least-squares (scale, min) among them. Writes L, returns
/// (scale, the_min) with the_min >= 0 (the min is never above zero).
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };

    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }

    let mut laux = [0u8; 32];
    let laux = &mut laux[..n];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let (w, lf) = (weights[i], l as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Symmetric fit of `x` to `(L - nmax) * scale`, L in 0..2*nmax, weighting each value by
/// x^2. Starts from the grid that maps the largest magnitude to -nmax, tries 18 nearby
/// grids (nmax +- 0.1 .. 0.9) and keeps the best least-squares scale. Writes L, returns
/// the scale (0 for an all-zero group).
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [u8]) -> f32 {
    let max = first_absmax(x);
    if max.abs() < GROUP_MAX_EPS {
        l_out[..x.len()].fill(0);
        return 0.0;
    }
    // Quants for grid `iscale`, with their weighted sums (sum w*x*l, sum w*l*l).
    let fit = |iscale: f32, l_out: Option<&mut [u8]>| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        let mut l_out = l_out;
        for (i, &v) in x.iter().enumerate() {
            let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
            if let Some(out) = l_out.as_deref_mut() {
                out[i] = (l + nmax) as u8;
            }
            let w = v * v;
            sumlx += w * v * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        (sumlx, suml2)
    };

    let iscale = -(nmax as f32) / max;
    let (sumlx, suml2) = fit(iscale, Some(&mut *l_out));
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = fit(iscale, None);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            fit(iscale, Some(&mut *l_out));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

// ---------------------------------------------------------------- quantization

/// The part Q4_K and Q5_K share: per 32 values an asymmetric `nmax`-level fit (weights
/// |x| + rms of the sub-block; grids from `rmin`, `nstep` of them), then the eight scales
/// and mins quantized to 6 bits against d = max_scale / 63 and dmin = max_min / 63 (written
/// to b[0..16]), then the quants redone against those rounded scales. Returns the quants.
fn quant_k_scale_min(x: &[f32], b: &mut [u8], nmax: i32, rmin: f32, nstep: i32) -> [u8; QK_K] {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let mut max_scale = 0f32;
    let mut max_min = 0f32;
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|i| av_x + xs[i].abs());
        let (scale, min) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut l[32 * j..32 * j + 32],
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }

    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    // `as u8` wraps like the reference's int -> uint8_t store, then caps at 63.
    let ls: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
    let lm: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
    let packed = pack_k4_scales(&ls, &lm);
    write_f16(b, 0, max_scale / 63.0);
    write_f16(b, 2, max_min / 63.0);
    b[4..16].copy_from_slice(&packed);

    let d_all = read_f16(b, 0);
    let dmin_all = read_f16(b, 2);
    for j in 0..8 {
        let (sc, m) = k4_scale_min(j, &packed);
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue; // keep the quants of the fit
        }
        let dm = dmin_all * m as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / d).clamp(0, nmax) as u8;
        }
    }
    l
}

/// Q4_K: [`quant_k_scale_min`] with 4-bit quants (L in 0..=15; grids from -1, 20 of them).
pub(crate) fn quant_q4_k(x: &[f32], b: &mut [u8]) {
    let l = quant_k_scale_min(x, b, 15, -1.0, 20);

    // qs: byte 32*c + i holds value 64*c + i (low nibble) and 64*c + 32 + i (high).
    for c in 0..4 {
        for i in 0..32 {
            b[16 + 32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
        }
    }
}

/// Q5_K: [`quant_k_scale_min`] with 5-bit quants (L in 0..=31; grids from -0.5, 15 of
/// them), the fifth bit of value 64*c + 32*n + i in bit 2*c + n of qh[i].
pub(crate) fn quant_q5_k(x: &[f32], b: &mut [u8]) {
    let l = quant_k_scale_min(x, b, 31, -0.5, 15);

    // qh[32] then qs[128]: byte 32*c + i of qs holds the low nibbles of values 64*c + i and
    // 64*c + 32 + i; their fifth bits are bits 2*c and 2*c + 1 of qh[i].
    let (qh, qs) = b[16..176].split_at_mut(32);
    qh.fill(0);
    for c in 0..4 {
        for i in 0..32 {
            let (l1, l2) = (l[64 * c + i], l[64 * c + 32 + i]);
            qh[i] |= ((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1));
            qs[32 * c + i] = (l1 & 0x0f) | ((l2 & 0x0f) << 4);
        }
    }
}

/// Q6_K: per 16 values a symmetric 6-bit fit, then the sixteen scales quantized to i8
/// against d = -max_scale / 128 (the largest-magnitude scale maps to -128), then the
/// quants redone against those rounded scales.
pub(crate) fn quant_q6_k(x: &[f32], b: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let mut max_scale = 0f32;
    let mut max_abs_scale = 0f32;
    for ib in 0..16 {
        let scale = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
        scales[ib] = scale;
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        b.fill(0);
        return;
    }

    let iscale = -128.0 / max_scale;
    write_f16(b, 208, 1.0 / iscale);
    let sc: [i8; 16] = std::array::from_fn(|ib| nearest_int(iscale * scales[ib]).min(127) as i8);
    for (o, &s) in b[192..208].iter_mut().zip(&sc) {
        *o = s as u8;
    }

    let d_all = read_f16(b, 208);
    for (j, &s) in sc.iter().enumerate() {
        let d = d_all * s as f32;
        if d == 0.0 {
            continue; // keep the quants of the fit
        }
        for i in 16 * j..16 * j + 16 {
            l[i] = (nearest_int(x[i] / d).clamp(-32, 31) + 32) as u8;
        }
    }

    // Per half h: ql[64*h + i] = value 128*h + i | value 128*h + 64 + i (high nibble),
    // ql[64*h + 32 + i] likewise for +32 / +96; qh[32*h + i] holds bits 4..6 of the four.
    let (ql, rest) = b.split_at_mut(128);
    let qh = &mut rest[..64];
    for h in 0..2 {
        for i in 0..32 {
            let q = |t: usize| l[128 * h + 32 * t + i];
            ql[64 * h + i] = (q(0) & 0x0f) | ((q(2) & 0x0f) << 4);
            ql[64 * h + 32 + i] = (q(1) & 0x0f) | ((q(3) & 0x0f) << 4);
            qh[32 * h + i] =
                (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
        }
    }
}

/// Q8_K: d = -(value of largest magnitude) / 127 in f32, q = nearest_int(x / d) capped
/// at 127, plus the sum of every 16 quants. This is the activation format of K-quant
/// dot products.
pub(crate) fn quant_q8_k(x: &[f32], b: &mut [u8]) {
    let max = first_absmax(x);
    if max == 0.0 {
        b.fill(0);
        return;
    }
    let iscale = -127.0 / max;
    let mut q = [0i8; QK_K];
    for (qi, &v) in q.iter_mut().zip(x) {
        *qi = nearest_int(iscale * v).min(127) as i8;
    }
    write_f32(b, 0, 1.0 / iscale);
    for (o, &qi) in b[4..4 + QK_K].iter_mut().zip(&q) {
        *o = qi as u8;
    }
    for (j, group) in q.chunks_exact(16).enumerate() {
        let sum: i16 = group.iter().map(|&v| v as i16).sum();
        let at = 4 + QK_K + 2 * j;
        b[at..at + 2].copy_from_slice(&sum.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k4_scales_round_trip() {
        for a in 0..64u8 {
            for c in 0..64u8 {
                let sc: [u8; 8] = std::array::from_fn(|j| a.wrapping_add(j as u8 * 7) % 64);
                let m: [u8; 8] = std::array::from_fn(|j| c.wrapping_add(j as u8 * 13) % 64);
                let packed = pack_k4_scales(&sc, &m);
                for j in 0..8 {
                    assert_eq!(k4_scale_min(j, &packed), (sc[j], m[j]));
                }
            }
        }
    }

    #[test]
    fn q3k_scale_unpacking() {
        // Scale j = j + 10 (6 bits), packed by hand.
        let want: [u8; 16] = std::array::from_fn(|j| j as u8 + 10 + (j as u8 % 3) * 16);
        let mut s = [0u8; 12];
        for (j, &w) in want.iter().enumerate() {
            if j < 8 {
                s[j] |= w & 0x0f;
            } else {
                s[j - 8] |= (w & 0x0f) << 4;
            }
            s[8 + j % 4] |= (w >> 4) << (2 * (j / 4));
        }
        let got = q3k_scales(&s);
        for j in 0..16 {
            assert_eq!(got[j], want[j] as i8 - 32);
        }
    }

    #[test]
    fn q6k_bit_planes() {
        // Value e gets quant (e % 64); scales 1, d 1 -> y[e] = (e % 64) - 32.
        let mut b = [0u8; 210];
        let q: [u8; QK_K] = std::array::from_fn(|e| (e % 64) as u8);
        for h in 0..2 {
            for i in 0..32 {
                let v = |t: usize| q[128 * h + 32 * t + i];
                b[64 * h + i] = (v(0) & 15) | ((v(2) & 15) << 4);
                b[64 * h + 32 + i] = (v(1) & 15) | ((v(3) & 15) << 4);
                b[128 + 32 * h + i] =
                    (v(0) >> 4) | ((v(1) >> 4) << 2) | ((v(2) >> 4) << 4) | ((v(3) >> 4) << 6);
            }
        }
        b[192..208].fill(1);
        b[208..210].copy_from_slice(&half::f16::ONE.to_bits().to_le_bytes());
        let mut y = [0f32; QK_K];
        dequant_q6_k(&b, &mut y);
        for (e, &v) in y.iter().enumerate() {
            assert_eq!(v, (e % 64) as f32 - 32.0, "value {e}");
        }
    }

    #[test]
    fn q2k_value_order() {
        // One 2-bit quant set: value 128 + 32*3 + 5 = 229 -> qs[32 + 5] bits 6..8.
        let mut b = [0u8; 84];
        b[..16].fill(0x01); // scale 1, min 0
        b[16 + 37] = 0b1100_0000;
        b[80..82].copy_from_slice(&half::f16::ONE.to_bits().to_le_bytes());
        let mut y = [0f32; QK_K];
        dequant_q2_k(&b, &mut y);
        for (e, &v) in y.iter().enumerate() {
            assert_eq!(v, if e == 229 { 3.0 } else { 0.0 }, "value {e}");
        }
    }

    #[test]
    fn qkx2_constant_positive_block() {
        // min is clamped to 0: a constant c > 0 is fitted as L * scale with L = 15.
        let x = [2.0f32; 32];
        let w = [1.0f32; 32];
        let mut l = [0u8; 32];
        let (scale, the_min) = make_qkx2_quants(15, &x, &w, &mut l, -1.0, 0.1, 20, false);
        assert_eq!(the_min, 0.0);
        for &li in &l {
            assert!((li as f32 * scale - 2.0).abs() < 1e-6);
        }
    }

    #[test]
    fn qx_all_zero_group() {
        let mut l = [7u8; 16];
        assert_eq!(make_qx_quants(32, &[0.0; 16], &mut l), 0.0);
        assert_eq!(l, [0u8; 16]);
    }

    #[test]
    fn q8_k_bsums() {
        let x: [f32; QK_K] = std::array::from_fn(|i| (i as f32 * 0.37).sin());
        let mut b = [0u8; 292];
        quant_q8_k(&x, &mut b);
        for j in 0..16 {
            let want: i16 = b[4 + 16 * j..4 + 16 * j + 16]
                .iter()
                .map(|&q| q as i8 as i16)
                .sum();
            let got = i16::from_le_bytes([b[260 + 2 * j], b[261 + 2 * j]]);
            assert_eq!(got, want);
        }
    }
}
