//! Matrix products with MLX affine-quantized weights (`kiln_quant::mlx`), natively: the packed
//! 4/8-bit q are never converted to another block format.
//!
//! W (rows, cols) @ x (n, cols): for row r and token t,
//!   out[t][r] = sum_g scale[r][g] * (sum_{j in g} q[r][j] * x[t][j]) + bias[r][g] * X[t][g]
//! with X[t][g] = sum_{j in g} x[t][j] computed once per call (per 32 values, summed up to the
//! group). Activations stay f32; a scalar reference and an AVX2+FMA kernel compute the q . x
//! part, chosen at run time (the scalar one under `KILN_NO_SIMD` or the scalar kernel set).

use std::cell::RefCell;

use kiln_quant::{mlx_dequantize_row, mlx_q, GgmlType, MlxLayout};

use super::dot;
use super::matmul::{Epilogue, Job};
use crate::cpu::kernels::{Kernels, QuantAct};
use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::{CpuTensor, CpuWeight};
use crate::MlxWeightData;

/// Rows per work unit.
const ROW_TILE: usize = 16;

/// Scales and biases of an MLX weight (f32, `groups` per row); the packed q are the weight's
/// `bytes`, `row_bytes` per row.
pub struct MlxParts {
    pub layout: MlxLayout,
    pub groups: usize,
    pub scales: Vec<f32>,
    pub biases: Vec<f32>,
}

impl MlxParts {
    pub fn dequant_row(&self, q: &[u8], r: usize, out: &mut [f32]) {
        let g = self.groups;
        let (s, b) = (
            &self.scales[r * g..(r + 1) * g],
            &self.biases[r * g..(r + 1) * g],
        );
        // Lengths were checked at load.
        mlx_dequantize_row(self.layout, q, s, b, out).expect("MLX row lengths checked at load");
    }

    /// Bytes held besides the packed q.
    pub fn extra_bytes(&self) -> usize {
        4 * (self.scales.len() + self.biases.len())
    }
}

/// Keeps the packed q as they are (one row after another) and the scales and biases as f32.
/// The caller has checked the parts' lengths (`MlxWeightData::check`).
pub fn load(w: MlxWeightData) -> CpuWeight {
    let groups = w.layout.groups(w.cols);
    CpuWeight {
        // Not a GGML format: `mlx` marks the weight, and every path that reads `bytes`
        // checks it first.
        ty: GgmlType::F32,
        rows: w.rows,
        cols: w.cols,
        row_bytes: w.layout.q_bytes(w.cols),
        bytes: w.q.to_vec(),
        mlx: Some(Box::new(MlxParts {
            layout: w.layout,
            groups,
            scales: w.scales.to_vec(),
            biases: w.biases.to_vec(),
        })),
    }
}

