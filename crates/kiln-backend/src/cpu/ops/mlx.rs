//! Matrix products with MLX affine-quantized weights (`kiln_quant::mlx`), natively: q stay 4
//! or 8-bit integers with the checkpoint's own groups, scales and biases — never converted
//! to another block format.
//!
//! W (rows, cols) @ x (n, cols): for row r and token t,
//!   out[t][r] = sum_g scale[r][g] * (sum_{j in g} q[r][j] * x[t][j]) + bias[r][g] * X[t][g]
//! with X[t][g] = sum_{j in g} x[t][j] in f32 (once per call). The q . x part is an integer
//! dot product against x quantized to 16-bit blocks of 32 (d = max|x| / 32767: rounding
//! 256x finer than the 8-bit activations of the GGML formats, so MLX results stay within
//! ~1e-4 of f32 arithmetic), summed per block with the block's scale; a scalar kernel and
//! AVX2 ones (one row, four rows), chosen at run time (the scalar one under `KILN_NO_SIMD`
//! or the scalar kernel set).
//!
//! Layout held (made at load, lossless): 8-bit q as stored; 4-bit q repacked per 32 values
//! into 16 bytes, value i in the low nibble of byte i and value i+16 in its high nibble (MLX
//! packs neighbours into one byte), so the kernel splits a block with one shift.

use std::cell::RefCell;

use kiln_quant::{mlx_q, GgmlType, MlxLayout};

use super::dot;
use super::matmul::{Epilogue, Job};
use crate::cpu::kernels::{Kernels, QuantAct};
use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::{CpuTensor, CpuWeight};
use crate::MlxWeightData;

/// Rows per work unit.
const ROW_TILE: usize = 16;

/// Scales and biases of an MLX weight (f32, `groups` per row); the q are the weight's
/// `bytes`, `row_bytes` per row, in the layout above.
pub struct MlxParts {
    pub layout: MlxLayout,
    pub groups: usize,
    pub scales: Vec<f32>,
    pub biases: Vec<f32>,
}

/// Value `j` of a row in the held layout.
#[inline(always)]
fn held_q(bits: u32, q: &[u8], j: usize) -> i32 {
    match bits {
        4 => {
            let (blk, i) = (j / 32, j % 32);
            let b = q[blk * 16 + i % 16];
            (if i < 16 { b & 0xf } else { b >> 4 }) as i32
        }
        _ => q[j] as i32,
    }
}

impl MlxParts {
    pub fn dequant_row(&self, q: &[u8], r: usize, out: &mut [f32]) {
        let (g, gs) = (self.groups, self.layout.group);
        for (j, o) in out.iter_mut().enumerate() {
            let k = r * g + j / gs;
            *o = self.scales[k] * held_q(self.layout.bits, q, j) as f32 + self.biases[k];
        }
    }

    /// Bytes held besides the q.
    pub fn extra_bytes(&self) -> usize {
        4 * (self.scales.len() + self.biases.len())
    }
}

/// Takes the q into the held layout and the scales and biases as f32. The caller has
/// checked the parts' lengths (`MlxWeightData::check`).
pub fn load(w: MlxWeightData) -> CpuWeight {
    let groups = w.layout.groups(w.cols);
    let rb = w.layout.q_bytes(w.cols);
    let mut bytes = w.q.to_vec();
    if w.layout.bits == 4 {
        for (src, dst) in w.q.chunks_exact(rb).zip(bytes.chunks_exact_mut(rb)) {
            for (b, out) in dst.chunks_exact_mut(16).enumerate() {
                for (i, o) in out.iter_mut().enumerate() {
                    let lo = mlx_q(4, src, b * 32 + i) as u8;
                    let hi = mlx_q(4, src, b * 32 + i + 16) as u8;
                    *o = lo | hi << 4;
                }
            }
        }
    }
    CpuWeight {
        // Not a GGML format: `mlx` marks the weight, and every path that reads `bytes`
        // checks it first.
        ty: GgmlType::F32,
        rows: w.rows,
        cols: w.cols,
        row_bytes: rb,
        x8: false,
        bytes: bytes.into(),
        mlx: Some(Box::new(MlxParts {
            layout: w.layout,
            groups,
            scales: w.scales.to_vec(),
            biases: w.biases.to_vec(),
        })),
        amx: None,
        i8: None,
        f32p: None,
        conv: None,
        conv_t: None,
    }
}

