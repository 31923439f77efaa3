//! Matrix products over many rows for weights that carry a block-product copy
//! (`TensorOps::prefer_batches`): AMX bf16 tiles (or `vdpbf16ps` over the same layout), int8
//! panels (VNNI / dotprod, where the model allowed int8) or f32 panels (AVX-512 without
//! BF16, NEON). Each thread takes whole 32-row blocks of x, prepares them once (rounded to bf16,
//! quantized to int8, or padded), then runs every job's weight over them by 32 x 32 blocks of
//! the output, applying the job's epilogue (bias, residual add) as each block leaves the
//! kernel. `out[t][r] = W[r] . x[t]` as in `matmul`, up to the inputs' rounding (f32 sums).

use super::matmul::{Epilogue, Job};
use crate::cpu::kernels::amx::{self, MB, NB};
use crate::cpu::kernels::{f32_gemm, vnni_gemm};
use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::CpuTensor;

/// From this many rows of x the tiles pay for rounding x to bf16 (a block of 32 rows is
/// padded): measured on PL-BERT's 768-wide layers, 11 tokens take 114 ms through the f32 row
/// dots and a few ms on tiles.
pub const MIN_ROWS: usize = 8;

/// Whether `jobs` over `n` rows run here (all on bf16 copies, all on int8 or all on f32).
pub fn applies(n: usize, jobs: &[Job]) -> bool {
    let plain = |j: &Job| !matches!(j.epilogue, Epilogue::SiluMul(_));
    n >= MIN_ROWS
        && (jobs.iter().all(|j| j.w.amx.is_some() && plain(j))
            || jobs.iter().all(|j| j.w.i8.is_some() && plain(j))
            || jobs.iter().all(|j| j.w.f32p.is_some() && plain(j)))
}

/// One thread's rows of x as a block product takes them (bf16; int8 and their scales; f32
/// padded to a block), one of them used by a call.
#[derive(Default)]
struct Rows {
    bf16: Vec<u16>,
    q: Vec<u8>,
    scales: Vec<f32>,
    f: Vec<f32>,
}

thread_local! {
    /// One thread's rows of x and its output block.
    static ROWS: std::cell::RefCell<(Rows, amx::Block)> = Default::default();
}

/// `out[t][r] = W[r] . x[t]` over the weights' block-product copies (all bf16 tiles, all
/// int8 or all f32 panels: `applies`).
pub fn matmul_jobs(pool: &Pool, x: &CpuTensor, n: usize, jobs: &mut [Job]) {
    let outs = outputs(x, n, jobs);
    let (jobs, cols) = (&*jobs, x.cols);
    let w = jobs[0].w;
    // The products' SAFETY: only weights packed by prefer_batches get here, which packed
    // each copy only where its kernel set was detected; `run` hands each call rows prepared
    // for that copy, and each thread its own rows or columns of the output.
    if let Some(p) = w.i8.as_deref() {
        let kp = p.kp;
        let prep = |src: &[f32], m: usize, r: &mut Rows| {
            vnni_gemm::quantize_rows(src, cols, m, cols, kp, &mut r.q, &mut r.scales)
        };
        let product = |r: &Rows, m: usize, job: &Job, (j0, j1), c: &mut amx::Block, emit: Emit| {
            let p = job.w.i8.as_deref().expect("checked by applies()");
            // SAFETY: as said above.
            unsafe { vnni_gemm::gemm_cols(&r.q, &r.scales, m, p, j0, j1, c, emit) }
        };
        return run(
            pool,
            x,
            n,
            jobs,
            &outs,
            |j| j.w.i8.as_ref().map_or(0, |p| p.np),
            prep,
            product,
        );
    }
    if w.f32p.is_some() {
        let prep = |src: &[f32], m: usize, r: &mut Rows| {
            r.f.clear();
            r.f.extend_from_slice(src);
            r.f.resize(m.next_multiple_of(MB) * cols, 0.0);
        };
        let product = |r: &Rows, m: usize, job: &Job, (j0, j1), c: &mut amx::Block, emit: Emit| {
            let p = job.w.f32p.as_deref().expect("checked by applies()");
            // SAFETY: as said above.
            unsafe { f32_gemm::gemm_cols(&r.f, m, p, j0, j1, c, emit) }
        };
        return run(
            pool,
            x,
            n,
            jobs,
            &outs,
            |j| j.w.f32p.as_ref().map_or(0, |p| p.np),
            prep,
            product,
        );
    }
    let kp = w.amx.as_ref().map_or(0, |p| p.kp);
    let prep = |src: &[f32], m: usize, r: &mut Rows| {
        amx::to_bf16_rows(src, cols, m, cols, kp, &mut r.bf16)
    };
    let product = |r: &Rows, m: usize, job: &Job, (j0, j1), _: &mut amx::Block, emit: Emit| {
        let p = job.w.amx.as_deref().expect("checked by applies()");
        // SAFETY: as said above.
        unsafe { amx::gemm_cols(&r.bf16, m, p, j0, j1, emit) }
    };
    run(
        pool,
        x,
        n,
        jobs,
        &outs,
        |j| j.w.amx.as_ref().map_or(0, |p| p.np),
        prep,
        product,
    )
}

/// A product's 32 x 32 blocks as they leave the kernel.
type Emit<'e> = &'e mut dyn FnMut(usize, usize, &[f32]);

/// Each thread takes whole 32-row blocks of x, prepares them once (`prep`), then runs every
/// job's weight over them (`product`, all `width(job)` columns); with too few row blocks to
/// go round (PL-BERT's tokens), x is prepared once and each product's columns are split over
/// the threads instead.
#[allow(clippy::too_many_arguments)]
fn run(
    pool: &Pool,
    x: &CpuTensor,
    n: usize,
    jobs: &[Job],
    outs: &[(SharedMut, usize); 3],
    width: impl Fn(&Job) -> usize + Sync,
    prep: impl Fn(&[f32], usize, &mut Rows) + Sync,
    product: impl Fn(&Rows, usize, &Job, (usize, usize), &mut amx::Block, Emit) + Sync,
) {
    let cols = x.cols;
    if n.div_ceil(MB) < pool.threads() {
        let mut r = Rows::default();
        prep(&x.data[..n * cols], n, &mut r);
        for (job, &(dst, rows)) in jobs.iter().zip(outs) {
            pool.run_aligned(width(job), NB, |j0, j1| {
                let mut c = amx::Block::default();
                let mut emit = |i0: usize, jb: usize, blk: &[f32]| {
                    store_block(job, dst, rows, 0, n, i0, jb, blk)
                };
                product(&r, n, job, (j0, j1), &mut c, &mut emit);
            });
        }
        return;
    }
    pool.run_aligned(n, MB, |t0, t1| {
        ROWS.with(|cell| {
            let (r, c) = &mut *cell.borrow_mut();
            let m = t1 - t0;
            prep(&x.data[t0 * cols..t1 * cols], m, r);
            for (job, &(dst, rows)) in jobs.iter().zip(outs) {
                let mut emit = |i0: usize, j0: usize, blk: &[f32]| {
                    store_block(job, dst, rows, t0, m, i0, j0, blk)
                };
                product(r, m, job, (0, width(job)), c, &mut emit);
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
