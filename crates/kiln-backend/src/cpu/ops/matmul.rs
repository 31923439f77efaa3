//! Matrix products with fused epilogues. For every weight W (rows, cols) and x (n, cols):
//! `out[t][r] = W[r] . x[t]` then stored (+ bias), accumulated (residual add), or, for a
//! gate/up pair, `silu(Wg[r] . x[t]) * (Wu[r] . x[t])`.
//!
//! Formats with an integer kernel quantize x to 8-bit blocks once per call and run integer
//! dot products; the rest dequantize each weight row once and reuse it for all n tokens.
//! Several products of one input run as one parallel op (one synchronisation).

use super::dot;
use crate::cpu::kernels::tile::{DecodedTile, TileDotFn};
use crate::cpu::kernels::x8::{self, GemmFn};
use crate::cpu::kernels::{ActRow, Dot4Fn, DotFn, Kernels, QuantAct};
use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::{CpuTensor, CpuWeight};

/// Rows per work unit: a tile of weight rows reused across tokens while it sits in L1.
const ROW_TILE: usize = 16;

/// Tokens from which prefill decodes weight tiles once instead of unpacking per token.
const TILE_MIN_TOKENS: usize = 8;

/// Tokens from which interleaved weights run a pair of groups a call where the set has
/// pair kernels: below it the weights stream from memory, which wider vectors do not speed
/// up and which the one-group kernels' prefetch is tuned for (measured on Zen 5: pairs at
/// one token lost 20% of decode; at two tokens even). From four tokens (four streams'
/// decode steps) the 256-bit kernels' arithmetic is the limit where memory keeps up:
/// Qwen3-0.6B shape Q4_0 x4 +1..+18% (median +11%) in paired rounds, and even on a host
/// where four tokens were memory-bound (BENCHMARKS.md).
const PAIR_MIN_TOKENS: usize = 4;

/// Products one op may carry (q, k, v).
const MAX_JOBS: usize = 3;

/// What happens to each computed value.
#[derive(Clone, Copy)]
pub enum Epilogue<'a> {
    Store(Option<&'a CpuTensor>),
    Add,
    /// `silu(this) * (up[r] . x)`: the job's weight is the gate, this the up projection.
    SiluMul(&'a CpuWeight),
}

/// One product of the shared input x.
pub struct Job<'a> {
    pub w: &'a CpuWeight,
    pub out: &'a mut CpuTensor,
    pub epilogue: Epilogue<'a>,
}

/// Computes W[r] . x[t] for rows of W and all t, handing them to `emit(t, r, v)` a run at
/// a time: `v[i]` = W[r + i] . x[t] (runs of a group or a pair of groups let the
/// epilogues run as vector loops).
struct RowDots<'a> {
    /// The interleaved kernel (weights packed in groups of 8 rows) and its tokens per call.
    x8: Option<(GemmFn, usize)>,
    /// The same over two adjacent groups a call, where the set has it.
    x8_pairs: Option<(GemmFn, usize)>,
    kernel: Option<DotFn>,
    kernel4: Option<Dot4Fn>,
    tile4: Option<TileDotFn>,
    act: &'a QuantAct,
    x: &'a CpuTensor,
    n: usize,
    /// The f32 block product's vector kernels may run (`gemm::simd_ok`).
    simd: bool,
    /// The F16C half-precision dot may run.
    f16c: bool,
}

