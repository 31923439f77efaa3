//! 1-D convolution and transposed convolution over `(channels, len)` feature maps.
//!
//! Stride-1 convolutions (and transposed ones, split into stride-1 phases) run as a tiled
//! product: 8 output channels x 32 time steps of accumulators, summed over (input channel,
//! tap) from a zero-padded copy of the input, so every window load is in bounds. The tile is
//! plain Rust compiled for AVX-512 / AVX2+FMA (picked at run time) or the baseline (NEON on
//! aarch64). Strided and grouped layers use the direct form (`*_direct`, also the reference
//! the tiled path is tested against): every (input channel, tap) pair adds `w * x[shifted]` to
//! the output row. Output channels are split over threads.

use crate::cpu::{CpuTensor, Pool};
use crate::Conv1dShape;

/// Range of output positions `t` whose source `t * stride + off` lies in `0..len_in`.
fn valid(off: isize, stride: usize, len_in: usize, len_out: usize) -> (usize, usize) {
    let s = stride as isize;
    let lo = if off >= 0 { 0 } else { ((-off) + s - 1) / s };
    let hi = if (len_in as isize) - off <= 0 {
        0
    } else {
        (((len_in as isize) - off + s - 1) / s) as usize
    };
    (lo as usize, hi.min(len_out))
}

/// Shares a mutable slice between threads that write disjoint rows.
#[derive(Clone, Copy)]
struct Rows(*mut f32);
// SAFETY: each thread writes only the rows of its own output-channel range.
unsafe impl Send for Rows {}
unsafe impl Sync for Rows {}

pub fn conv1d_direct(
    pool: &Pool,
    x: &CpuTensor,
    w: &CpuTensor,
    bias: Option<&CpuTensor>,
    s: Conv1dShape,
    out: &mut CpuTensor,
) {
    let lo_len = s.len_out();
    let (cig, cog) = (s.c_in / s.groups, s.c_out / s.groups);
    assert!(x.data.len() >= s.c_in * s.len_in, "conv1d input too small");
    assert!(
        w.data.len() >= s.c_out * cig * s.k,
        "conv1d weight too small"
    );
    assert!(
        out.data.len() >= s.c_out * lo_len,
        "conv1d output too small"
    );
    let rows = Rows(out.data.as_mut_ptr());
    pool.run(s.c_out, |a, b| {
        let rows = rows;
        for o in a..b {
            // SAFETY: row `o` belongs to this thread alone and lies inside `out` (checked).
            let y = unsafe { std::slice::from_raw_parts_mut(rows.0.add(o * lo_len), lo_len) };
            let b0 = bias.map_or(0.0, |b| b.data[o]);
            y.fill(b0);
            let g = o / cog;
            for i in 0..cig {
                let ci = g * cig + i;
                let xr = &x.data[ci * s.len_in..(ci + 1) * s.len_in];
                for k in 0..s.k {
                    let wv = w.data[(o * cig + i) * s.k + k];
                    if wv == 0.0 {
                        continue;
                    }
                    let off = (k * s.dilation) as isize - s.pad as isize;
                    let (t0, t1) = valid(off, s.stride, s.len_in, lo_len);
                    if t0 >= t1 {
                        continue;
                    }
                    if s.stride == 1 {
                        let src0 = (t0 as isize + off) as usize;
                        let xs = &xr[src0..src0 + (t1 - t0)];
                        for (yv, &xv) in y[t0..t1].iter_mut().zip(xs) {
                            *yv += wv * xv;
                        }
                    } else {
                        for t in t0..t1 {
                            y[t] += wv * xr[(t as isize * s.stride as isize + off) as usize];
                        }
                    }
                }
            }
        }
    });
}