/// Activations of one token as 16-bit blocks of 32: x[j] ~ d[j / 32] * q[j].
#[derive(Clone, Copy)]
pub struct Act16<'a> {
    pub q: &'a [i16],
    pub d: &'a [f32],
}

/// Quantizes `x` (a multiple of 32 values) into `q` and `d` (one scale per 32).
pub fn quantize_act16(x: &[f32], q: &mut [i16], d: &mut [f32]) {
    for ((xb, qb), db) in x
        .chunks_exact(32)
        .zip(q.chunks_exact_mut(32))
        .zip(d.iter_mut())
    {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = amax / 32767.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        for (o, &v) in qb.iter_mut().zip(xb) {
            *o = (v * inv).round().clamp(-32767.0, 32767.0) as i16;
        }
        *db = scale;
    }
}

/// One row times one token: `q` the row's held bytes, `a` the token's 8-bit blocks, `xg`
/// the f32 sums of its values per group. Scalar reference.
fn row_dot_scalar(p: &MlxParts, r: usize, q: &[u8], a: Act16, xg: &[f32]) -> f32 {
    let (gs, bits) = (p.layout.group, p.layout.bits);
    let bpg = gs / 32;
    let qb = 32 * bits as usize / 8;
    let (s, b) = (
        &p.scales[r * p.groups..(r + 1) * p.groups],
        &p.biases[r * p.groups..(r + 1) * p.groups],
    );
    let mut v = 0f32;
    for g in 0..p.groups {
        let mut qx = 0f32;
        for k in g * bpg..(g + 1) * bpg {
            let qk = &q[k * qb..(k + 1) * qb];
            let xk = &a.q[k * 32..(k + 1) * 32];
            let mut d = 0i32;
            for i in 0..32 {
                d += held_q(bits, qk, i) * xk[i] as i32;
            }
            qx += d as f32 * a.d[k];
        }
        v += s[g] * qx;
    }
    v + dot(b, xg)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Act16, MlxParts};
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// Integer dot product of one 32-value block of held q with 16-bit activations.
    #[inline(always)]
    unsafe fn block_dot(bits: u32, q: *const u8, x: *const i16) -> __m256i {
        let (q0, q1) = if bits == 4 {
            let raw = _mm_loadu_si128(q as *const __m128i);
            let m = _mm_set1_epi8(0xf);
            (
                _mm_and_si128(raw, m),
                _mm_and_si128(_mm_srli_epi16(raw, 4), m),
            )
        } else {
            (
                _mm_loadu_si128(q as *const __m128i),
                _mm_loadu_si128(q.add(16) as *const __m128i),
            )
        };
        let x0 = _mm256_loadu_si256(x as *const __m256i);
        let x1 = _mm256_loadu_si256(x.add(16) as *const __m256i);
        _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_cvtepu8_epi16(q0), x0),
            _mm256_madd_epi16(_mm256_cvtepu8_epi16(q1), x1),
        )
    }

    /// As `row_dot_scalar`, 8 lanes wide.
    ///
    /// # Safety
    /// AVX2 and FMA are available; `q`, `a`, `xg` cover the row's cols.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn row_dot(p: &MlxParts, r: usize, q: &[u8], a: Act16, xg: &[f32]) -> f32 {
        let (gs, bits, ng) = (p.layout.group, p.layout.bits, p.groups);
        let bpg = gs / 32;
        let qb = 32 * bits as usize / 8;
        let s = &p.scales[r * ng..(r + 1) * ng];
        let b = &p.biases[r * ng..(r + 1) * ng];
        let mut acc = _mm256_setzero_ps();
        for g in 0..ng {
            let mut acc_g = _mm256_setzero_ps();
            for k in g * bpg..(g + 1) * bpg {
                let d = block_dot(bits, q.as_ptr().add(k * qb), a.q.as_ptr().add(k * 32));
                let dk = _mm256_broadcast_ss(a.d.get_unchecked(k));
                acc_g = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), dk, acc_g);
            }
            acc = _mm256_fmadd_ps(acc_g, _mm256_broadcast_ss(s.get_unchecked(g)), acc);
        }
        hsum(acc) + crate::cpu::ops::dot(b, xg)
    }

    /// Rows r..r+4 (`q` holds their bytes, `rb` each) against one token, sharing the
    /// activation loads.
    ///
    /// # Safety
    /// As `row_dot`, for four rows.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn row_dot4(
        p: &MlxParts,
        r: usize,
        q: &[u8],
        rb: usize,
        a: Act16,
        xg: &[f32],
    ) -> [f32; 4] {
        let (gs, bits, ng) = (p.layout.group, p.layout.bits, p.groups);
        let bpg = gs / 32;
        let qb = 32 * bits as usize / 8;
        let s = p.scales.as_ptr().add(r * ng);
        let mut acc = [_mm256_setzero_ps(); 4];
        for g in 0..ng {
            let mut acc_g = [_mm256_setzero_ps(); 4];
            for k in g * bpg..(g + 1) * bpg {
                let dk = _mm256_broadcast_ss(a.d.get_unchecked(k));
                let x = a.q.as_ptr().add(k * 32);
                for i in 0..4 {
                    let d = block_dot(bits, q.as_ptr().add(i * rb + k * qb), x);
                    acc_g[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), dk, acc_g[i]);
                }
            }
            for i in 0..4 {
                let sg = _mm256_broadcast_ss(&*s.add(i * ng + g));
                acc[i] = _mm256_fmadd_ps(acc_g[i], sg, acc[i]);
            }
        }
        let mut out = [0f32; 4];
        for i in 0..4 {
            let b = &p.biases[(r + i) * ng..(r + i + 1) * ng];
            out[i] = hsum(acc[i]) + crate::cpu::ops::dot(b, xg);
        }
        out
    }
}

