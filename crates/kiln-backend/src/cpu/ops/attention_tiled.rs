//! Attention in tiles (x86 AVX2 / AVX-512): one work item is up to `TILE_TOKENS` tokens x
//! the query heads sharing one kv head, and every block of keys or values is read once from
//! the cache for all of the tile's queries (then from L1), where a query at a time streams
//! the whole cache from L2 per query head.
//!
//! Per query, the arithmetic is the same sequence whatever the tile (scores in blocks of 8
//! positions at absolute offsets, softmax, values accumulated in position order), so a
//! token's output does not depend on the tokens computed with it: decode and prefill agree
//! bit for bit.

use std::arch::x86_64::*;

use super::attention::{softmax, zigzag, SegOf, MAX_SEGS};
use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::CpuTensor;

/// Tokens per tile.
const TILE_TOKENS: usize = 4;
/// Positions per values block (their rows stay in L1 while every query of the tile uses
/// them).
const PV_BLOCK: usize = 32;

/// A cache element: f32, or f16 as its bits (u16), widened as it loads.
pub trait KvElem: Copy + Sync {
    /// Whether the values widen as they load (f16): a block that several queries read is
    /// then widened once into scratch.
    const HALF: bool;
    /// 8 values at p as f32. The caller checked AVX2 + F16C.
    unsafe fn ld8(p: *const Self) -> __m256;
    /// 16 values at p as f32. The caller checked AVX-512F.
    unsafe fn ld16(p: *const Self) -> __m512;
}

