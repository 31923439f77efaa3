//! Stride-1 convolutions over `(channels, len)` feature maps as AMX bf16 tile products:
//! out (c_out, len_out) = W (c_out, c_in·k) · cols (c_in·k, len_out), cols[(i, j)][t] =
//! x[i][t + j·dilation − pad]. W is rounded to bf16 once per call; each thread takes chunks
//! of output positions and packs their receptive fields straight into tile order (no im2col
//! copy in f32), so a chunk's B stays in L2 while every output channel runs over it.
//!
//! Transposed convolutions (groups 1, dilation 1) run as one such product of their `stride`
//! phases stacked, with the weight packed at load ([`PackedConvT`]).

use crate::cpu::kernels::amx::{self, PackedB, MB, NB};
use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::CpuTensor;
use crate::Conv1dShape;

/// Output positions per packed chunk.
const CHUNK: usize = 128;

pub fn applies(s: &Conv1dShape) -> bool {
    s.stride == 1 && s.groups == 1 && s.c_out >= MB && s.len_out() >= NB && amx::bf16_products()
}

thread_local! {
    static B: std::cell::RefCell<PackedB> = Default::default();
}

pub fn conv1d(
    pool: &Pool,
    x: &CpuTensor,
    w: &CpuTensor,
    bias: Option<&CpuTensor>,
    s: Conv1dShape,
    out: &mut CpuTensor,
) {
    let (lo, kk) = (s.len_out(), s.c_in * s.k);
    assert!(x.data.len() >= s.c_in * s.len_in, "conv1d input too small");
    assert!(w.data.len() >= s.c_out * kk, "conv1d weight too small");
    assert!(out.data.len() >= s.c_out * lo, "conv1d output too small");
    let kp = amx::round_up(kk, amx::TK);
    let mut a = Vec::new();
    amx::to_bf16_rows(&w.data, kk, s.c_out, kk, kp, &mut a);
    let dst = SharedMut(out.data.as_mut_ptr());
    let (k, dil) = (s.k, s.dilation);
    // x with `pad` zeros on the left and enough on the right for every tap of every output.
    let xs = lo + (k - 1) * dil;
    let mut xp = vec![0f32; s.c_in * xs];
    for i in 0..s.c_in {
        let n = s.len_in.min(xs - s.pad.min(xs));
        xp[i * xs + s.pad..i * xs + s.pad + n]
            .copy_from_slice(&x.data[i * s.len_in..i * s.len_in + n]);
    }
    let xp = &xp;
    pool.run_aligned(lo, CHUNK, |t0, t1| {
        let dst = dst;
        B.with(|cell| {
            let b = &mut *cell.borrow_mut();
            for c0 in (t0..t1).step_by(CHUNK) {
                let n = (t1 - c0).min(CHUNK);
                b.pack_k_rows(kk, n, |r| {
                    let (i, j) = (r / k, r % k);
                    let at = i * xs + c0 + j * dil;
                    &xp[at..at + n]
                });
                // SAFETY: AMX checked by applies(); columns c0..c0+n of every output row are
                // this thread's (its chunk of output positions).
                unsafe {
                    amx::gemm(&a, s.c_out, b, |i0, j0, blk| {
                        let (i1, j1) = ((i0 + MB).min(s.c_out), (j0 + NB).min(n));
                        for o in i0..i1 {
                            let bv = bias.map_or(0.0, |b| b.data[o]);
                            let row = &blk[(o - i0) * NB..];
                            for j in j0..j1 {
                                dst.write(o * lo + c0 + j, row[j - j0] + bv);
                            }
                        }
                    })
                };
            }
        })
    });
}

/// A transposed convolution's weight w (c_in, c_out, k) as its `stride` phases stacked into
/// one stride-1 product: output P = q stride + r (before the crop of `pad`) is
/// Σ_i Σ_{j < jt} w[i][o][r + j stride] x[i][q - j], so row r c_out + o of `a` holds
/// w[i][o][r + j stride] at column i jt + j (zero where r + j stride >= k), in bf16.
#[derive(Debug)]
pub struct PackedConvT {
    pub c_in: usize,
    pub c_out: usize,
    pub k: usize,
    pub stride: usize,
    /// Taps per phase: ceil(k / stride).
    jt: usize,
    a: Vec<u16>,
}