type RowDot = fn(&MlxParts, usize, &[u8], Act16, &[f32]) -> f32;
type RowDot4 = fn(&MlxParts, usize, &[u8], usize, Act16, &[f32]) -> [f32; 4];

fn pick4(kernels: &Kernels) -> Option<RowDot4> {
    #[cfg(target_arch = "x86_64")]
    if kernels.name != "scalar"
        && !crate::cpu::kernels::simd_disabled()
        && std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
    {
        // SAFETY: AVX2 and FMA were detected just above.
        return Some(|p, r, q, rb, a, xs| unsafe { avx2::row_dot4(p, r, q, rb, a, xs) });
    }
    let _ = kernels;
    None
}

fn pick(kernels: &Kernels) -> RowDot {
    #[cfg(target_arch = "x86_64")]
    if kernels.name != "scalar"
        && !crate::cpu::kernels::simd_disabled()
        && std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
    {
        // SAFETY: AVX2 and FMA were detected just above.
        return |p, r, q, a, xs| unsafe { avx2::row_dot(p, r, q, a, xs) };
    }
    let _ = kernels;
    row_dot_scalar
}

thread_local! {
    /// Per call (reused across calls): sums of x per group of 32, 64 and 128 values per
    /// token, and x as 16-bit blocks (values, scales).
    static XSUMS: RefCell<(Vec<f32>, Vec<i16>, Vec<f32>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// Whether the job's weight (or its gate/up partner) is an MLX weight.
pub fn involves_mlx(j: &Job) -> bool {
    j.w.mlx.is_some() || matches!(j.epilogue, Epilogue::SiluMul(up) if up.mlx.is_some())
}

/// Runs jobs of which at least one has an MLX weight: other weights go to the general path
/// one job at a time; MLX ones here, all in one parallel op.
pub fn matmul_jobs(
    pool: &Pool,
    kernels: &Kernels,
    act: &mut QuantAct,
    x: &CpuTensor,
    n: usize,
    jobs: &mut [Job],
) {
    let is_mlx = |j: &Job| involves_mlx(j);
    if !jobs.iter().all(is_mlx) {
        for j in jobs.iter_mut() {
            if is_mlx(j) {
                matmul_jobs(pool, kernels, act, x, n, std::slice::from_mut(j));
            } else {
                super::matmul::matmul_jobs(pool, kernels, act, x, n, std::slice::from_mut(j));
            }
        }
        return;
    }
    let cols = x.cols;
    for j in jobs.iter() {
        assert_eq!(j.w.cols, cols, "matmul: x has {cols} cols, W {}", j.w.cols);
        assert_eq!(j.out.cols, j.w.rows, "matmul: out cols vs W rows");
        if let Epilogue::SiluMul(up) = j.epilogue {
            assert!(up.rows == j.w.rows && up.cols == cols);
        }
    }
    let (row_dot, row_dot4) = (pick(kernels), pick4(kernels));
    let _ = act;
    XSUMS.with(|scratch| {
        let (xs, aq, ad) = &mut *scratch.borrow_mut();
        // Groups are whole multiples of 32 (checked at load), so cols is too.
        let nb = cols / 32;
        aq.resize(n * cols, 0);
        ad.resize(n * nb, 0.0);
        for t in 0..n {
            quantize_act16(
                &x.data[t * cols..(t + 1) * cols],
                &mut aq[t * cols..(t + 1) * cols],
                &mut ad[t * nb..(t + 1) * nb],
            );
        }
        let (aq, ad) = (&aq[..], &ad[..]);
        let act_row = |t: usize| Act16 {
            q: &aq[t * cols..(t + 1) * cols],
            d: &ad[t * nb..(t + 1) * nb],
        };
        // Per token: sums per 32 values, then per 64, then per 128 (where cols allows).
        let (n32, n64, n128) = (cols / 32, cols / 64, cols / 128);
        let per = n32 + n64 + n128;
        xs.clear();
        for t in 0..n {
            let row = &x.data[t * cols..(t + 1) * cols];
            let start = xs.len();
            xs.extend(row.chunks_exact(32).map(|c| c.iter().sum::<f32>()));
            for (from, count) in [(start, n64), (start + n32, n128)] {
                for i in 0..count {
                    let v = xs[from + 2 * i] + xs[from + 2 * i + 1];
                    xs.push(v);
                }
            }
        }
        let xs = &xs[..n * per];

        // This token's sums for groups of `g` values.
        let group_sums = |t: usize, g: usize| -> &[f32] {
            let base = t * per;
            match g {
                32 => &xs[base..base + n32],
                64 => &xs[base + n32..base + n32 + n64],
                _ => &xs[base + n32 + n64..base + per],
            }
        };
        let mut outs = Vec::with_capacity(jobs.len());
        let mut starts = Vec::with_capacity(jobs.len());
        let mut total = 0;
        for j in jobs.iter_mut() {
            outs.push((SharedMut(j.out.data.as_mut_ptr()), j.w.rows));
            starts.push(total);
            total += j.w.rows.div_ceil(ROW_TILE) * ROW_TILE;
        }
        let jobs = &*jobs;
        let (outs, starts) = (&outs, &starts);
        pool.run_aligned(total, ROW_TILE, |v0, v1| {
            let mut buf = Vec::new();
            // Weight rows r0..r1 times every token, four rows at a time where a kernel
            // for four exists: emit(t, r, value).
            let dots = |w: &CpuWeight,
                        r0: usize,
                        r1: usize,
                        buf: &mut Vec<f32>,
                        emit: &mut dyn FnMut(usize, usize, f32)| {
                let rb = w.row_bytes;
                match w.mlx.as_deref() {
                    Some(p) => {
                        let mut r = r0;
                        if let Some(k4) = row_dot4 {
                            while r + 4 <= r1 {
                                let q = &w.bytes[r * rb..(r + 4) * rb];
                                for t in 0..n {
                                    let xg = group_sums(t, p.layout.group);
                                    let o = k4(p, r, q, rb, act_row(t), xg);
                                    for (i, &v) in o.iter().enumerate() {
                                        emit(t, r + i, v);
                                    }
                                }
                                r += 4;
                            }
                        }
                        for r in r..r1 {
                            let q = &w.bytes[r * rb..(r + 1) * rb];
                            for t in 0..n {
                                let xg = group_sums(t, p.layout.group);
                                emit(t, r, row_dot(p, r, q, act_row(t), xg));
                            }
                        }
                    }
                    None => {
                        // A non-MLX partner of an MLX gate (mixed checkpoints): plain f32.
                        for r in r0..r1 {
                            buf.resize(cols, 0.0);
                            w.dequant_row(r, buf);
                            for t in 0..n {
                                emit(t, r, dot(buf, &x.data[t * cols..(t + 1) * cols]));
                            }
                        }
                    }
                }
            };
            for (ji, job) in jobs.iter().enumerate() {
                let (lo, hi) = (v0.max(starts[ji]), v1.min(starts[ji] + job.w.rows));
                if lo >= hi {
                    continue;
                }
                let (dst, rows) = outs[ji];
                for tile0 in (lo..hi).step_by(ROW_TILE) {
                    let (r0, r1) = (tile0 - starts[ji], (tile0 + ROW_TILE).min(hi) - starts[ji]);
                    // SAFETY (all writes): rows r0..r1 of this job's output belong to this
                    // worker alone, and t * rows + r < n * rows.
                    match job.epilogue {
                        Epilogue::Store(bias) => {
                            dots(job.w, r0, r1, &mut buf, &mut |t, r, v| unsafe {
                                dst.write(t * rows + r, v + bias.map_or(0.0, |b| b.data[r]))
                            })
                        }
                        Epilogue::Add => dots(job.w, r0, r1, &mut buf, &mut |t, r, v| unsafe {
                            *dst.0.add(t * rows + r) += v
                        }),
                        Epilogue::SiluMul(up) => {
                            dots(job.w, r0, r1, &mut buf, &mut |t, r, g| unsafe {
                                dst.write(t * rows + r, g / (1.0 + super::exp(-g)))
                            });
                            dots(up, r0, r1, &mut buf, &mut |t, r, u| unsafe {
                                *dst.0.add(t * rows + r) *= u
                            });
                        }
                    }
                }
            }
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_quant::mlx_quantize_row;

    fn rand(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// A random MLX weight, quantized with MLX's rule: as held, and its MLX-layout q.
    fn weight(
        bits: u32,
        group: usize,
        rows: usize,
        cols: usize,
        seed: &mut u64,
    ) -> (CpuWeight, Vec<u8>) {
        let l = MlxLayout::new(bits, group, cols).unwrap();
        let (qb, g) = (l.q_bytes(cols), l.groups(cols));
        let (mut q, mut s, mut b) = (
            vec![0u8; rows * qb],
            vec![0f32; rows * g],
            vec![0f32; rows * g],
        );
        for r in 0..rows {
            let w: Vec<f32> = (0..cols).map(|_| rand(seed)).collect();
            let (qr, sr, br) = (
                &mut q[r * qb..(r + 1) * qb],
                &mut s[r * g..(r + 1) * g],
                &mut b[r * g..(r + 1) * g],
            );
            mlx_quantize_row(l, &w, qr, sr, br);
        }
        let d = MlxWeightData {
            name: "w",
            layout: l,
            rows,
            cols,
            q: &q,
            scales: &s,
            biases: &b,
        };
        d.check().unwrap();
        let held = load(d);
        (held, q)
    }

    #[test]
    fn kernels_match_dequantized_rows() {
        let mut seed = 7;
        for (bits, group) in [(4, 32), (4, 64), (4, 128), (8, 32), (8, 64), (8, 128)] {
            let (rows, cols) = (5, 384);
            let (w, mlx_q_bytes) = weight(bits, group, rows, cols, &mut seed);
            let x: Vec<f32> = (0..cols).map(|_| rand(&mut seed)).collect();
            let xs: Vec<f32> = x.chunks_exact(group).map(|c| c.iter().sum()).collect();
            let (mut aq, mut ad) = (vec![0i16; cols], vec![0f32; cols / 32]);
            quantize_act16(&x, &mut aq, &mut ad);
            let act = Act16 { q: &aq, d: &ad };
            let p = w.mlx.as_deref().unwrap();
            let best = pick(crate::cpu::kernels::best());
            let (mut row, mut want_row) = (vec![0f32; cols], vec![0f32; cols]);
            let (qb, g) = (p.layout.q_bytes(cols), p.groups);
            for r in 0..rows {
                // The held layout dequantizes exactly as MLX's own.
                w.dequant_row(r, &mut row);
                kiln_quant::mlx_dequantize_row(
                    p.layout,
                    &mlx_q_bytes[r * qb..(r + 1) * qb],
                    &p.scales[r * g..(r + 1) * g],
                    &p.biases[r * g..(r + 1) * g],
                    &mut want_row,
                )
                .unwrap();
                assert_eq!(row, want_row, "{bits}-bit g{group} row {r}");
                let want: f64 = row.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
                let mag: f64 = row
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| (*a as f64 * *b as f64).abs())
                    .sum();
                let q = &w.bytes[r * w.row_bytes..(r + 1) * w.row_bytes];
                let scalar = row_dot_scalar(p, r, q, act, &xs);
                let simd = best(p, r, q, act, &xs);
                // The same integer arithmetic: only the float summation order differs.
                assert!(
                    ((scalar - simd) as f64).abs() < 1e-6 * mag,
                    "{bits}-bit g{group} row {r}: {scalar} vs {simd}"
                );
                // Against f32 activations: the 16-bit activation rounding alone.
                let err = (scalar as f64 - want).abs() / mag;
                assert!(
                    err < 1e-4,
                    "{bits}-bit g{group} row {r}: {scalar} vs {want} (rel {err:e})"
                );
            }
            if let Some(k4) = pick4(crate::cpu::kernels::best()) {
                let o = k4(
                    p,
                    1,
                    &w.bytes[w.row_bytes..5 * w.row_bytes],
                    w.row_bytes,
                    act,
                    &xs,
                );
                for (i, &v) in o.iter().enumerate() {
                    let r = 1 + i;
                    let q = &w.bytes[r * w.row_bytes..(r + 1) * w.row_bytes];
                    let one = row_dot_scalar(p, r, q, act, &xs);
                    assert!(
                        (v - one).abs() <= 1e-5 * one.abs().max(1.0),
                        "four-row kernel row {r}: {v} vs {one}"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod bench {
    use super::*;
    use crate::cpu::CpuBackend;
    use crate::{TensorOps, WeightData};
    use kiln_quant::{mlx_quantize_row, quantize};

    /// Decode-shape products, MLX against GGML formats (run with --ignored --nocapture).
    #[test]
    #[ignore]
    fn decode_matvec_speed() {
        let (rows, cols) = (3072, 1024);
        let mut seed = 1u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let w: Vec<f32> = (0..rows * cols).map(|_| rnd()).collect();
        let xv: Vec<f32> = (0..cols).map(|_| rnd()).collect();
        for threads in [1, 2] {
            let b = CpuBackend::new(threads);
            let x = b.tensor_from(1, cols, &xv);
            let mut out = b.tensor(1, rows);
            let mut time = |name: &str, wt: &CpuWeight| {
                for _ in 0..20 {
                    b.matmul(wt, &x, None, 1, &mut out);
                }
                let t = std::time::Instant::now();
                let n = 200;
                for _ in 0..n {
                    b.matmul(wt, &x, None, 1, &mut out);
                }
                let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
                eprintln!(
                    "{threads} thr {name:>10}: {us:8.1} us ({:.1} GB/s)",
                    b.weight_bytes(wt) as f64 / us / 1e3
                );
            };
            for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
                let bytes = quantize(ty, &w).unwrap();
                let wt = b
                    .load_weight(WeightData {
                        name: "w",
                        ty,
                        rows,
                        cols,
                        bytes: &bytes,
                    })
                    .unwrap();
                time(ty.name(), &wt);
            }
            for (bits, group) in [(4, 64), (8, 64)] {
                let l = MlxLayout::new(bits, group, cols).unwrap();
                let (qb, g) = (l.q_bytes(cols), l.groups(cols));
                let (mut q, mut s, mut bi) = (
                    vec![0u8; rows * qb],
                    vec![0f32; rows * g],
                    vec![0f32; rows * g],
                );
                for r in 0..rows {
                    mlx_quantize_row(
                        l,
                        &w[r * cols..(r + 1) * cols],
                        &mut q[r * qb..(r + 1) * qb],
                        &mut s[r * g..(r + 1) * g],
                        &mut bi[r * g..(r + 1) * g],
                    );
                }
                let wt = b
                    .load_weight_mlx(MlxWeightData {
                        name: "w",
                        layout: l,
                        rows,
                        cols,
                        q: &q,
                        scales: &s,
                        biases: &bi,
                    })
                    .unwrap();
                time(&format!("mlx{bits}g{group}"), &wt);
            }
        }
    }
}