impl KvElem for f32 {
    const HALF: bool = false;
    #[inline(always)]
    unsafe fn ld8(p: *const f32) -> __m256 {
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn ld16(p: *const f32) -> __m512 {
        unsafe { _mm512_loadu_ps(p) }
    }
}

impl KvElem for u16 {
    const HALF: bool = true;
    #[inline(always)]
    unsafe fn ld8(p: *const u16) -> __m256 {
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn ld16(p: *const u16) -> __m512 {
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
}

/// Whether this path takes the shape (head sizes with compiled kernels).
pub fn handles(hd: usize) -> bool {
    matches!(hd, 64 | 128 | 256)
}

#[derive(Default)]
pub struct Scratch {
    scores: Vec<f32>,
    /// Two accumulator sets per query (even and odd positions), HD each.
    o: Vec<f32>,
    /// A block of an f16 cache's rows widened to f32 (`PV_BLOCK` rows).
    wide: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = Default::default();
}

/// Causal grouped-query attention of every sequence in `segs` (see
/// `attention::attention_segs`) as one pool job, `avx512` choosing 512-bit vectors. The
/// caller checked AVX2 + FMA (+ F16C for an f16 cache; AVX-512F when `avx512`), `handles`
/// for every head size, and that `segs` is not empty.
pub fn attention<E: Entries>(
    pool: &Pool,
    q: &CpuTensor,
    segs: &[SegOf<'_, E>],
    out: &mut CpuTensor,
    avx512: bool,
) {
    let dst = SharedMut(out.data.as_mut_ptr());
    let out_cols = out.cols;
    let hd = segs[0].s.head_dim;
    // Work items of sequence j: starts[j]..starts[j + 1] (tiles x kv heads each).
    let mut starts = [0usize; MAX_SEGS + 1];
    let (mut score_len, mut o_len) = (0, 0);
    for (j, g) in segs.iter().enumerate() {
        let s = g.s;
        let group = s.n_heads / s.n_kv_heads;
        let m_max = TILE_TOKENS.min(s.n_tokens) * group;
        score_len = score_len.max(m_max * (s.pos0 + s.n_tokens));
        o_len = o_len.max(m_max * 2 * s.head_dim);
        starts[j + 1] = starts[j] + s.n_tokens.div_ceil(TILE_TOKENS) * s.n_kv_heads;
    }
    let starts = &starts[..segs.len() + 1];
    pool.run(starts[segs.len()], |i0, i1| {
        SCRATCH.with(|cell| {
            let mut guard = cell.borrow_mut();
            let sc = &mut *guard;
            sc.scores.resize(sc.scores.len().max(score_len), 0.0);
            sc.o.resize(sc.o.len().max(o_len), 0.0);
            sc.wide.resize(sc.wide.len().max(PV_BLOCK * hd), 0.0);
            let job = Job {
                q,
                segs,
                starts,
                dst,
                out_cols,
            };
            // SAFETY: the caller detected the features (the boundary is here: closures do
            // not inherit target features).
            unsafe {
                match (avx512, hd) {
                    (true, 64) => E::tiles_avx512::<64>(&job, i0, i1, sc),
                    (true, 128) => E::tiles_avx512::<128>(&job, i0, i1, sc),
                    (true, _) => E::tiles_avx512::<256>(&job, i0, i1, sc),
                    (false, 64) => E::tiles_avx2::<64>(&job, i0, i1, sc),
                    (false, 128) => E::tiles_avx2::<128>(&job, i0, i1, sc),
                    (false, _) => E::tiles_avx2::<256>(&job, i0, i1, sc),
                }
            }
        })
    });
}

pub struct Job<'a, E> {
    q: &'a CpuTensor,
    segs: &'a [SegOf<'a, E>],
    starts: &'a [usize],
    dst: SharedMut,
    out_cols: usize,
}

/// The entry points by cache element (the f16 ones also need F16C).
pub trait Entries: KvElem {
    unsafe fn tiles_avx512<const HD: usize>(
        job: &Job<Self>,
        i0: usize,
        i1: usize,
        sc: &mut Scratch,
    );
    unsafe fn tiles_avx2<const HD: usize>(job: &Job<Self>, i0: usize, i1: usize, sc: &mut Scratch);
}

impl Entries for f32 {
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn tiles_avx512<const HD: usize>(
        job: &Job<f32>,
        i0: usize,
        i1: usize,
        sc: &mut Scratch,
    ) {
        unsafe { tiles::<HD, true, f32>(job, i0, i1, sc) }
    }
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tiles_avx2<const HD: usize>(job: &Job<f32>, i0: usize, i1: usize, sc: &mut Scratch) {
        unsafe { tiles::<HD, false, f32>(job, i0, i1, sc) }
    }
}

impl Entries for u16 {
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn tiles_avx512<const HD: usize>(
        job: &Job<u16>,
        i0: usize,
        i1: usize,
        sc: &mut Scratch,
    ) {
        unsafe { tiles::<HD, true, u16>(job, i0, i1, sc) }
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tiles_avx2<const HD: usize>(job: &Job<u16>, i0: usize, i1: usize, sc: &mut Scratch) {
        unsafe { tiles::<HD, false, u16>(job, i0, i1, sc) }
    }
}

/// Work items i0..i1, each (sequence, tile of its tokens, kv head).
#[inline(always)]
unsafe fn tiles<const HD: usize, const W512: bool, E: KvElem>(
    job: &Job<E>,
    i0: usize,
    i1: usize,
    scr: &mut Scratch,
) {
    let scale = 1.0 / (HD as f32).sqrt();
    // The sequence of item i0, then walk forward.
    let mut j = job.starts.partition_point(|&st| st <= i0) - 1;
    for i in i0..i1 {
        while job.starts[j + 1] <= i {
            j += 1;
        }
        let SegOf {
            k,
            v,
            n_ctx,
            s,
            row0,
        } = job.segs[j];
        let group = s.n_heads / s.n_kv_heads;
        let tiles = s.n_tokens.div_ceil(TILE_TOKENS);
        let local = i - job.starts[j];
        let (tile, kvh) = (zigzag(local / s.n_kv_heads, tiles), local % s.n_kv_heads);
        let t0 = tile * TILE_TOKENS;
        let t1 = (t0 + TILE_TOKENS).min(s.n_tokens);
        let m_count = (t1 - t0) * group;
        let max_len = s.pos0 + t1;
        let kh = &k[kvh * n_ctx * HD..(kvh * n_ctx + max_len) * HD];
        let vh = &v[kvh * n_ctx * HD..(kvh * n_ctx + max_len) * HD];
        // Query m: token t0 + m / group, head kvh * group + m % group (row row0 + token);
        // it sees positions lo..len (a sliding window starts past 0).
        let query = |m: usize| {
            let (t, h) = (t0 + m / group, kvh * group + m % group);
            let at = (row0 + t) * job.q.cols + h * HD;
            (&job.q.data[at..at + HD], s.pos0 + t + 1, t, h, s.first(t))
        };
        // The tile's first position: its first token's (blocks stay at absolute offsets, so
        // each query's sums are the ones it gets in any tile).
        let tile_lo = s.first(t0);
        let scores = &mut scr.scores[..m_count * max_len];
        // A decode tile's block of an f16 cache, which its query heads all read, is widened
        // once (exact: the sums are the ones the queries' own widening loads give). Measured
        // on Zen 5: decode at depth 2048 +15% (four streams), prefill tiles (whose blocks stay
        // in L1 for every token) 10% slower widened, so they keep widening as they load.
        let decode_f16 = E::HALF && m_count > 1 && t1 - t0 == 1;
        // With AVX-512 its query heads go through the blocks in pairs instead, each value
        // widened in registers once for both (no stores of widened rows, no reloads; the same
        // sums). Zen 4, Qwen3-0.6B shape, the attention alone against widened blocks: 25%
        // less time at 64 positions (four sequences), 32-37% at 1024-4096.
        let (widen, pairs) = (decode_f16 && !W512, decode_f16 && W512);
        let wide = &mut scr.wide[..PV_BLOCK * HD];
        for p0 in (tile_lo / 8 * 8..max_len).step_by(8) {
            let p_end = (p0 + 8).min(max_len);
            // (A decode tile's queries all see tile_lo..max_len.)
            if pairs && p0 + 8 <= max_len {
                let k8 = &kh[p0 * HD..(p0 + 8) * HD];
                for m in (0..m_count).step_by(2) {
                    let (rows, rest) = scores[m * max_len..].split_at_mut(max_len);
                    let out = &mut rows[p0..p0 + 8];
                    if m + 1 < m_count {
                        let (q0, q1) = (query(m).0, query(m + 1).0);
                        let out1 = &mut rest[p0..p0 + 8];
                        unsafe { score8x2::<HD, E>([q0, q1], k8, scale, [out, out1]) };
                    } else {
                        unsafe { score8::<HD, W512, E>(query(m).0, k8, scale, out) };
                    }
                }
                continue;
            }
            if widen {
                unsafe { widen_rows::<W512, E>(&kh[p0 * HD..p_end * HD], wide) };
            }
            for m in 0..m_count {
                let (qm, len, _, _, lo) = query(m);
                if p0 + 8 <= lo {
                    continue;
                }
                let row = &mut scores[m * max_len..(m + 1) * max_len];
                if p0 + 8 <= len {
                    let out = &mut row[p0..p0 + 8];
                    unsafe {
                        match widen {
                            true => score8::<HD, W512, f32>(qm, &wide[..8 * HD], scale, out),
                            false => {
                                score8::<HD, W512, E>(qm, &kh[p0 * HD..(p0 + 8) * HD], scale, out)
                            }
                        }
                    };
                } else {
                    for p in p0..len {
                        row[p] = unsafe {
                            match widen {
                                true => score1::<HD, W512, f32>(
                                    qm,
                                    &wide[(p - p0) * HD..(p - p0 + 1) * HD],
                                ),
                                false => score1::<HD, W512, E>(qm, &kh[p * HD..(p + 1) * HD]),
                            }
                        } * scale;
                    }
                }
            }
        }
        for m in 0..m_count {
            let (_, len, _, _, lo) = query(m);
            softmax(&mut scores[m * max_len + lo..m * max_len + len]);
        }
        let o = &mut scr.o[..m_count * 2 * HD];
        o.fill(0.0);
        for b0 in (tile_lo / PV_BLOCK * PV_BLOCK..max_len).step_by(PV_BLOCK) {
            let b1 = (b0 + PV_BLOCK).min(max_len);
            if widen {
                unsafe { widen_rows::<W512, E>(&vh[b0 * HD..b1 * HD], wide) };
            }
            if pairs {
                let (p0, p1) = (b0.max(tile_lo), b1);
                let v = &vh[p0 * HD..p1 * HD];
                for m in (0..m_count).step_by(2) {
                    let w0 = &scores[m * max_len + p0..m * max_len + p1];
                    let (om, rest) = o[m * 2 * HD..].split_at_mut(2 * HD);
                    if m + 1 < m_count {
                        let w1 = &scores[(m + 1) * max_len + p0..(m + 1) * max_len + p1];
                        unsafe { pv_x2::<HD, E>([w0, w1], v, [om, &mut rest[..2 * HD]]) };
                    } else {
                        unsafe { pv::<HD, W512, E>(w0, v, om) };
                    }
                }
                continue;
            }
            for m in 0..m_count {
                let (_, len, _, _, lo) = query(m);
                let p0 = b0.max(lo);
                if p0 >= len || b0 + PV_BLOCK <= lo {
                    continue;
                }
                let p1 = (b0 + PV_BLOCK).min(len);
                let w = &scores[m * max_len + p0..m * max_len + p1];
                let om = &mut o[m * 2 * HD..(m + 1) * 2 * HD];
                unsafe {
                    match widen {
                        true => pv::<HD, W512, f32>(w, &wide[(p0 - b0) * HD..(p1 - b0) * HD], om),
                        false => pv::<HD, W512, E>(w, &vh[p0 * HD..p1 * HD], om),
                    }
                };
            }
        }
        for m in 0..m_count {
            let (_, _, t, h, _) = query(m);
            let base = (row0 + t) * job.out_cols + h * HD;
            let om = &o[m * 2 * HD..(m + 1) * 2 * HD];
            for e in 0..HD {
                // SAFETY: head h of token t of this sequence is written by this work item
                // only (sequences own disjoint rows).
                unsafe { job.dst.write(base + e, om[e] + om[HD + e]) };
            }
        }
    }
}

/// src's values widened to f32 into the front of dst (src a whole number of 16-value runs).
#[inline(always)]
unsafe fn widen_rows<const W512: bool, E: KvElem>(src: &[E], dst: &mut [f32]) {
    assert!(src.len() % 16 == 0 && dst.len() >= src.len());
    unsafe {
        let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
        for i in (0..src.len()).step_by(16) {
            if W512 {
                _mm512_storeu_ps(dp.add(i), E::ld16(sp.add(i)));
            } else {
                _mm256_storeu_ps(dp.add(i), E::ld8(sp.add(i)));
                _mm256_storeu_ps(dp.add(i + 8), E::ld8(sp.add(i + 8)));
            }
        }
    }
}

/// Scores of 8 consecutive positions (k: 8 rows of HD) for q, times `scale`, into out.
#[inline(always)]
unsafe fn score8<const HD: usize, const W512: bool, E: KvElem>(
    q: &[f32],
    k: &[E],
    scale: f32,
    out: &mut [f32],
) {
    assert!(q.len() == HD && k.len() == 8 * HD && out.len() == 8);
    unsafe {
        let (qp, kp) = (q.as_ptr(), k.as_ptr());
        let mut h = [_mm256_setzero_ps(); 8];
        if W512 {
            // Row by row (the cache read in address order, which the prefetchers follow),
            // the query in registers; each lane's sum taken over c in order as before.
            let mut qv = [_mm512_setzero_ps(); 16];
            for (c, x) in qv.iter_mut().enumerate().take(HD / 16) {
                *x = _mm512_loadu_ps(qp.add(16 * c));
            }
            let mut acc = [_mm512_setzero_ps(); 8];
            for (j, a) in acc.iter_mut().enumerate() {
                for (c, x) in qv.iter().enumerate().take(HD / 16) {
                    *a = _mm512_fmadd_ps(*x, E::ld16(kp.add(j * HD + 16 * c)), *a);
                }
            }
            for j in 0..8 {
                h[j] = _mm256_add_ps(
                    _mm512_castps512_ps256(acc[j]),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[j]), 1)),
                );
            }
        } else {
            for c in 0..HD / 8 {
                let qv = _mm256_loadu_ps(qp.add(8 * c));
                for (j, a) in h.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(qv, E::ld8(kp.add(j * HD + 8 * c)), *a);
                }
            }
        }
        reduce8(&h, scale, out);
    }
}