/// `sum_j q[j] * x[j]` over one group, q packed (`bits`), scalar reference.
pub fn group_dot_scalar(bits: u32, q: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for (j, &xv) in x.iter().enumerate() {
        acc[j % 8] += mlx_q(bits, q, j) as f32 * xv;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// One row times one token: `q` the row's packed bytes, `x` cols values, `xs32` the sums of
/// x per 32 values.
#[inline]
fn row_dot_scalar(p: &MlxParts, r: usize, q: &[u8], x: &[f32], xs32: &[f32]) -> f32 {
    let (gs, bits) = (p.layout.group, p.layout.bits);
    let gb = gs * bits as usize / 8;
    let (s, b) = (
        &p.scales[r * p.groups..(r + 1) * p.groups],
        &p.biases[r * p.groups..(r + 1) * p.groups],
    );
    let mut v = 0f32;
    for g in 0..p.groups {
        let qx = group_dot_scalar(bits, &q[g * gb..(g + 1) * gb], &x[g * gs..(g + 1) * gs]);
        let xsum: f32 = xs32[g * gs / 32..(g + 1) * gs / 32].iter().sum();
        v += s[g] * qx + b[g] * xsum;
    }
    v
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::MlxParts;
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

    /// As `row_dot_scalar`, the q . x part of each group in 8-wide FMAs.
    ///
    /// # Safety
    /// AVX2 and FMA are available; `q`, `x`, `xs32` hold the row's packed bytes, cols values
    /// and cols / 32 sums.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn row_dot(p: &MlxParts, r: usize, q: &[u8], x: &[f32], xs32: &[f32]) -> f32 {
        let (gs, bits) = (p.layout.group, p.layout.bits);
        let gb = gs * bits as usize / 8;
        let s = &p.scales[r * p.groups..(r + 1) * p.groups];
        let b = &p.biases[r * p.groups..(r + 1) * p.groups];
        let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        let mask = _mm256_set1_epi32(0xf);
        let mut total = _mm256_setzero_ps();
        let mut bias_part = 0f32;
        for g in 0..p.groups {
            let qg = q.as_ptr().add(g * gb);
            let xg = x.as_ptr().add(g * gs);
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            if bits == 4 {
                // 16 values (8 bytes) per step: two words of 8 nibbles.
                for k in (0..gs).step_by(16) {
                    let w0 = (qg.add(k / 2) as *const u32).read_unaligned();
                    let w1 = (qg.add(k / 2 + 4) as *const u32).read_unaligned();
                    let q0 = _mm256_and_si256(
                        _mm256_srlv_epi32(_mm256_set1_epi32(w0 as i32), shifts),
                        mask,
                    );
                    let q1 = _mm256_and_si256(
                        _mm256_srlv_epi32(_mm256_set1_epi32(w1 as i32), shifts),
                        mask,
                    );
                    a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q0), _mm256_loadu_ps(xg.add(k)), a0);
                    a1 =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(q1), _mm256_loadu_ps(xg.add(k + 8)), a1);
                }
            } else {
                for k in (0..gs).step_by(16) {
                    let q0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(qg.add(k) as *const __m128i));
                    let q1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(qg.add(k + 8) as *const __m128i));
                    a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q0), _mm256_loadu_ps(xg.add(k)), a0);
                    a1 =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(q1), _mm256_loadu_ps(xg.add(k + 8)), a1);
                }
            }
            total = _mm256_fmadd_ps(_mm256_set1_ps(s[g]), _mm256_add_ps(a0, a1), total);
            let xsum: f32 = xs32[g * gs / 32..(g + 1) * gs / 32].iter().sum();
            bias_part += b[g] * xsum;
        }
        hsum(total) + bias_part
    }
}

type RowDot = fn(&MlxParts, usize, &[u8], &[f32], &[f32]) -> f32;

fn pick(kernels: &Kernels) -> RowDot {
    #[cfg(target_arch = "x86_64")]
    if kernels.name != "scalar"
        && !crate::cpu::kernels::simd_disabled()
        && std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
    {
        // SAFETY: AVX2 and FMA were detected just above.
        return |p, r, q, x, xs| unsafe { avx2::row_dot(p, r, q, x, xs) };
    }
    let _ = kernels;
    row_dot_scalar
}