impl RowDots<'_> {
    /// Rows r0..r1, four at a time where a four-row kernel exists.
    fn rows(
        &self,
        w: &CpuWeight,
        r0: usize,
        r1: usize,
        buf: &mut Vec<f32>,
        tile: &mut DecodedTile,
        mut emit: impl FnMut(usize, usize, &[f32]),
    ) {
        if w.x8 {
            return self.rows_x8(w, r0, r1, buf, emit);
        }
        if self.kernel.is_none()
            && self.n >= TILE_MIN_TOKENS
            && matches!(w.ty, kiln_quant::GgmlType::F16 | kiln_quant::GgmlType::BF16)
        {
            // Prefill over half-precision weights: decode the rows once, transposed
            // (cols x rows), then one f32 block product against every token; each step
            // broadcasts one activation over a vector of rows (no horizontal sums).
            let (rows, c, n) = (r1 - r0, w.cols, self.n);
            buf.resize(2 * rows * c + n * rows, 0.0);
            let (row, rest) = buf.split_at_mut(c);
            let (wt, out) = rest.split_at_mut(rows * c);
            for r in 0..rows {
                w.dequant_row(r0 + r, row);
                for (i, &v) in row.iter().enumerate() {
                    wt[i * rows + r] = v;
                }
            }
            let x = &self.x.data[..n * self.x.cols];
            super::gemm::gemm_nn(x, self.x.cols, n, wt, rows, rows, c, out, rows, self.simd);
            for t in 0..n {
                emit(t, r0, &out[t * rows..(t + 1) * rows]);
            }
            return;
        }
        let mut r = r0;
        if let Some(tk) = self
            .tile4
            .filter(|_| self.n >= TILE_MIN_TOKENS && r1 - r0 >= 4)
        {
            // Prefill: unpack the rows once, then run every token over the decoded tile.
            let rb = w.row_bytes;
            let rows = (r1 - r0) / 4 * 4;
            tile.decode_rows(w.ty, &w.bytes[r0 * rb..(r0 + rows) * rb], rb, rows);
            for t in 0..self.n {
                let a = self.act.row(t);
                for k in (0..rows).step_by(4) {
                    let mut out = [0f32; 4];
                    // SAFETY: the kernel set was detected on this CPU; the tile holds rows
                    // k..k+4 over the same cols as the activations.
                    unsafe { tk(tile, k, a, &mut out) };
                    emit(t, r0 + k, &out);
                }
            }
            r += rows;
        }
        if let Some(k4) = self.kernel4 {
            let rb = w.row_bytes;
            while r + 4 <= r1 {
                let bytes = &w.bytes[r * rb..(r + 4) * rb];
                // The next group's rows, while this one computes: the hardware prefetcher
                // alone loses several interleaved row streams (measured: 2x on decode).
                prefetch(&w.bytes, (r + 4) * rb, 4 * rb);
                let mut out = [0f32; 4];
                for t in 0..self.n {
                    // SAFETY: the kernel set was detected on this CPU; rows and activations
                    // cover the same cols.
                    unsafe { k4(bytes, rb, self.act.row(t), &mut out) };
                    emit(t, r, &out);
                }
                r += 4;
            }
        }
        for r in r..r1 {
            self.row(w, r, buf, |t, v| emit(t, r, &[v]));
        }
    }

    /// Rows r0..r1 (r0 a multiple of 8) of an interleaved weight, a group (or a pair of
    /// groups) at a time; every token runs over it while its unpacked quants are at hand.
    fn rows_x8(
        &self,
        w: &CpuWeight,
        r0: usize,
        r1: usize,
        buf: &mut Vec<f32>,
        mut emit: impl FnMut(usize, usize, &[f32]),
    ) {
        debug_assert_eq!(r0 % x8::ROWS, 0);
        let one = self.x8.expect("x8 weights come with an x8 kernel set");
        let gb = x8::group_bytes(w.ty, w.cols);
        // The kernels' sums, in the worker's buffer (zeroed once, not at every call: decode
        // hands a worker many small row ranges).
        let len = 2 * x8::MAX_TOKENS * x8::ROWS;
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        let (out, _) = buf.as_chunks_mut::<{ x8::ROWS }>();
        // Software prefetch `ahead` bytes in front of the group being computed: the
        // hardware prefetcher alone leaves a single stream per core below the read
        // bandwidth. The legacy formats' kernels do it block by block themselves; for the
        // rest, the window's first part at the start, then each step the part that enters it.
        let ahead = match x8::prefetches_itself(w.ty) {
            true => 0,
            false => x8::prefetch_distance(),
        };
        let start = r0 / x8::ROWS * gb;
        prefetch(&w.bytes, start, ahead);
        let mut acts = [ActRow::default(); x8::MAX_TOKENS];
        let mut held = 0..0;
        let mut g0 = r0;
        while g0 < r1 {
            let g = g0 / x8::ROWS;
            // A pair where a second group holds rows of this range.
            let ((k, max_t), groups) = match self.x8_pairs {
                Some(p) if r1 - g0 > x8::ROWS => (p, 2),
                _ => (one, 1),
            };
            if ahead != 0 {
                for g in g..g + groups {
                    let (at, len) = match ahead > gb {
                        true => (g * gb + ahead - gb, gb),
                        false => ((g + 1) * gb, ahead),
                    };
                    prefetch(&w.bytes, at, len);
                }
            }
            let rows = (r1 - g0).min(groups * x8::ROWS);
            let mut t0 = 0;
            while t0 < self.n {
                let tn = (self.n - t0).min(max_t);
                // Rows made again only when the tokens change (decode keeps them throughout).
                if held != (t0..t0 + tn) {
                    for (i, a) in acts[..tn].iter_mut().enumerate() {
                        *a = self.act.row(t0 + i);
                    }
                    held = t0..t0 + tn;
                }
                // The first call over a group gets the rest of the matrix to prefetch from.
                let bytes = match t0 {
                    0 => &w.bytes[g * gb..],
                    _ => &w.bytes[g * gb..(g + groups) * gb],
                };
                let out = &mut out[..groups * tn];
                // SAFETY: the kernel set was detected on this CPU; the group and the
                // activation rows cover the same cols (the kernel checks lengths).
                unsafe { k(bytes, w.cols, &acts[..tn], out) };
                for (t, o) in out.chunks_exact(groups).enumerate() {
                    emit(t0 + t, g0, &o.as_flattened()[..rows]);
                }
                t0 += tn;
            }
            g0 += groups * x8::ROWS;
        }
    }

    fn row(&self, w: &CpuWeight, r: usize, buf: &mut Vec<f32>, mut emit: impl FnMut(usize, f32)) {
        let bytes = &w.bytes[r * w.row_bytes..(r + 1) * w.row_bytes];
        match self.kernel {
            Some(k) => {
                for t in 0..self.n {
                    // SAFETY: as above.
                    emit(t, unsafe { k(bytes, self.act.row(t)) });
                }
            }
            None if w.ty == kiln_quant::GgmlType::F16 && self.f16c => {
                let c = self.x.cols;
                for t in 0..self.n {
                    let xr = &self.x.data[t * c..(t + 1) * c];
                    emit(t, super::gemm::dot_f16(bytes, xr, true));
                }
            }
            None => {
                let row: &[f32] = if w.ty == kiln_quant::GgmlType::F32 {
                    f32_row(bytes)
                } else {
                    buf.resize(w.cols, 0.0);
                    w.dequant_row(r, buf);
                    buf
                };
                let c = self.x.cols;
                for t in 0..self.n {
                    emit(t, dot(row, &self.x.data[t * c..(t + 1) * c]));
                }
            }
        }
    }
}