/// Lane j of `out` = the sum of h[j]'s lanes times `scale` (a transposed reduction).
#[inline(always)]
unsafe fn reduce8(h: &[__m256; 8], scale: f32, out: &mut [f32]) {
    assert!(out.len() == 8);
    unsafe {
        let t0 = _mm256_hadd_ps(h[0], h[1]);
        let t1 = _mm256_hadd_ps(h[2], h[3]);
        let t2 = _mm256_hadd_ps(h[4], h[5]);
        let t3 = _mm256_hadd_ps(h[6], h[7]);
        let u0 = _mm256_hadd_ps(t0, t1);
        let u1 = _mm256_hadd_ps(t2, t3);
        let lo = _mm256_permute2f128_ps(u0, u1, 0x20);
        let hi = _mm256_permute2f128_ps(u0, u1, 0x31);
        let r = _mm256_mul_ps(_mm256_add_ps(lo, hi), _mm256_set1_ps(scale));
        _mm256_storeu_ps(out.as_mut_ptr(), r);
    }
}

/// `score8` (512-bit) of two queries over the same 8 rows, each value of k widened once
/// for both: each query's sums are score8's, bit for bit.
#[inline(always)]
unsafe fn score8x2<const HD: usize, E: KvElem>(
    q: [&[f32]; 2],
    k: &[E],
    scale: f32,
    out: [&mut [f32]; 2],
) {
    assert!(q[0].len() == HD && q[1].len() == HD && k.len() == 8 * HD);
    unsafe {
        let kp = k.as_ptr();
        let mut h = [[_mm256_setzero_ps(); 8]; 2];
        // Four rows at a time: both queries' accumulators and the queries in registers.
        for j0 in (0..8).step_by(4) {
            let mut acc = [[_mm512_setzero_ps(); 4]; 2];
            for c in 0..HD / 16 {
                let x0 = _mm512_loadu_ps(q[0].as_ptr().add(16 * c));
                let x1 = _mm512_loadu_ps(q[1].as_ptr().add(16 * c));
                for j in 0..4 {
                    let kv = E::ld16(kp.add((j0 + j) * HD + 16 * c));
                    acc[0][j] = _mm512_fmadd_ps(x0, kv, acc[0][j]);
                    acc[1][j] = _mm512_fmadd_ps(x1, kv, acc[1][j]);
                }
            }
            for (hq, aq) in h.iter_mut().zip(&acc) {
                for j in 0..4 {
                    hq[j0 + j] = _mm256_add_ps(
                        _mm512_castps512_ps256(aq[j]),
                        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(aq[j]), 1)),
                    );
                }
            }
        }
        let [o0, o1] = out;
        reduce8(&h[0], scale, o0);
        reduce8(&h[1], scale, o1);
    }
}