pub fn conv_transpose1d_direct(
    pool: &Pool,
    x: &CpuTensor,
    w: &CpuTensor,
    bias: Option<&CpuTensor>,
    s: Conv1dShape,
    out: &mut CpuTensor,
) {
    let lo_len = s.len_out_transposed();
    let (cig, cog) = (s.c_in / s.groups, s.c_out / s.groups);
    assert!(
        x.data.len() >= s.c_in * s.len_in,
        "conv_transpose1d input too small"
    );
    assert!(
        w.data.len() >= s.c_in * cog * s.k,
        "conv_transpose1d weight too small"
    );
    assert!(
        out.data.len() >= s.c_out * lo_len,
        "conv_transpose1d output too small"
    );
    let rows = Rows(out.data.as_mut_ptr());
    // y[o, t * stride + k * dil - pad] += w[ci, o % cog, k] * x[ci, t]
    pool.run(s.c_out, |a, b| {
        let rows = rows;
        for o in a..b {
            // SAFETY: row `o` belongs to this thread alone and lies inside `out` (checked).
            let y = unsafe { std::slice::from_raw_parts_mut(rows.0.add(o * lo_len), lo_len) };
            y.fill(bias.map_or(0.0, |b| b.data[o]));
            let (g, oo) = (o / cog, o % cog);
            for i in 0..cig {
                let ci = g * cig + i;
                let xr = &x.data[ci * s.len_in..(ci + 1) * s.len_in];
                for k in 0..s.k {
                    let wv = w.data[(ci * cog + oo) * s.k + k];
                    let off = (k * s.dilation) as isize - s.pad as isize;
                    // Output index p = t * stride + off, 0 <= p < lo_len.
                    for (t, &xv) in xr.iter().enumerate() {
                        let p = t as isize * s.stride as isize + off;
                        if p >= 0 && (p as usize) < lo_len {
                            y[p as usize] += wv * xv;
                        }
                    }
                }
            }
        }
    });
}

const MR: usize = 8;
const NR: usize = 32;

/// acc[r][j] += sum_{i, k} wp[(i * kk + k) * MR + r] * xp[i * xs + t0 + k * dil + j]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tile_body(
    wp: &[f32],
    xp: &[f32],
    xs: usize,
    cin: usize,
    kk: usize,
    dil: usize,
    t0: usize,
    acc: &mut [[f32; NR]; MR],
) {
    let mut a = *acc;
    for i in 0..cin {
        let row = &xp[i * xs + t0..];
        let wr = &wp[i * kk * MR..(i + 1) * kk * MR];
        for k in 0..kk {
            let xv = &row[k * dil..k * dil + NR];
            let w = &wr[k * MR..(k + 1) * MR];
            for r in 0..MR {
                for j in 0..NR {
                    a[r][j] += w[r] * xv[j];
                }
            }
        }
    }
    *acc = a;
}

