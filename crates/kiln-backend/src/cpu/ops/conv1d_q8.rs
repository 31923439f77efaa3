//! Stride-1 convolutions on integers through AMX int8 tiles, as ONNX's `ConvInteger` after
//! `DynamicQuantizeLinear` computes them: x (c_in, len) rounded to its per-tensor uint8 grid
//! (xq, scale sx, zero point zx), the weight held as uint8 (wq, scale sw[o], zero point zw[o]):
//!
//! ```text
//! out[o][t] = bias[o] + sx sw[o] Σ_{i,j} (xq[i][t + j dil - pad] - zx) (wq[o][i][j] - zw[o])
//!           = bias[o] + sx sw[o] (C[o][t] - zw[o] Sx[t] - zx Sw[o] + K zx zw[o])
//! ```
//!
//! with C = Σ xq wq (exact, `tdpbuud`), Sx[t] the sum of xq over t's receptive field (padding
//! holds zx, the grid's zero), Sw[o] the sum of wq over o's row and K = c_in k. No im2col: the
//! quantized input is laid out once in groups of 4 channels per time step, so the B tile of
//! tap j is the same buffer shifted by j dil steps; the weight is packed per tap at load.

use crate::cpu::kernels::amx::{self, BlockI32, MB, NB};
use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::CpuTensor;
use crate::Conv1dShape;

/// Input channels per tile row (64 bytes).
const KC: usize = 64;
/// Output positions per thread-local chunk (its B rows stay in L2 for every output block).
const CHUNK: usize = 256;

/// An integer convolution weight in tile order.
#[derive(Debug)]
pub struct PackedConvQ8 {
    pub c_in: usize,
    pub c_out: usize,
    pub k: usize,
    /// A per tap: [tap][op rows][cp bytes], zero-padded.
    a: Vec<u8>,
    op: usize,
    cp: usize,
    w_scale: Vec<f32>,
    w_zero: Vec<i32>,
    /// Σ_{i,j} wq[o][i][j]
    w_sum: Vec<i32>,
}

impl PackedConvQ8 {
    pub fn bytes(&self) -> usize {
        self.a.len() + 12 * self.c_out
    }
}

/// Whether a layer of shape `s` runs here.
pub fn applies(s: &Conv1dShape) -> bool {
    s.stride >= 1
        && (s.stride == 1 || s.dilation == 1)
        && s.groups == 1
        && s.k >= 1
        && amx::available()
}

/// Packs wq (c_out, c_in, k) with per-tensor (1 value) or per-output-channel zero points and
/// scales; None when the sizes do not fit.
pub fn pack(q: &[u8], zero: &[i32], scale: &[f32], s: &Conv1dShape) -> Option<PackedConvQ8> {
    let (c_in, c_out, k) = (s.c_in, s.c_out, s.k);
    let per = |n: usize| n == 1 || n == c_out;
    if q.len() != c_out * c_in * k || !per(zero.len()) || !per(scale.len()) {
        return None;
    }
    let (op, cp) = (amx::round_up(c_out, MB), amx::round_up(c_in, KC));
    let mut a = vec![0u8; k * op * cp];
    let mut w_sum = vec![0i32; c_out];
    for o in 0..c_out {
        for i in 0..c_in {
            for j in 0..k {
                let v = q[(o * c_in + i) * k + j];
                a[(j * op + o) * cp + i] = v;
                w_sum[o] += v as i32;
            }
        }
    }
    let pick = |v: &[i32], o: usize| if v.len() == 1 { v[0] } else { v[o] };
    let pickf = |v: &[f32], o: usize| if v.len() == 1 { v[0] } else { v[o] };
    Some(PackedConvQ8 {
        c_in,
        c_out,
        k,
        a,
        op,
        cp,
        w_scale: (0..c_out).map(|o| pickf(scale, o)).collect(),
        w_zero: (0..c_out).map(|o| pick(zero, o)).collect(),
        w_sum,
    })
}

/// DynamicQuantizeLinear's scale and zero point for x (as `fake_quant_u8`).
fn grid(x: &[f32]) -> (f32, f32) {
    let mut lo = [0f32; 16];
    let mut hi = [0f32; 16];
    let mut it = x.chunks_exact(16);
    for c in &mut it {
        for l in 0..16 {
            lo[l] = lo[l].min(c[l]);
            hi[l] = hi[l].max(c[l]);
        }
    }
    let (mut l, mut h) = (0f32, 0f32);
    for &v in it.remainder().iter().chain(&lo) {
        l = l.min(v);
    }
    for &v in it.remainder().iter().chain(&hi) {
        h = h.max(v);
    }
    let scale = (h - l) / 255.0;
    let zp = if scale == 0.0 {
        0.0
    } else {
        (-l / scale).round_ties_even().clamp(0.0, 255.0)
    };
    (scale, zp)
}