/// q . k for one position.
#[inline(always)]
unsafe fn score1<const HD: usize, const W512: bool, E: KvElem>(q: &[f32], k: &[E]) -> f32 {
    assert!(q.len() == HD && k.len() == HD);
    unsafe {
        let (qp, kp) = (q.as_ptr(), k.as_ptr());
        if W512 {
            let mut a = _mm512_setzero_ps();
            for c in 0..HD / 16 {
                a = _mm512_fmadd_ps(_mm512_loadu_ps(qp.add(16 * c)), E::ld16(kp.add(16 * c)), a);
            }
            _mm512_reduce_add_ps(a)
        } else {
            let mut a = _mm256_setzero_ps();
            for c in 0..HD / 8 {
                a = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(8 * c)), E::ld8(kp.add(8 * c)), a);
            }
            let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
        }
    }
}

/// o[set] += w[i] * v[i] over a block of positions, set = the parity of i (the position's,
/// where the block starts at an even one); `o` holds the two sets, HD each.
#[inline(always)]
unsafe fn pv<const HD: usize, const W512: bool, E: KvElem>(w: &[f32], v: &[E], o: &mut [f32]) {
    assert!(v.len() == w.len() * HD && o.len() == 2 * HD);
    // Columns in slices of up to 128 (the accumulators of one slice fill the registers);
    // each output value's sum runs over the positions in the same order whatever the slice.
    if HD <= 128 {
        unsafe { pv_cols::<HD, W512, E, HD>(w, v, o, 0) };
    } else {
        for c0 in (0..HD).step_by(128) {
            unsafe { pv_cols::<HD, W512, E, 128>(w, v, o, c0) };
        }
    }
}