/// Bounds every tile reads, checked once before the unchecked SIMD loops.
#[cfg(target_arch = "x86_64")]
fn check_tile(wp: &[f32], xp: &[f32], xs: usize, cin: usize, kk: usize, dil: usize, t0: usize) {
    assert!(wp.len() >= cin * kk * MR, "tile weights");
    assert!(
        cin == 0 || xp.len() >= (cin - 1) * xs + t0 + (kk - 1) * dil + NR,
        "tile window"
    );
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_avx512(
    wp: &[f32],
    xp: &[f32],
    xs: usize,
    cin: usize,
    kk: usize,
    dil: usize,
    t0: usize,
    acc: &mut [[f32; NR]; MR],
) {
    use std::arch::x86_64::*;
    check_tile(wp, xp, xs, cin, kk, dil, t0);
    let (wp, xp) = (wp.as_ptr(), xp.as_ptr());
    let mut c = [[_mm512_setzero_ps(); 2]; MR];
    for r in 0..MR {
        c[r][0] = _mm512_loadu_ps(acc[r].as_ptr());
        c[r][1] = _mm512_loadu_ps(acc[r].as_ptr().add(16));
    }
    for i in 0..cin {
        let row = xp.add(i * xs + t0);
        let wr = wp.add(i * kk * MR);
        for k in 0..kk {
            let x0 = _mm512_loadu_ps(row.add(k * dil));
            let x1 = _mm512_loadu_ps(row.add(k * dil + 16));
            for r in 0..MR {
                let w = _mm512_set1_ps(*wr.add(k * MR + r));
                c[r][0] = _mm512_fmadd_ps(w, x0, c[r][0]);
                c[r][1] = _mm512_fmadd_ps(w, x1, c[r][1]);
            }
        }
    }
    for r in 0..MR {
        _mm512_storeu_ps(acc[r].as_mut_ptr(), c[r][0]);
        _mm512_storeu_ps(acc[r].as_mut_ptr().add(16), c[r][1]);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_avx2(
    wp: &[f32],
    xp: &[f32],
    xs: usize,
    cin: usize,
    kk: usize,
    dil: usize,
    t0: usize,
    acc: &mut [[f32; NR]; MR],
) {
    use std::arch::x86_64::*;
    check_tile(wp, xp, xs, cin, kk, dil, t0);
    let (wp, xp) = (wp.as_ptr(), xp.as_ptr());
    // Rows in groups of 4, time in halves of 16: 4 rows x 2 registers of accumulators.
    for g in 0..MR / 4 {
        for h in 0..2 {
            let mut c = [[_mm256_setzero_ps(); 2]; 4];
            for r in 0..4 {
                c[r][0] = _mm256_loadu_ps(acc[4 * g + r].as_ptr().add(16 * h));
                c[r][1] = _mm256_loadu_ps(acc[4 * g + r].as_ptr().add(16 * h + 8));
            }
            for i in 0..cin {
                let row = xp.add(i * xs + t0 + 16 * h);
                let wr = wp.add(i * kk * MR + 4 * g);
                for k in 0..kk {
                    let x0 = _mm256_loadu_ps(row.add(k * dil));
                    let x1 = _mm256_loadu_ps(row.add(k * dil + 8));
                    for r in 0..4 {
                        let w = _mm256_set1_ps(*wr.add(k * MR + r));
                        c[r][0] = _mm256_fmadd_ps(w, x0, c[r][0]);
                        c[r][1] = _mm256_fmadd_ps(w, x1, c[r][1]);
                    }
                }
            }
            for r in 0..4 {
                _mm256_storeu_ps(acc[4 * g + r].as_mut_ptr().add(16 * h), c[r][0]);
                _mm256_storeu_ps(acc[4 * g + r].as_mut_ptr().add(16 * h + 8), c[r][1]);
            }
        }
    }
}

type TileFn = fn(&[f32], &[f32], usize, usize, usize, usize, usize, &mut [[f32; NR]; MR]);

fn tile_fn() -> TileFn {
    #[cfg(target_arch = "x86_64")]
    {
        if !crate::cpu::kernels::simd_disabled() {
            if crate::cpu::kernels::avx512_allowed() {
                // SAFETY: the CPU has AVX-512F (checked above); bounds are checked inside.
                return |a, b, c, d, e, f, g, h| unsafe { tile_avx512(a, b, c, d, e, f, g, h) };
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                // SAFETY: the CPU has AVX2 and FMA (checked above); bounds are checked inside.
                return |a, b, c, d, e, f, g, h| unsafe { tile_avx2(a, b, c, d, e, f, g, h) };
            }
        }
    }
    tile_body
}

/// Weights w(o, i, k) packed for [`tiled`], per block of MR output channels:
/// [ob][i][k][r].
fn pack_tiled(
    w: &dyn Fn(usize, usize, usize) -> f32,
    cin: usize,
    kk: usize,
    cout: usize,
) -> Vec<f32> {
    let nob = cout.div_ceil(MR);
    let mut wp = vec![0f32; nob * cin * kk * MR];
    for o in 0..cout {
        let (ob, r) = (o / MR, o % MR);
        for i in 0..cin {
            for k in 0..kk {
                wp[((ob * cin + i) * kk + k) * MR + r] = w(o, i, k);
            }
        }
    }
    wp
}

/// out (cout, lo) = bias + sum_{i, k} w[o, i, k] * xp[i, t + k * dil], with `xp` rows of
/// length `xs >= lo.next_multiple_of(NR) + (kk - 1) * dil` (zero beyond the data) and `wp`
/// the weight [`pack_tiled`] packed.
#[allow(clippy::too_many_arguments)]
fn tiled(
    pool: &Pool,
    xp: &[f32],
    xs: usize,
    cin: usize,
    wp: &[f32],
    kk: usize,
    dil: usize,
    cout: usize,
    lo: usize,
    bias: Option<&CpuTensor>,
    out: &mut [f32],
    out_stride: usize,
    out_step: usize,
    out_off: usize,
) {
    let nob = cout.div_ceil(MR);
    assert_eq!(wp.len(), nob * cin * kk * MR, "tiled: packed weight size");
    let tile = tile_fn();
    let rows = Rows(out.as_mut_ptr());
    let out_len = out.len();
    // Threads take blocks of time steps; within a block every output-channel block reuses
    // the same input window (in cache), the packed weights stay in L2.
    const TB: usize = 8 * NR;
    let nt = lo.div_ceil(TB);
    pool.run(nt, |a, b| {
        let rows = rows;
        for tb in a..b {
            let (ts, te) = (tb * TB, ((tb + 1) * TB).min(lo));
            for ob in 0..nob {
                let wpb = &wp[ob * cin * kk * MR..(ob + 1) * cin * kk * MR];
                let mut t0 = ts;
                while t0 < te {
                    let mut acc = [[0f32; NR]; MR];
                    for (r, a) in acc.iter_mut().enumerate() {
                        let o = ob * MR + r;
                        if o < cout {
                            a.fill(bias.map_or(0.0, |b| b.data[o]));
                        }
                    }
                    tile(wpb, xp, xs, cin, kk, dil, t0, &mut acc);
                    for (r, a) in acc.iter().enumerate() {
                        let o = ob * MR + r;
                        if o >= cout {
                            break;
                        }
                        for (j, &v) in a.iter().enumerate().take((te - t0).min(NR)) {
                            let idx = o * out_stride + (t0 + j) * out_step + out_off;
                            assert!(idx < out_len);
                            // SAFETY: time steps ts..te of every row belong to this thread
                            // alone (disjoint across threads); idx is in bounds.
                            unsafe { *rows.0.add(idx) = v };
                        }
                    }
                    t0 += NR;
                }
            }
        }
    });
}

/// Zero-padded copy of x (cin, len): row i holds x[i] at offset `left`, rows of `xs` values.
fn padded(x: &[f32], cin: usize, len: usize, left: usize, xs: usize) -> Vec<f32> {
    let mut xp = vec![0f32; cin * xs];
    for i in 0..cin {
        let n = len.min(xs.saturating_sub(left));
        xp[i * xs + left..i * xs + left + n].copy_from_slice(&x[i * len..i * len + n]);
    }
    xp
}

pub fn conv1d(
    pool: &Pool,
    x: &CpuTensor,
    w: &CpuTensor,
    bias: Option<&CpuTensor>,
    s: Conv1dShape,
    out: &mut CpuTensor,
) {
    if s.stride != 1 || s.groups != 1 || s.c_out < MR {
        return conv1d_direct(pool, x, w, bias, s, out);
    }
    if super::conv1d_amx::applies(&s) {
        return super::conv1d_amx::conv1d(pool, x, w, bias, s, out);
    }
    let lo = s.len_out();
    assert!(x.data.len() >= s.c_in * s.len_in, "conv1d input too small");
    assert!(
        w.data.len() >= s.c_out * s.c_in * s.k,
        "conv1d weight too small"
    );
    assert!(out.data.len() >= s.c_out * lo, "conv1d output too small");
    let xs = lo.next_multiple_of(NR) + (s.k - 1) * s.dilation;
    let xp = padded(&x.data, s.c_in, s.len_in, s.pad, xs);
    let (cin, k) = (s.c_in, s.k);
    let wf = |o: usize, i: usize, kk: usize| w.data[(o * cin + i) * k + kk];
    tiled(
        pool,
        &xp,
        xs,
        cin,
        &pack_tiled(&wf, cin, k, s.c_out),
        k,
        s.dilation,
        s.c_out,
        lo,
        bias,
        &mut out.data,
        lo,
        1,
        0,
    );
}

/// Below this many rows an f32 matmul stays on the row-dot path.
pub const GEMM_MIN_ROWS: usize = 16;

/// out (n, rows) = x (n, cols) @ W^T (+ bias) for an f32 weight, as the tiled product of a
/// 1-tap convolution over x^T (tokens as time steps).
pub fn matmul_f32(
    pool: &Pool,
    w: &crate::cpu::CpuWeight,
    x: &CpuTensor,
    bias: Option<&CpuTensor>,
    n: usize,
    out: &mut CpuTensor,
) {
    let (rows, cols) = (w.rows, w.cols);
    assert!(
        x.cols == cols && x.data.len() >= n * cols,
        "matmul input shape"
    );
    assert!(
        out.cols == rows && out.data.len() >= n * rows,
        "matmul output shape"
    );
    let xs = n.next_multiple_of(NR);
    let mut xp = vec![0f32; cols * xs];
    for t in 0..n {
        for (c, &v) in x.data[t * cols..(t + 1) * cols].iter().enumerate() {
            xp[c * xs + t] = v;
        }
    }
    let wf = |o: usize, i: usize, _k: usize| {
        let b = &w.bytes[(o * cols + i) * 4..(o * cols + i) * 4 + 4];
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    };
    let mut yt = vec![0f32; rows * n];
    let wp = pack_tiled(&wf, cols, 1, rows);
    tiled(
        pool, &xp, xs, cols, &wp, 1, 1, rows, n, bias, &mut yt, n, 1, 0,
    );
    for o in 0..rows {
        for t in 0..n {
            out.data[t * rows + o] = yt[o * n + t];
        }
    }
}

/// A transposed convolution's weight (c_in, c_out, k) packed once, phase by phase, for
/// [`conv_transpose1d_packed`] (where no bf16 block products run it): the f32 tiles'
/// layout, which [`conv_transpose1d`] otherwise makes at every call.
pub struct PackedPhases {
    s: (usize, usize, usize, usize),
    /// Per phase r (of `stride`): its taps' weights packed for [`tiled`].
    phases: Vec<Vec<f32>>,
}

impl PackedPhases {
    pub fn bytes(&self) -> usize {
        self.phases.iter().map(|p| p.len() * 4).sum()
    }
}

/// Taps of phase r of a transposed convolution with `k` taps and stride `st`.
fn phase_taps(r: usize, k: usize, st: usize) -> usize {
    if r < k {
        (k - r).div_ceil(st)
    } else {
        0
    }
}

/// Phase r's weight as the tiles read it: w[i, o, r + (jr - 1 - jj) st] at (o, i, jj).
fn phase_weight(w: &[f32], s: &Conv1dShape, r: usize) -> Vec<f32> {
    let (st, cout, k) = (s.stride, s.c_out, s.k);
    let jr = phase_taps(r, k, st);
    let wf = |o: usize, i: usize, jj: usize| w[(i * cout + o) * k + r + (jr - 1 - jj) * st];
    pack_tiled(&wf, s.c_in, jr, cout)
}

/// Packs w (c_in, c_out, k) for [`conv_transpose1d_packed`]; None where that does not run
/// shape `s` (the direct form does).
pub fn pack_phases(w: &[f32], s: &Conv1dShape) -> Option<PackedPhases> {
    let runs = s.groups == 1 && s.dilation == 1 && s.c_out >= MR && s.stride >= 1;
    if !runs || w.len() != s.c_in * s.c_out * s.k {
        return None;
    }
    Some(PackedPhases {
        s: (s.c_in, s.c_out, s.k, s.stride),
        phases: (0..s.stride).map(|r| phase_weight(w, s, r)).collect(),
    })
}

/// Transposed convolution as `stride` stride-1 phases: output P = q * stride + r (before the
/// crop of `pad`) takes taps k = r + j * stride of inputs t = q - j.
pub fn conv_transpose1d(
    pool: &Pool,
    x: &CpuTensor,
    w: &CpuTensor,
    bias: Option<&CpuTensor>,
    s: Conv1dShape,
    out: &mut CpuTensor,
) {
    if s.groups != 1 || s.dilation != 1 || s.c_out < MR {
        return conv_transpose1d_direct(pool, x, w, bias, s, out);
    }
    assert!(
        w.data.len() >= s.c_in * s.c_out * s.k,
        "conv_transpose1d weight too small"
    );
    phases(pool, x, Phases::Raw(&w.data), bias, s, out)
}

/// [`conv_transpose1d`] over a weight [`pack_phases`] packed for shape `s`.
pub fn conv_transpose1d_packed(
    pool: &Pool,
    x: &CpuTensor,
    w: &PackedPhases,
    bias: Option<&CpuTensor>,
    s: Conv1dShape,
    out: &mut CpuTensor,
) {
    assert!(
        w.s == (s.c_in, s.c_out, s.k, s.stride) && s.groups == 1 && s.dilation == 1,
        "conv_transpose1d_packed: weight shape"
    );
    phases(pool, x, Phases::Packed(w), bias, s, out)
}

/// A transposed convolution's weight as [`phases`] takes it.
enum Phases<'a> {
    /// (c_in, c_out, k) as stored: each phase packed at the call.
    Raw(&'a [f32]),
    Packed(&'a PackedPhases),
}

fn phases(
    pool: &Pool,
    x: &CpuTensor,
    weight: Phases,
    bias: Option<&CpuTensor>,
    s: Conv1dShape,
    out: &mut CpuTensor,
) {
    let lo = s.len_out_transposed();
    assert!(
        x.data.len() >= s.c_in * s.len_in,
        "conv_transpose1d input too small"
    );
    assert!(
        out.data.len() >= s.c_out * lo,
        "conv_transpose1d output too small"
    );
    let (st, cout, k) = (s.stride, s.c_out, s.k);
    for r in 0..st {
        let jr = phase_taps(r, k, st);
        // Output indices of this phase: p = q * st + r - pad in 0..lo.
        let q0 = (s.pad.saturating_sub(r)).div_ceil(st);
        if q0 * st + r < s.pad {
            continue;
        }
        let p0 = q0 * st + r - s.pad;
        if p0 >= lo {
            continue;
        }
        let nq = (lo - p0).div_ceil(st);
        if jr == 0 {
            for o in 0..cout {
                for q in 0..nq {
                    out.data[o * lo + p0 + q * st] = bias.map_or(0.0, |b| b.data[o]);
                }
            }
            continue;
        }
        // out_r[q'] (q = q0 + q') = sum_i sum_jj w[i, o, r + (jr - 1 - jj) * st] * x[i, q - (jr - 1) + jj]
        let xs = nq.next_multiple_of(NR) + (jr - 1);
        let left = jr - 1; // xp[u] = x[u - left + q0]
        let mut xp = vec![0f32; s.c_in * xs];
        for i in 0..s.c_in {
            for u in 0..xs {
                let t = u as isize - left as isize + q0 as isize;
                if t >= 0 && (t as usize) < s.len_in {
                    xp[i * xs + u] = x.data[i * s.len_in + t as usize];
                }
            }
        }
        let phase = Conv1dShape {
            c_in: s.c_in,
            c_out: cout,
            len_in: xs,
            k: jr,
            stride: 1,
            pad: 0,
            dilation: 1,
            groups: 1,
            output_pad: 0,
        };
        let packed;
        let wp: &[f32] = match weight {
            Phases::Packed(p) => &p.phases[r],
            Phases::Raw(w) if super::conv1d_amx::applies(&phase) => {
                // This phase as a stride-1 convolution on AMX bf16 tiles, then spread over
                // its output positions.
                let mut wp = Vec::with_capacity(cout * s.c_in * jr);
                for o in 0..cout {
                    for i in 0..s.c_in {
                        for jj in 0..jr {
                            wp.push(w[(i * cout + o) * k + r + (jr - 1 - jj) * st]);
                        }
                    }
                }
                let wt = CpuTensor { data: wp, cols: jr };
                let xt = CpuTensor { data: xp, cols: xs };
                let lo2 = phase.len_out();
                let mut tmp = CpuTensor {
                    data: vec![0f32; cout * lo2],
                    cols: lo2,
                };
                super::conv1d_amx::conv1d(pool, &xt, &wt, bias, phase, &mut tmp);
                for o in 0..cout {
                    let src = &tmp.data[o * lo2..o * lo2 + nq];
                    for (q, &v) in src.iter().enumerate() {
                        out.data[o * lo + p0 + q * st] = v;
                    }
                }
                continue;
            }
            Phases::Raw(w) => {
                packed = phase_weight(w, &s, r);
                &packed
            }
        };
        tiled(
            pool,
            &xp,
            xs,
            s.c_in,
            wp,
            jr,
            1,
            cout,
            nq,
            bias,
            &mut out.data,
            lo,
            st,
            p0,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    }

    fn t(data: Vec<f32>, cols: usize) -> CpuTensor {
        CpuTensor { data, cols }
    }

    /// Every SIMD tile this CPU runs against the portable one.
    #[test]
    fn tiles_agree() {
        let mut seed = 3;
        let (cin, kk, dil, xs) = (5, 3, 2, 80);
        let wp = rand(cin * kk * MR, &mut seed);
        let xp = rand(cin * xs, &mut seed);
        let init: Vec<f32> = rand(MR * NR, &mut seed);
        let mut want = [[0f32; NR]; MR];
        for r in 0..MR {
            want[r].copy_from_slice(&init[r * NR..(r + 1) * NR]);
        }
        let start = want;
        tile_body(&wp, &xp, xs, cin, kk, dil, 7, &mut want);
        #[allow(unused_mut)]
        let mut sets: Vec<(&str, TileFn)> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") {
                sets.push(("avx512", |a, b, c, d, e, f, g, h| unsafe {
                    tile_avx512(a, b, c, d, e, f, g, h)
                }));
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                sets.push(("avx2", |a, b, c, d, e, f, g, h| unsafe {
                    tile_avx2(a, b, c, d, e, f, g, h)
                }));
            }
        }
        for (name, f) in sets {
            let mut got = start;
            f(&wp, &xp, xs, cin, kk, dil, 7, &mut got);
            for r in 0..MR {
                for j in 0..NR {
                    assert!((got[r][j] - want[r][j]).abs() < 1e-5, "{name} [{r}][{j}]");
                }
            }
        }
    }

    /// Tiled paths against the direct form on odd shapes (tails of both tile dimensions).
    #[test]
    fn tiled_matches_direct() {
        let pool = Pool::new(2);
        let mut seed = 7;
        for &(c_in, c_out, len_in, k, stride, pad, dilation, output_pad) in &[
            (5, 7, 37, 3, 1, 1, 1, 0),
            (6, 9, 50, 7, 1, 9, 3, 0),
            (3, 4, 17, 11, 1, 25, 5, 0),
            (8, 5, 13, 20, 10, 5, 1, 0),
            (7, 6, 21, 12, 6, 3, 1, 0),
            (4, 5, 9, 3, 2, 1, 1, 1),
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
                output_pad,
            };
            let x = t(rand(c_in * len_in, &mut seed), len_in);
            let b = t(rand(c_out, &mut seed), 1);
            let w = t(rand(c_out * c_in * k, &mut seed), k);
            let check = |a: &[f32], r: &[f32], what: &str| {
                assert_eq!(a.len(), r.len());
                for (i, (&u, &v)) in a.iter().zip(r).enumerate() {
                    assert!(
                        (u - v).abs() <= 1e-5 * (1.0 + v.abs()),
                        "{what} {s:?} at {i}: {u} vs {v}"
                    );
                }
            };
            if stride == 1 {
                let lo = s.len_out();
                let (mut o1, mut o2) = (t(vec![0.0; c_out * lo], lo), t(vec![0.0; c_out * lo], lo));
                conv1d(&pool, &x, &w, Some(&b), s, &mut o1);
                conv1d_direct(&pool, &x, &w, Some(&b), s, &mut o2);
                check(&o1.data, &o2.data, "conv1d");
            }
            let lo = s.len_out_transposed();
            let wt = t(rand(c_in * c_out * k, &mut seed), k);
            let (mut o1, mut o2) = (t(vec![9.0; c_out * lo], lo), t(vec![0.0; c_out * lo], lo));
            conv_transpose1d(&pool, &x, &wt, Some(&b), s, &mut o1);
            conv_transpose1d_direct(&pool, &x, &wt, Some(&b), s, &mut o2);
            check(&o1.data, &o2.data, "conv_transpose1d");
        }
    }
}