thread_local! {
    /// Sums of x per 32 values, per token (reused across calls).
    static XSUMS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
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
    let row_dot = pick(kernels);
    XSUMS.with(|xs| {
        let mut xs = xs.borrow_mut();
        let per = cols / 32;
        xs.clear();
        for t in 0..n {
            xs.extend(
                x.data[t * cols..(t + 1) * cols]
                    .chunks_exact(32)
                    .map(|c| c.iter().sum::<f32>()),
            );
        }
        let xs = &xs[..n * per];
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
            // One weight row times every token.
            let dots =
                |w: &CpuWeight, r: usize, buf: &mut Vec<f32>, emit: &mut dyn FnMut(usize, f32)| {
                    let q = &w.bytes[r * w.row_bytes..(r + 1) * w.row_bytes];
                    match w.mlx.as_deref() {
                        Some(p) => {
                            for t in 0..n {
                                let xt = &x.data[t * cols..(t + 1) * cols];
                                emit(t, row_dot(p, r, q, xt, &xs[t * per..(t + 1) * per]));
                            }
                        }
                        None => {
                            // A non-MLX partner of an MLX gate (mixed checkpoints): plain f32.
                            buf.resize(cols, 0.0);
                            w.dequant_row(r, buf);
                            for t in 0..n {
                                emit(t, dot(buf, &x.data[t * cols..(t + 1) * cols]));
                            }
                        }
                    }
                };
            for (ji, job) in jobs.iter().enumerate() {
                let (lo, hi) = (v0.max(starts[ji]), v1.min(starts[ji] + job.w.rows));
                let (dst, rows) = outs[ji];
                for r in lo.max(starts[ji])..hi {
                    let r = r - starts[ji];
                    // SAFETY (all writes): row r of this job's output belongs to this worker
                    // alone, and t * rows + r < n * rows.
                    match job.epilogue {
                        Epilogue::Store(bias) => dots(job.w, r, &mut buf, &mut |t, v| unsafe {
                            dst.write(t * rows + r, v + bias.map_or(0.0, |b| b.data[r]))
                        }),
                        Epilogue::Add => dots(job.w, r, &mut buf, &mut |t, v| unsafe {
                            *dst.0.add(t * rows + r) += v
                        }),
                        Epilogue::SiluMul(up) => {
                            dots(job.w, r, &mut buf, &mut |t, g| unsafe {
                                dst.write(t * rows + r, g / (1.0 + super::exp(-g)))
                            });
                            dots(up, r, &mut buf, &mut |t, u| unsafe {
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

    /// A random MLX weight, quantized with MLX's rule.
    fn weight(bits: u32, group: usize, rows: usize, cols: usize, seed: &mut u64) -> CpuWeight {
        let l = MlxLayout::new(bits, group, cols).unwrap();
        let (qb, g) = (l.q_bytes(cols), l.groups(cols));
        let (mut q, mut s, mut b) = (
            vec![0u8; rows * qb],
            vec![0f32; rows * g],
            vec![0f32; rows * g],
        );
        for r in 0..rows {
            let w: Vec<f32> = (0..cols).map(|_| rand(seed)).collect();
            mlx_quantize_row(
                l,
                &w,
                &mut q[r * qb..(r + 1) * qb],
                &mut s[r * g..(r + 1) * g],
                &mut b[r * g..(r + 1) * g],
            );
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
        load(d)
    }

    #[test]
    fn kernels_match_dequantized_rows() {
        let mut seed = 7;
        for (bits, group) in [(4, 32), (4, 64), (4, 128), (8, 32), (8, 64), (8, 128)] {
            let (rows, cols) = (5, 384);
            let w = weight(bits, group, rows, cols, &mut seed);
            let x: Vec<f32> = (0..cols).map(|_| rand(&mut seed)).collect();
            let xs = sums32(&x);
            let p = w.mlx.as_deref().unwrap();
            let best = pick(crate::cpu::kernels::best());
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                w.dequant_row(r, &mut row);
                let want: f64 = row.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
                let mag: f64 = row
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| (*a as f64 * *b as f64).abs())
                    .sum();
                let q = &w.bytes[r * w.row_bytes..(r + 1) * w.row_bytes];
                for (name, got) in [
                    ("scalar", row_dot_scalar(p, r, q, &x, &xs)),
                    ("best", best(p, r, q, &x, &xs)),
                ] {
                    let err = (got as f64 - want).abs() / mag;
                    assert!(
                        err < 1e-5,
                        "{bits}-bit g{group} row {r} {name}: {got} vs {want} (rel {err:e})"
                    );
                }
            }
        }
    }

    fn sums32(x: &[f32]) -> Vec<f32> {
        x.chunks_exact(32).map(|c| c.iter().sum()).collect()
    }
}