/// `pv` (512-bit) of two queries' weights over the same value rows, each value widened
/// once for both, in slices of 64 columns (both queries' two sets fill 16 registers): each
/// output's sum is `pv`'s, bit for bit.
#[inline(always)]
unsafe fn pv_x2<const HD: usize, E: KvElem>(w: [&[f32]; 2], v: &[E], o: [&mut [f32]; 2]) {
    const CW: usize = 64;
    let n = w[0].len();
    assert!(w[1].len() == n && v.len() == n * HD && o[0].len() == 2 * HD && o[1].len() == 2 * HD);
    let [o0, o1] = o;
    unsafe {
        let op = [o0.as_mut_ptr(), o1.as_mut_ptr()];
        for c0 in (0..HD).step_by(CW) {
            let vp = v.as_ptr().add(c0);
            // acc[query][set][column vector]
            let mut acc = [[[_mm512_setzero_ps(); CW / 16]; 2]; 2];
            for q in 0..2 {
                for set in 0..2 {
                    for c in 0..CW / 16 {
                        acc[q][set][c] = _mm512_loadu_ps(op[q].add(set * HD + c0 + 16 * c));
                    }
                }
            }
            for i in 0..n / 2 {
                let (r0, r1) = (vp.add(2 * i * HD), vp.add((2 * i + 1) * HD));
                let wq = [
                    [_mm512_set1_ps(w[0][2 * i]), _mm512_set1_ps(w[0][2 * i + 1])],
                    [_mm512_set1_ps(w[1][2 * i]), _mm512_set1_ps(w[1][2 * i + 1])],
                ];
                for c in 0..CW / 16 {
                    let x0 = E::ld16(r0.add(16 * c));
                    acc[0][0][c] = _mm512_fmadd_ps(wq[0][0], x0, acc[0][0][c]);
                    acc[1][0][c] = _mm512_fmadd_ps(wq[1][0], x0, acc[1][0][c]);
                }
                for c in 0..CW / 16 {
                    let x1 = E::ld16(r1.add(16 * c));
                    acc[0][1][c] = _mm512_fmadd_ps(wq[0][1], x1, acc[0][1][c]);
                    acc[1][1][c] = _mm512_fmadd_ps(wq[1][1], x1, acc[1][1][c]);
                }
            }
            if n % 2 == 1 {
                let r = vp.add((n - 1) * HD);
                let (w0, w1) = (_mm512_set1_ps(w[0][n - 1]), _mm512_set1_ps(w[1][n - 1]));
                for c in 0..CW / 16 {
                    let x = E::ld16(r.add(16 * c));
                    acc[0][0][c] = _mm512_fmadd_ps(w0, x, acc[0][0][c]);
                    acc[1][0][c] = _mm512_fmadd_ps(w1, x, acc[1][0][c]);
                }
            }
            for q in 0..2 {
                for set in 0..2 {
                    for c in 0..CW / 16 {
                        _mm512_storeu_ps(op[q].add(set * HD + c0 + 16 * c), acc[q][set][c]);
                    }
                }
            }
        }
    }
}