/// d[t] = the 4 bytes of x0[t], x1[t], x2[t], x3[t] rounded to the grid (scale, zero point)
/// as `fake_quant_u8` rounds: round half to even of x / scale, plus zp, clamped to 0..=255.
#[inline(always)]
fn quantize_body(d: &mut [u32], x: [&[f32]; 4], scale: f32, zp: f32) {
    const MAGIC: f32 = 12_582_912.0;
    // The clamped value is an integer in 0..=255: adding MAGIC leaves it in the low mantissa
    // bits (no float-to-int conversion, which does not vectorize with Rust's NaN rule).
    let q = |v: f32| {
        let r = ((v / scale + MAGIC) - MAGIC + zp).max(0.0).min(255.0);
        (r + MAGIC).to_bits() & 0xff
    };
    let n = d
        .len()
        .min(x[0].len())
        .min(x[1].len())
        .min(x[2].len())
        .min(x[3].len());
    let (a, b, c, e) = (&x[0][..n], &x[1][..n], &x[2][..n], &x[3][..n]);
    for (t, d) in d[..n].iter_mut().enumerate() {
        *d = q(a[t]) | (q(b[t]) << 8) | (q(c[t]) << 16) | (q(e[t]) << 24);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_avx512(d: &mut [u32], x: [&[f32]; 4], scale: f32, zp: f32) {
    quantize_body(d, x, scale, zp)
}

fn quantize_into(d: &mut [u32], x: [&[f32]; 4], scale: f32, zp: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::env::var_os("KILN_NO_SIMD").is_none() && is_x86_feature_detected!("avx512bw") {
        // SAFETY: the CPU has AVX-512F/BW (checked).
        return unsafe { quantize_avx512(d, x, scale, zp) };
    }
    quantize_body(d, x, scale, zp)
}

thread_local! {
    /// The quantized input in groups of 4 channels per time step (kept between calls).
    static XQ: std::cell::RefCell<Vec<u32>> = Default::default();
}

pub fn conv1d(
    pool: &Pool,
    x: &CpuTensor,
    w: &PackedConvQ8,
    bias: Option<&CpuTensor>,
    s: Conv1dShape,
    out: &mut CpuTensor,
) {
    let (c_in, c_out, k, len, dil) = (s.c_in, s.c_out, s.k, s.len_in, s.dilation);
    assert!(
        w.c_in == c_in && w.c_out == c_out && w.k == k,
        "conv1d_q8: weight shape"
    );
    let lo = s.len_out();
    assert!(x.data.len() >= c_in * len, "conv1d_q8 input too small");
    assert!(out.data.len() >= c_out * lo, "conv1d_q8 output too small");
    let bias_of = |o: usize| bias.map_or(0.0, |b| b.data[o]);
    let (sx, zx) = grid(&x.data[..c_in * len]);
    if sx == 0.0 {
        // x is all zeros: only the bias remains.
        for o in 0..c_out {
            out.data[o * lo..(o + 1) * lo].fill(bias_of(o));
        }
        return;
    }
    let zq = zx as u8;
    let (cp, op) = (w.cp, w.op);
    let nq = cp / 4;
    // Strided layers read `st` phases of the padded input, x_r[m] = x[m st + r - pad], each
    // laid out like a stride-1 input: tap j reads phase j % st shifted by j / st.
    let st = s.stride;
    let xs = if st == 1 {
        amx::round_up(lo.max(1), NB) + (k - 1) * dil
    } else {
        amx::round_up(lo.max(1), NB) + (k - 1) / st + 1
    };
    let pad_word = |p: usize| -> u32 {
        (0..4)
            .filter(|e| 4 * p + e < c_in)
            .fold(0, |w, e| w | (zq as u32) << (8 * e))
    };
    XQ.with(|cell| {
        let xq = &mut *cell.borrow_mut();
        xq.clear();
        xq.resize(st * nq * xs, 0);
        if st > 1 {
            let q1 = |v: f32| -> u32 {
                const MAGIC: f32 = 12_582_912.0;
                let r = ((v / sx + MAGIC) - MAGIC + zx).max(0.0).min(255.0);
                (r + MAGIC).to_bits() & 0xff
            };
            for r in 0..st {
                for p in 0..nq.min(c_in.div_ceil(4)) {
                    let row = &mut xq[(r * nq + p) * xs..(r * nq + p + 1) * xs];
                    for (m, d) in row.iter_mut().enumerate() {
                        let t = (m * st + r) as isize - s.pad as isize;
                        *d = if t >= 0 && (t as usize) < len {
                            let t = t as usize;
                            (0..4)
                                .filter(|e| 4 * p + e < c_in)
                                .fold(0, |w, e| w | q1(x.data[(4 * p + e) * len + t]) << (8 * e))
                        } else {
                            pad_word(p)
                        };
                    }
                }
            }
        }
        // Quantize and lay out: xq[p][u] = bytes of channels 4p..4p+4 at time u - pad.
        let dst = SharedMut(xq.as_mut_ptr() as *mut f32);
        pool.run(if st == 1 { nq } else { 0 }, |p0, p1| {
            let dst = dst;
            for p in p0..p1 {
                // SAFETY: row p of xq belongs to this thread alone; it lies inside xq.
                let row =
                    unsafe { std::slice::from_raw_parts_mut((dst.0 as *mut u32).add(p * xs), xs) };
                row.fill(pad_word(p));
                let t_end = len.min(xs.saturating_sub(s.pad));
                let d = &mut row[s.pad..s.pad + t_end];
                if 4 * p >= c_in {
                    // Padding channels: zeros throughout.
                } else if 4 * p + 4 <= c_in {
                    let src = |e: usize| &x.data[(4 * p + e) * len..(4 * p + e) * len + t_end];
                    quantize_into(d, [src(0), src(1), src(2), src(3)], sx, zx);
                } else {
                    // The last, partial group: channels past c_in stay 0.
                    let zeros = vec![0f32; t_end];
                    let src = |e: usize| {
                        let ch = 4 * p + e;
                        if ch < c_in {
                            &x.data[ch * len..ch * len + t_end]
                        } else {
                            &zeros[..]
                        }
                    };
                    quantize_into(d, [src(0), src(1), src(2), src(3)], sx, zx);
                    let keep = (1u64 << (8 * (c_in - 4 * p))) - 1;
                    for v in d.iter_mut() {
                        *v &= keep as u32;
                    }
                }
            }
        });
        // Sx[t] = Σ_j colsum[t st + j dil], colsum[v] = Σ_i xq[i][v] over padded positions v.
        let mut colsum = vec![0i32; st * xs];
        let mut phase = vec![0i32; xs];
        for r in 0..st {
            phase.fill(0);
            for p in 0..nq {
                let row = &xq[(r * nq + p) * xs..(r * nq + p + 1) * xs];
                for (c, &v) in phase.iter_mut().zip(row) {
                    *c += ((v & 0xff) + ((v >> 8) & 0xff) + ((v >> 16) & 0xff) + (v >> 24)) as i32;
                }
            }
            for (m, &c) in phase.iter().enumerate() {
                colsum[m * st + r] = c;
            }
        }
        let sxt: Vec<i32> = (0..lo)
            .map(|t| (0..k).map(|j| colsum[t * st + j * dil]).sum())
            .collect();
        let b_off: Vec<usize> = (0..k)
            .map(|j| {
                if st == 1 {
                    j * dil * 4
                } else {
                    ((j % st) * nq * xs + j / st) * 4
                }
            })
            .collect();
        let kk = (c_in * k) as i32;
        let zxi = zx as i32;
        // Per output channel: scale a[o] and the constant part of the sum.
        let a_o: Vec<f32> = w.w_scale.iter().map(|&v| v * sx).collect();
        let c_o: Vec<i32> = (0..c_out)
            .map(|o| kk * zxi * w.w_zero[o] - zxi * w.w_sum[o])
            .collect();
        let out_p = SharedMut(out.data.as_mut_ptr());
        let xq = &*xq;
        pool.run_aligned(lo, NB, |t0, t1| {
            let out_p = out_p;
            let mut blk = BlockI32::default();
            // SAFETY: AMX checked by applies() (the weight was packed only then).
            unsafe { amx::tiles_on() };
            for c0 in (t0..t1).step_by(CHUNK) {
                let c1 = (c0 + CHUNK).min(t1);
                for ob in 0..op / MB {
                    for tb in (c0..c1).step_by(NB) {
                        // SAFETY: A rows ob*32..+32 of every tap lie in w.a (op rows of cp
                        // bytes per tap); B rows 0..nq, columns tb..tb+32+(k-1)dil lie in
                        // xq (xs >= round_up(lo, 32) + (k-1) dil).
                        unsafe {
                            amx::conv_block_u8(
                                w.a.as_ptr().add(ob * MB * cp),
                                cp,
                                op * cp,
                                (xq.as_ptr() as *const u8).add(tb * 4),
                                xs * 4,
                                &b_off,
                                cp / KC,
                                &mut blk,
                            )
                        };
                        let nt = (c1 - tb).min(NB);
                        for r in 0..MB {
                            let o = ob * MB + r;
                            if o >= c_out {
                                break;
                            }
                            let (ao, co, zw, b) = (a_o[o], c_o[o], w.w_zero[o], bias_of(o));
                            let src = &blk.0[r * NB..r * NB + nt];
                            // SAFETY: columns tb..tb+nt of row o are this thread's (its range
                            // of output positions) and lie inside out (checked above).
                            let dst = unsafe {
                                std::slice::from_raw_parts_mut(out_p.0.add(o * lo + tb), nt)
                            };
                            for ((d, &cv), &sv) in dst.iter_mut().zip(src).zip(&sxt[tb..tb + nt]) {
                                *d = ao * (cv - zw * sv + co) as f32 + b;
                            }
                        }
                    }
                }
            }
            // SAFETY: as above.
            unsafe { amx::tiles_off() };
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the direct f32 form on the dequantized weight and the rounded input, with
    /// padding, dilation, tails of both tile dimensions and per-channel weight grids.
    #[test]
    fn matches_direct_on_the_rounded_input() {
        if !amx::available() {
            eprintln!("AMX not available here: skipped");
            return;
        }
        let pool = Pool::new(2);
        let mut seed = 0x1234_5678u32;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        for (c_in, c_out, len_in, k, stride, pad, dilation, per_channel) in [
            (22, 40, 100, 3, 1, 1, 1, false),
            (70, 33, 75, 7, 1, 9, 3, true),
            (128, 64, 64, 11, 1, 25, 5, false),
            (5, 32, 40, 1, 1, 0, 1, true),
            (22, 64, 250, 12, 6, 3, 1, false),
            (9, 40, 101, 3, 2, 1, 1, true),
        ] {
            let s = Conv1dShape {
                c_in,
                c_out,
                len_in,
                k,
                stride,
                pad,
                dilation,
                groups: 1,
                output_pad: 0,
            };
            let q: Vec<u8> = (0..c_out * c_in * k).map(|_| rnd() as u8).collect();
            let nz = if per_channel { c_out } else { 1 };
            let zero: Vec<i32> = (0..nz).map(|_| (rnd() % 256) as i32).collect();
            let scale: Vec<f32> = (0..nz)
                .map(|_| 1e-3 + (rnd() % 100) as f32 * 1e-4)
                .collect();
            let w = pack(&q, &zero, &scale, &s).unwrap();
            let wf: Vec<f32> = (0..q.len())
                .map(|i| {
                    let o = i / (c_in * k);
                    let (z, sc) = (zero[o % nz], scale[o % nz]);
                    (q[i] as i32 - z) as f32 * sc
                })
                .collect();
            let xv: Vec<f32> = (0..c_in * len_in)
                .map(|_| (rnd() % 2001) as f32 / 1000.0 - 0.7)
                .collect();
            let mut xr = CpuTensor {
                data: xv.clone(),
                cols: len_in,
            };
            super::super::signal::fake_quant_u8(&mut xr, c_in * len_in);
            let b = CpuTensor {
                data: (0..c_out).map(|o| o as f32 * 0.01).collect(),
                cols: c_out,
            };
            let lo = s.len_out();
            let wt = CpuTensor { data: wf, cols: k };
            let mut want = CpuTensor {
                data: vec![0.0; c_out * lo],
                cols: lo,
            };
            super::super::conv1d_nc::conv1d_direct(&pool, &xr, &wt, Some(&b), s, &mut want);
            let mut got = CpuTensor {
                data: vec![f32::NAN; c_out * lo],
                cols: lo,
            };
            let x = CpuTensor {
                data: xv,
                cols: len_in,
            };
            conv1d(&pool, &x, &w, Some(&b), s, &mut got);
            for (i, (&u, &v)) in got.data.iter().zip(&want.data).enumerate() {
                assert!(
                    (u - v).abs() <= 1e-4 * (1.0 + v.abs()),
                    "{s:?} at {i}: {u} vs {v}"
                );
            }
        }
    }
}
