//! Matrix products over many rows through AMX bf16 tiles, for weights that carry a tile-order
//! copy (`Backend::prefer_batches`): each thread takes whole 32-row blocks of x, rounds them to
//! bf16 once, then runs every job's weight over them by 32 x 32 blocks of the output, applying
//! the job's epilogue (bias, residual add) as each block leaves the tiles.
//! `out[t][r] = W[r] . x[t]` as in `matmul`, with the inputs rounded to bf16 (f32 sums).

use super::matmul::{Epilogue, Job};
use crate::cpu::kernels::amx::{self, MB, NB};
use crate::cpu::kernels::{f32_gemm, vnni_gemm};
use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::CpuTensor;

/// From this many rows of x the tiles pay for rounding x to bf16 (a block of 32 rows is
/// padded): measured on PL-BERT's 768-wide layers, 11 tokens take 114 ms through the f32 row
/// dots and a few ms on tiles.
pub const MIN_ROWS: usize = 8;

/// Whether `jobs` over `n` rows run here (all on bf16 copies, or all on int8 copies).
pub fn applies(n: usize, jobs: &[Job]) -> bool {
    let plain = |j: &Job| !matches!(j.epilogue, Epilogue::SiluMul(_));
    n >= MIN_ROWS
        && (jobs.iter().all(|j| j.w.amx.is_some() && plain(j))
            || jobs.iter().all(|j| j.w.i8.is_some() && plain(j))
            || jobs.iter().all(|j| j.w.f32p.is_some() && plain(j)))
}

thread_local! {
    /// One thread's rows of x in bf16.
    static A: std::cell::RefCell<Vec<u16>> = Default::default();
    /// One thread's rows of x as int8 (+128) and their scales, and its output block.
    static A8: std::cell::RefCell<(Vec<u8>, Vec<f32>, vnni_gemm::Block)> = Default::default();
    /// One thread's rows of x (padded to a block) and its output block, for f32 copies.
    static AF: std::cell::RefCell<(Vec<f32>, f32_gemm::Block)> = Default::default();
}

pub fn matmul_jobs(pool: &Pool, x: &CpuTensor, n: usize, jobs: &mut [Job]) {
    if jobs[0].w.i8.is_some() {
        return matmul_jobs_i8(pool, x, n, jobs);
    }
    if jobs[0].w.f32p.is_some() {
        return matmul_jobs_f32(pool, x, n, jobs);
    }
    let outs = outputs(x, n, jobs);
    let cols = x.cols;
    let jobs = &*jobs;
    let kp = jobs[0].w.amx.as_ref().map_or(0, |p| p.kp);
    if n.div_ceil(MB) < pool.threads() {
        // Too few row blocks to go round (PL-BERT's tokens): round x once, split the
        // columns of each product over the threads instead.
        let mut a = Vec::new();
        amx::to_bf16_rows(&x.data[..n * cols], cols, n, cols, kp, &mut a);
        for (job, &(dst, rows)) in jobs.iter().zip(&outs) {
            let p = job.w.amx.as_deref().expect("checked by applies()");
            pool.run_aligned(p.np, NB, |j0, j1| {
                let emit = |i0: usize, jb: usize, blk: &[f32]| {
                    store_block(job, dst, rows, 0, n, i0, jb, blk)
                };
                // SAFETY: only weights packed by prefer_batches (which checked AMX) get here;
                // each thread writes its own columns j0..j1 of the output.
                unsafe { amx::gemm_cols(&a, n, p, j0, j1, emit) };
            });
        }
        return;
    }
    pool.run_aligned(n, MB, |t0, t1| {
        A.with(|cell| {
            let a = &mut *cell.borrow_mut();
            let m = t1 - t0;
            amx::to_bf16_rows(&x.data[t0 * cols..t1 * cols], cols, m, cols, kp, a);
            for (job, &(dst, rows)) in jobs.iter().zip(&outs) {
                let p = job.w.amx.as_deref().expect("checked by applies()");
                let emit = |i0: usize, j0: usize, blk: &[f32]| {
                    store_block(job, dst, rows, t0, m, i0, j0, blk)
                };
                // SAFETY: only weights packed by prefer_batches (which checked AMX) get here.
                unsafe { amx::gemm(a, m, p, emit) };
            }
        })
    });
}

/// Output pointers and widths of the jobs, their shapes checked against x.
fn outputs(x: &CpuTensor, n: usize, jobs: &mut [Job]) -> [(SharedMut, usize); 3] {
    let cols = x.cols;
    let mut outs = [(SharedMut(std::ptr::null_mut()), 0usize); 3];
    assert!(jobs.len() <= outs.len());
    for (o, j) in outs.iter_mut().zip(jobs.iter_mut()) {
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
        assert!(
            j.out.data.len() >= n * j.w.rows,
            "matmul: out has too few rows"
        );
        *o = (SharedMut(j.out.data.as_mut_ptr()), j.w.rows);
    }
    outs
}