/// `pv` over columns c0..c0 + CW (CW <= 128, a multiple of 16).
#[inline(always)]
unsafe fn pv_cols<const HD: usize, const W512: bool, E: KvElem, const CW: usize>(
    w: &[f32],
    v: &[E],
    o: &mut [f32],
    c0: usize,
) {
    let cw = CW;
    unsafe {
        let (vp, op) = (v.as_ptr().add(c0), o.as_mut_ptr().add(c0));
        if W512 {
            // The two sets as two named arrays, positions taken in pairs: a set chosen by a
            // runtime index would live on the stack, each FMA a load and a store.
            let (mut a0, mut a1) = ([_mm512_setzero_ps(); 8], [_mm512_setzero_ps(); 8]);
            for c in 0..cw / 16 {
                a0[c] = _mm512_loadu_ps(op.add(16 * c));
                a1[c] = _mm512_loadu_ps(op.add(HD + 16 * c));
            }
            let pairs = w.len() / 2;
            for i in 0..pairs {
                let (w0, w1) = (_mm512_set1_ps(w[2 * i]), _mm512_set1_ps(w[2 * i + 1]));
                let (r0, r1) = (vp.add(2 * i * HD), vp.add((2 * i + 1) * HD));
                for c in 0..cw / 16 {
                    a0[c] = _mm512_fmadd_ps(w0, E::ld16(r0.add(16 * c)), a0[c]);
                }
                for c in 0..cw / 16 {
                    a1[c] = _mm512_fmadd_ps(w1, E::ld16(r1.add(16 * c)), a1[c]);
                }
            }
            if w.len() % 2 == 1 {
                let (wv, r) = (_mm512_set1_ps(w[2 * pairs]), vp.add(2 * pairs * HD));
                for c in 0..cw / 16 {
                    a0[c] = _mm512_fmadd_ps(wv, E::ld16(r.add(16 * c)), a0[c]);
                }
            }
            for c in 0..cw / 16 {
                _mm512_storeu_ps(op.add(16 * c), a0[c]);
                _mm512_storeu_ps(op.add(HD + 16 * c), a1[c]);
            }
        } else {
            // One set (the second stays zero): 16-lane sets would not fit 16 registers.
            let mut acc = [_mm256_setzero_ps(); 16];
            for c in 0..cw / 8 {
                acc[c] = _mm256_loadu_ps(op.add(8 * c));
            }
            for (i, &wi) in w.iter().enumerate() {
                let wv = _mm256_set1_ps(wi);
                for c in 0..cw / 8 {
                    acc[c] = _mm256_fmadd_ps(wv, E::ld8(vp.add(i * HD + 8 * c)), acc[c]);
                }
            }
            for c in 0..cw / 8 {
                _mm256_storeu_ps(op.add(8 * c), acc[c]);
            }
        }
    }
}
