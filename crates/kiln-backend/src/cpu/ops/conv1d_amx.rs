//! Stride-1 convolutions over `(channels, len)` feature maps as AMX bf16 tile products:
//! out (c_out, len_out) = W (c_out, c_in·k) · cols (c_in·k, len_out), cols[(i, j)][t] =
//! x[i][t + j·dilation − pad]. W is rounded to bf16 once per call; each thread takes chunks
//! of output positions and packs their receptive fields straight into tile order (no im2col
//! copy in f32), so a chunk's B stays in L2 while every output channel runs over it.

use crate::cpu::kernels::amx::{self, PackedB, MB, NB};
use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::CpuTensor;
use crate::Conv1dShape;

/// Output positions per packed chunk.
const CHUNK: usize = 128;

pub fn applies(s: &Conv1dShape) -> bool {
    s.stride == 1 && s.groups == 1 && s.c_out >= MB && s.len_out() >= NB && amx::available()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the direct form, at bf16 tolerance, with padding and dilation (where AMX runs).
    #[test]
    fn tiles_match_direct() {
        if !amx::available() {
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
}