/// [`matmul_jobs`] over int8 copies: x's rows quantized once per block of 32 (or once, with
/// the columns split, when there are too few blocks to go round).
fn matmul_jobs_i8(pool: &Pool, x: &CpuTensor, n: usize, jobs: &mut [Job]) {
    let outs = outputs(x, n, jobs);
    let jobs = &*jobs;
    let cols = x.cols;
    let kp = jobs[0].w.i8.as_ref().map_or(0, |p| p.kp);
    if n.div_ceil(MB) < pool.threads() {
        let (mut a, mut sa) = (Vec::new(), Vec::new());
        vnni_gemm::quantize_rows(&x.data[..n * cols], cols, n, cols, kp, &mut a, &mut sa);
        for (job, &(dst, rows)) in jobs.iter().zip(&outs) {
            let p = job.w.i8.as_deref().expect("checked by applies()");
            pool.run_aligned(p.np, NB, |j0, j1| {
                let mut c = vnni_gemm::Block::default();
                let emit = |i0: usize, jb: usize, blk: &[f32]| {
                    store_block(job, dst, rows, 0, n, i0, jb, blk)
                };
                // SAFETY: only weights packed by prefer_batches (which checked VNNI) get
                // here; each thread writes its own columns j0..j1 of the output.
                unsafe { vnni_gemm::gemm_cols(&a, &sa, n, p, j0, j1, &mut c, emit) };
            });
        }
        return;
    }
    pool.run_aligned(n, MB, |t0, t1| {
        A8.with(|cell| {
            let (a, sa, c) = &mut *cell.borrow_mut();
            let m = t1 - t0;
            vnni_gemm::quantize_rows(&x.data[t0 * cols..t1 * cols], cols, m, cols, kp, a, sa);
            for (job, &(dst, rows)) in jobs.iter().zip(&outs) {
                let p = job.w.i8.as_deref().expect("checked by applies()");
                let emit = |i0: usize, j0: usize, blk: &[f32]| {
                    store_block(job, dst, rows, t0, m, i0, j0, blk)
                };
                // SAFETY: as above.
                unsafe { vnni_gemm::gemm_cols(a, sa, m, p, 0, p.np, c, emit) };
            }
        })
    });
}

/// [`matmul_jobs`] over f32 copies in vector order: x's rows copied once per block of 32
/// (zero rows after the last), or the columns split when there are too few blocks.
fn matmul_jobs_f32(pool: &Pool, x: &CpuTensor, n: usize, jobs: &mut [Job]) {
    let outs = outputs(x, n, jobs);
    let jobs = &*jobs;
    let cols = x.cols;
    let padded = |t0: usize, m: usize, a: &mut Vec<f32>| {
        a.clear();
        a.extend_from_slice(&x.data[t0 * cols..(t0 + m) * cols]);
        a.resize(m.next_multiple_of(MB) * cols, 0.0);
    };
    if n.div_ceil(MB) < pool.threads() {
        let mut a = Vec::new();
        padded(0, n, &mut a);
        for (job, &(dst, rows)) in jobs.iter().zip(&outs) {
            let p = job.w.f32p.as_deref().expect("checked by applies()");
            pool.run_aligned(p.np, NB, |j0, j1| {
                let mut c = f32_gemm::Block::default();
                let emit = |i0: usize, jb: usize, blk: &[f32]| {
                    store_block(job, dst, rows, 0, n, i0, jb, blk)
                };
                // SAFETY: only weights packed by prefer_batches (which checked AVX-512) get
                // here; each thread writes its own columns j0..j1 of the output.
                unsafe { f32_gemm::gemm_cols(&a, n, p, j0, j1, &mut c, emit) };
            });
        }
        return;
    }
    pool.run_aligned(n, MB, |t0, t1| {
        AF.with(|cell| {
            let (a, c) = &mut *cell.borrow_mut();
            let m = t1 - t0;
            padded(t0, m, a);
            for (job, &(dst, rows)) in jobs.iter().zip(&outs) {
                let p = job.w.f32p.as_deref().expect("checked by applies()");
                let emit = |i0: usize, j0: usize, blk: &[f32]| {
                    store_block(job, dst, rows, t0, m, i0, j0, blk)
                };
                // SAFETY: as above.
                unsafe { f32_gemm::gemm_cols(a, m, p, 0, p.np, c, emit) };
            }
        })
    });
}

/// Rows i0..i0+32 (of the m from t0), columns j0..j0+32 of C into the job's output, through
/// its epilogue.
#[allow(clippy::too_many_arguments)]
fn store_block(
    job: &Job,
    dst: SharedMut,
    rows: usize,
    t0: usize,
    m: usize,
    i0: usize,
    j0: usize,
    blk: &[f32],
) {
    let (i1, j1) = ((i0 + MB).min(m), (j0 + NB).min(rows));
    if j0 >= j1 {
        return;
    }
    for i in i0..i1 {
        let src = &blk[(i - i0) * NB..(i - i0) * NB + (j1 - j0)];
        // SAFETY: rows t0+i0..t0+i1, columns j0..j1 of the output belong to the calling
        // thread (its rows or its columns); they lie inside the output's `rows` columns.
        let out =
            unsafe { std::slice::from_raw_parts_mut(dst.0.add((t0 + i) * rows + j0), j1 - j0) };
        match job.epilogue {
            Epilogue::Store(Some(b)) => {
                for ((o, &v), &bv) in out.iter_mut().zip(src).zip(&b.data[j0..j1]) {
                    *o = v + bv;
                }
            }
            Epilogue::Store(None) => out.copy_from_slice(src),
            Epilogue::Add => {
                for (o, &v) in out.iter_mut().zip(src) {
                    *o += v;
                }
            }
            Epilogue::SiluMul(_) => unreachable!("excluded by applies()"),
        }
    }
}