impl PackedConvT {
    pub fn bytes(&self) -> usize {
        self.a.len() * 2
    }
}

/// Packs w (c_in, c_out, k) for [`conv_transpose1d`]; None where that does not run shape `s`.
pub fn pack_transposed(w: &[f32], s: &Conv1dShape) -> Option<PackedConvT> {
    let (ci, co, k, st) = (s.c_in, s.c_out, s.k, s.stride);
    let runs = s.groups == 1 && s.dilation == 1 && st >= 1 && k >= 1 && co >= MB;
    if !runs || w.len() != ci * co * k || !amx::bf16_products() {
        return None;
    }
    let jt = k.div_ceil(st);
    let kk = ci * jt;
    let mut f = vec![0f32; st * co * kk];
    for i in 0..ci {
        for o in 0..co {
            for t in 0..k {
                let (r, j) = (t % st, t / st);
                f[(r * co + o) * kk + i * jt + j] = w[(i * co + o) * k + t];
            }
        }
    }
    let mut a = Vec::new();
    amx::to_bf16_rows(&f, kk, st * co, kk, amx::round_up(kk, amx::TK), &mut a);
    Some(PackedConvT {
        c_in: ci,
        c_out: co,
        k,
        stride: st,
        jt,
        a,
    })
}

/// out (c_out, len_out_transposed) = conv_transpose1d(x (c_in, len_in), w) + bias: every
/// phase at once, each output written once (out need not be zeroed).
pub fn conv_transpose1d(
    pool: &Pool,
    x: &CpuTensor,
    w: &PackedConvT,
    bias: Option<&CpuTensor>,
    s: Conv1dShape,
    out: &mut CpuTensor,
) {
    let (ci, co, st, jt) = (s.c_in, s.c_out, s.stride, w.jt);
    assert!(
        w.c_in == ci && w.c_out == co && w.k == s.k && w.stride == st,
        "conv_transpose1d: weight shape"
    );
    let (len, lo, pad) = (s.len_in, s.len_out_transposed(), s.pad);
    assert!(x.data.len() >= ci * len, "conv_transpose1d input too small");
    assert!(
        out.data.len() >= co * lo,
        "conv_transpose1d output too small"
    );
    // Columns q = q_first + c cover every P = q st + r in pad..pad + lo.
    let q_first = pad / st;
    let nq = (pad + lo).div_ceil(st) - q_first;
    // xp[i][u] = x[i][u + q_first - (jt - 1)], zeros outside: tap j of column c reads
    // u = c + jt - 1 - j.
    let xs = nq + jt - 1;
    let mut xp = vec![0f32; ci * xs];
    let shift = q_first as isize - (jt - 1) as isize;
    let u0 = (-shift).max(0) as usize;
    if u0 < xs {
        let t0 = (u0 as isize + shift) as usize;
        let n = (xs - u0).min(len.saturating_sub(t0));
        for i in 0..ci {
            xp[i * xs + u0..i * xs + u0 + n]
                .copy_from_slice(&x.data[i * len + t0..i * len + t0 + n]);
        }
    }
    let (kk, m) = (ci * jt, st * co);
    let dst = SharedMut(out.data.as_mut_ptr());
    let xp = &xp;
    pool.run_aligned(nq, CHUNK, |t0, t1| {
        let dst = dst;
        B.with(|cell| {
            let b = &mut *cell.borrow_mut();
            for c0 in (t0..t1).step_by(CHUNK) {
                let n = (t1 - c0).min(CHUNK);
                b.pack_k_rows(kk, n, |row| {
                    let at = (row / jt) * xs + c0 + jt - 1 - row % jt;
                    &xp[at..at + n]
                });
                // SAFETY: AMX checked at packing; each output (o, P - pad) comes from one
                // column q of one phase r, and the columns c0..c0+n are this thread's.
                unsafe {
                    amx::gemm(&w.a, m, b, |i0, j0, blk| {
                        for mm in i0..(i0 + MB).min(m) {
                            let (r, o) = (mm / co, mm % co);
                            let bv = bias.map_or(0.0, |b| b.data[o]);
                            let row = &blk[(mm - i0) * NB..];
                            for j in j0..(j0 + NB).min(n) {
                                let p = (q_first + c0 + j) * st + r;
                                if p >= pad && p < pad + lo {
                                    dst.write(o * lo + p - pad, row[j - j0] + bv);
                                }
                            }
                        }
                    })
                };
            }
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the direct form, at bf16 tolerance, with padding and dilation (where AMX runs).
    #[test]
    fn tiles_match_direct() {
        if !amx::bf16_products() {
            eprintln!("AMX not available here: skipped");
            return;
        }
        let pool = Pool::new(2);
        let mut seed = 0x2545_f491u32;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed as f32 / u32::MAX as f32) * 2.0 - 1.0
        };
        let t = |data: Vec<f32>, cols: usize| CpuTensor { data, cols };
        for (c_in, c_out, len_in, k, pad, dilation) in [
            (40, 48, 100, 3, 1, 1),
            (20, 64, 70, 7, 9, 3),
            (33, 32, 32, 1, 0, 1),
        ] {
            let s = Conv1dShape {
                c_in,
                c_out,
                len_in,
                k,
                stride: 1,
                pad,
                dilation,
                groups: 1,
                output_pad: 0,
            };
            assert!(applies(&s));
            let lo = s.len_out();
            let x = t((0..c_in * len_in).map(|_| rnd()).collect(), len_in);
            let w = t((0..c_out * c_in * k).map(|_| rnd()).collect(), k);
            let b = t((0..c_out).map(|_| rnd()).collect(), 1);
            let (mut o1, mut o2) = (t(vec![0.0; c_out * lo], lo), t(vec![0.0; c_out * lo], lo));
            conv1d(&pool, &x, &w, Some(&b), s, &mut o1);
            super::super::conv1d_nc::conv1d_direct(&pool, &x, &w, Some(&b), s, &mut o2);
            let tol = 4e-3 * ((c_in * k) as f32).sqrt();
            for (i, (&u, &v)) in o1.data.iter().zip(&o2.data).enumerate() {
                assert!(
                    (u - v).abs() <= tol * (1.0 + v.abs()),
                    "{s:?} at {i}: {u} vs {v}"
                );
            }
        }
    }

    /// Packed transposed convolutions against the direct form, at bf16 tolerance: strides
    /// dividing k or not, padding, output padding, lengths off the chunk grid.
    #[test]
    fn transposed_matches_direct() {
        if !amx::bf16_products() {
            eprintln!("AMX not available here: skipped");
            return;
        }
        let pool = Pool::new(2);
        let mut seed = 0x7f4a_7c15u32;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed as f32 / u32::MAX as f32) * 2.0 - 1.0
        };
        let t = |data: Vec<f32>, cols: usize| CpuTensor { data, cols };
        for (c_in, c_out, len_in, k, stride, pad, output_pad) in [
            (48, 32, 21, 20, 10, 5, 0),
            (40, 64, 150, 12, 6, 3, 0),
            (17, 33, 9, 7, 3, 2, 1),
            (32, 32, 300, 3, 2, 1, 1),
        ] {
            let s = Conv1dShape {
                c_in,
                c_out,
                len_in,
                k,
                stride,
                pad,
                dilation: 1,
                groups: 1,
                output_pad,
            };
            let lo = s.len_out_transposed();
            let x = t((0..c_in * len_in).map(|_| rnd()).collect(), len_in);
            let wv: Vec<f32> = (0..c_in * c_out * k).map(|_| rnd()).collect();
            let b = t((0..c_out).map(|_| rnd()).collect(), 1);
            let w = pack_transposed(&wv, &s).unwrap();
            let mut o1 = t(vec![f32::NAN; c_out * lo], lo);
            let mut o2 = t(vec![0.0; c_out * lo], lo);
            conv_transpose1d(&pool, &x, &w, Some(&b), s, &mut o1);
            let wt = t(wv, k);
            super::super::conv1d_nc::conv_transpose1d_direct(&pool, &x, &wt, Some(&b), s, &mut o2);
            let tol = 4e-3 * ((c_in * k) as f32).sqrt();
            for (i, (&u, &v)) in o1.data.iter().zip(&o2.data).enumerate() {
                assert!(
                    (u - v).abs() <= tol * (1.0 + v.abs()),
                    "{s:?} at {i}: {u} vs {v}"
                );
            }
        }
    }
}