/// Runs every job over the shared input `x` (n rows) as one parallel op.
pub fn matmul_jobs(
    pool: &Pool,
    kernels: &Kernels,
    act: &mut QuantAct,
    x: &CpuTensor,
    n: usize,
    jobs: &mut [Job],
) {
    if jobs.iter().any(super::mlx::involves_mlx) {
        return super::mlx::matmul_jobs(pool, kernels, act, x, n, jobs);
    }
    if super::matmul_amx::applies(n, jobs) {
        return super::matmul_amx::matmul_jobs(pool, x, n, jobs);
    }
    let cols = x.cols;
    let mut quantized = false;
    for j in jobs.iter() {
        assert_eq!(
            j.w.cols, cols,
            "matmul: x has {cols} cols, W has {}",
            j.w.cols
        );
        assert_eq!(
            j.out.cols, j.w.rows,
            "matmul: out has {} cols, W {} rows",
            j.out.cols, j.w.rows
        );
        if let Epilogue::SiluMul(up) = j.epilogue {
            assert!(up.rows == j.w.rows && up.cols == cols && up.ty == j.w.ty);
        }
        if !quantized && kernels.dot_for(j.w.ty).is_some() {
            // Rows are whole blocks (checked at load), so cols is a multiple of 32.
            act.quantize(&x.data, n, cols);
            quantized = true;
        }
    }
    let act = &*act;
    let simd = super::gemm::simd_ok();
    let f16c = super::gemm::f16c_ok();
    assert!(jobs.len() <= MAX_JOBS);
    // Jobs laid end to end in one row space, split over threads in whole tiles.
    let mut outs = [(SharedMut(std::ptr::null_mut()), 0usize); MAX_JOBS];
    let mut starts = [0usize; MAX_JOBS];
    let mut total = 0;
    for (i, j) in jobs.iter_mut().enumerate() {
        outs[i] = (SharedMut(j.out.data.as_mut_ptr()), j.w.rows);
        starts[i] = total;
        total += j.w.rows.div_ceil(ROW_TILE) * ROW_TILE;
    }
    let jobs = &*jobs;
    pool.run_aligned(total, ROW_TILE, |v0, v1| {
        let mut buf = Vec::new();
        let mut tile = DecodedTile::default();
        for (ji, job) in jobs.iter().enumerate() {
            let (lo, hi) = (v0.max(starts[ji]), v1.min(starts[ji] + job.w.rows));
            if lo >= hi {
                continue;
            }
            let (dst, rows) = outs[ji];
            let dots = RowDots {
                x8: kernels
                    .x8_for(job.w.ty)
                    .map(|k| (k, kernels.x8.map_or(1, |s| s.max_tokens))),
                x8_pairs: kernels
                    .x8
                    .and_then(|s| s.pairs)
                    .filter(|_| n >= PAIR_MIN_TOKENS)
                    .and_then(|p| Some((p.for_type(job.w.ty)?, p.max_tokens))),
                kernel: kernels.dot_for(job.w.ty),
                kernel4: kernels.dot4_for(job.w.ty),
                tile4: kernels.tile4_for(job.w.ty),
                act,
                x,
                n,
                simd,
                f16c,
            };
            // Interleaved weights take a decode step's chunk in one call: their kernels run
            // every token over a group (or pair) as it comes, so a tile buys nothing there,
            // while each call sets up its activation rows and prefetch window again (at four
            // tokens a step, 16-row calls spent ~8% of the time outside the kernels). Prompts
            // keep the tiles, whose gate values stay in L1 for the up product.
            let whole = job.w.x8
                && n <= x8::MAX_TOKENS
                && match job.epilogue {
                    Epilogue::SiluMul(up) => up.x8,
                    _ => true,
                };
            let step = if whole { hi - lo } else { ROW_TILE };
            for tile0 in (lo..hi).step_by(step) {
                let (t0, t1) = (tile0 - starts[ji], (tile0 + step).min(hi) - starts[ji]);
                // SAFETY (all writes below): rows t0..t1 of this job's output belong to this
                // worker alone, and a run of rows r..r + v.len() of token t < n lies in them.
                match job.epilogue {
                    Epilogue::Store(bias) => {
                        dots.rows(job.w, t0, t1, &mut buf, &mut tile, |t, r, v| {
                            let d = unsafe { dst.slice(t * rows + r, v.len()) };
                            let b = bias.map(|b| &b.data[r..r + v.len()]);
                            for (i, (d, &v)) in d.iter_mut().zip(v).enumerate() {
                                *d = v + b.map_or(0.0, |b| b[i]);
                            }
                        })
                    }
                    Epilogue::Add => dots.rows(job.w, t0, t1, &mut buf, &mut tile, |t, r, v| {
                        let d = unsafe { dst.slice(t * rows + r, v.len()) };
                        for (d, &v) in d.iter_mut().zip(v) {
                            *d += v;
                        }
                    }),
                    Epilogue::SiluMul(up) => {
                        dots.rows(job.w, t0, t1, &mut buf, &mut tile, |t, r, g| {
                            let d = unsafe { dst.slice(t * rows + r, g.len()) };
                            for (d, &g) in d.iter_mut().zip(g) {
                                *d = g / (1.0 + super::exp(-g));
                            }
                        });
                        dots.rows(up, t0, t1, &mut buf, &mut tile, |t, r, u| {
                            let d = unsafe { dst.slice(t * rows + r, u.len()) };
                            for (d, &u) in d.iter_mut().zip(u) {
                                *d *= u;
                            }
                        });
                    }
                }
            }
        }
    });
}

/// Asks the cache for `len` bytes of `b` from `at` ahead of use (ignored past the end).
#[inline(always)]
fn prefetch(b: &[u8], at: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let end = (at + len).min(b.len());
        let mut i = at;
        while i < end {
            // SAFETY: prefetching an in-bounds address has no effect on program state.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    b.as_ptr().add(i) as *const i8,
                )
            };
            i += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (b, at, len);
}

/// Views little-endian f32 bytes as f32 (the allocation holds f32s written by load_weight).
fn f32_row(bytes: &[u8]) -> &[f32] {
    // SAFETY: any bit pattern is a valid f32; alignment is checked below.
    let (head, body, tail) = unsafe { bytes.align_to::<f32>() };
    assert!(head.is_empty() && tail.is_empty() && cfg!(target_endian = "little"));
    body
}
