//! x86-64 integer kernels: AVX2 (maddubs), AVX-512 VNNI (vpdpbusd on 256-bit lanes, 512-bit
//! in the interleaved kernels over pairs of groups) and AVX-VNNI (the same instruction
//! VEX-encoded, on client CPUs without AVX-512).
//! One body per format, generic over how u8 x i8 products are summed into i32 lanes.

use std::arch::x86_64::*;

use super::tile::DecodedTile;
use super::{ActRow, BlockQ8, Kernels};

pub fn available() -> Vec<&'static Kernels> {
    let mut v: Vec<&'static Kernels> = Vec::new();
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    // BW for the pair kernels' 512-bit byte and word operations (every VNNI CPU has it).
    if avx2
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512bw")
    {
        v.push(&VNNI);
    }
    if avx2 && super::avx_vnni_allowed() {
        v.push(&AVX_VNNI);
    }
    if avx2 {
        v.push(&AVX2);
    }
    v
}

static AVX2: Kernels = Kernels {
    name: "avx2",
    avx512: false,
    x8: Some(&super::x86_x8::AVX2),
    q4_kx4: Some(avx2::q4_kx4),
    q6_kx4: Some(avx2::q6_kx4),
    tile4: Some(avx2::tile4),
    q5_0: avx2::q5_0,
    q5_1: avx2::q5_1,
    q5_0x4: avx2::q5_0x4,
    q5_1x4: avx2::q5_1x4,
    q4_0x4: avx2::q4_0x4,
    q4_1x4: avx2::q4_1x4,
    q8_0x4: avx2::q8_0x4,
    q4_0: avx2::q4_0,
    q4_1: avx2::q4_1,
    q8_0: avx2::q8_0,
    q4_k: avx2::q4_k,
    q5_k: avx2::q5_k,
    q6_k: avx2::q6_k,
};

static VNNI: Kernels = Kernels {
    name: "avx512-vnni",
    avx512: true,
    x8: Some(&super::x86_x8::VNNI),
    q4_kx4: Some(vnni::q4_kx4),
    q6_kx4: Some(vnni::q6_kx4),
    tile4: Some(vnni::tile4),
    q5_0: vnni::q5_0,
    q5_1: vnni::q5_1,
    q5_0x4: vnni::q5_0x4,
    q5_1x4: vnni::q5_1x4,
    q4_0x4: vnni::q4_0x4,
    q4_1x4: vnni::q4_1x4,
    q8_0x4: vnni::q8_0x4,
    q4_0: vnni::q4_0,
    q4_1: vnni::q4_1,
    q8_0: vnni::q8_0,
    q4_k: vnni::q4_k,
    q5_k: vnni::q5_k,
    q6_k: vnni::q6_k,
};

static AVX_VNNI: Kernels = Kernels {
    name: "avx-vnni",
    avx512: false,
    x8: Some(&super::x86_x8::AVX_VNNI),
    q4_kx4: Some(avxvnni::q4_kx4),
    q6_kx4: Some(avxvnni::q6_kx4),
    tile4: Some(avxvnni::tile4),
    q5_0: avxvnni::q5_0,
    q5_1: avxvnni::q5_1,
    q5_0x4: avxvnni::q5_0x4,
    q5_1x4: avxvnni::q5_1x4,
    q4_0x4: avxvnni::q4_0x4,
    q4_1x4: avxvnni::q4_1x4,
    q8_0x4: avxvnni::q8_0x4,
    q4_0: avxvnni::q4_0,
    q4_1: avxvnni::q4_1,
    q8_0: avxvnni::q8_0,
    q4_k: avxvnni::q4_k,
    q5_k: avxvnni::q5_k,
    q6_k: avxvnni::q6_k,
};

/// Sums of 4 adjacent u8 x i8 products per i32 lane.
trait MulSum {
    unsafe fn mul_sum(u: __m256i, s: __m256i) -> __m256i;
}

struct Maddubs;
impl MulSum for Maddubs {
    #[inline(always)]
    unsafe fn mul_sum(u: __m256i, s: __m256i) -> __m256i {
        // u8 x i8 pairs -> i16 (cannot saturate: |q| <= 63 or the pair sum stays in range
        // for 4-bit weights; 8-bit weights go through the sign trick with |x| <= 127), then
        // pairs of i16 -> i32.
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)) }
    }
}

struct Dpbusd;
impl MulSum for Dpbusd {
    #[inline(always)]
    unsafe fn mul_sum(u: __m256i, s: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s) }
    }
}

struct DpbusdVex;
impl MulSum for DpbusdVex {
    #[inline(always)]
    unsafe fn mul_sum(u: __m256i, s: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s) }
    }
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    unsafe {
        let bits = std::ptr::read_unaligned(p as *const u16);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }
}

/// 16 bytes of nibbles -> 32 u8: low nibbles then high nibbles.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    unsafe {
        let q = _mm_loadu_si128(p as *const __m128i);
        let m4 = _mm256_set1_epi8(0x0F);
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4)
    }
}

#[inline(always)]
unsafe fn load_x(b: &BlockQ8) -> __m256i {
    unsafe { _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i) }
}

/// Lane j of v in every lane.
#[inline(always)]
unsafe fn lane(v: __m256, j: i32) -> __m256 {
    unsafe { _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(j)) }
}

/// 8 block scales d_w * d_x from 8 packed f16 weight scales and 8 activation scales.
#[inline(always)]
unsafe fn scales8(wd: *const u8, xd: *const f32) -> __m256 {
    unsafe {
        let w = _mm256_cvtph_ps(_mm_loadu_si128(wd as *const __m128i));
        _mm256_mul_ps(w, _mm256_loadu_ps(xd))
    }
}

/// Sum over blocks of d_w,i * d_x,i * dot_i for the packed 32-value formats: `quants(i)`
/// gives block i's weight quants as u8 and the activations they multiply (sign-adjusted
/// for signed weights).
#[inline(always)]
unsafe fn blocks32<M: MulSum>(
    nb: usize,
    wd: *const u8,
    a: ActRow,
    quants: impl Fn(usize) -> (__m256i, __m256i),
) -> f32 {
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut i = 0;
        while i + 8 <= nb {
            let s = scales8(wd.add(2 * i), a.d.as_ptr().add(i));
            for j in 0..8 {
                let (u, v) = quants(i + j);
                let dot = _mm256_cvtepi32_ps(M::mul_sum(u, v));
                acc[j & 1] = _mm256_fmadd_ps(dot, lane(s, j as i32), acc[j & 1]);
            }
            i += 8;
        }
        while i < nb {
            let s = f16_at(wd.add(2 * i)) * a.d[i];
            let (u, v) = quants(i);
            let dot = _mm256_cvtepi32_ps(M::mul_sum(u, v));
            acc[0] = _mm256_fmadd_ps(dot, _mm256_set1_ps(s), acc[0]);
            i += 1;
        }
        hsum(_mm256_add_ps(acc[0], acc[1]))
    }
}

/// Sum over blocks of f16 field_i * d_x,i * xsum_i (weight offsets and minimums).
#[inline(always)]
unsafe fn scaled_xsum(nb: usize, field: *const u8, a: ActRow) -> f32 {
    unsafe {
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= nb {
            let s = scales8(field.add(2 * i), a.d.as_ptr().add(i));
            acc = _mm256_fmadd_ps(s, _mm256_loadu_ps(a.sum.as_ptr().add(i)), acc);
            i += 8;
        }
        let mut tail = 0f32;
        while i < nb {
            tail += f16_at(field.add(2 * i)) * a.d[i] * a.sum[i];
            i += 1;
        }
        hsum(acc) + tail
    }
}

/// `scaled_xsum` for four rows (fields[r] -> the row's f16 field array), reduced together.
#[inline(always)]
unsafe fn scaled_xsum_x4(nb: usize, fields: [*const u8; 4], a: ActRow) -> [f32; 4] {
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 8 <= nb {
            let xd = a.d.as_ptr().add(i);
            let xs = _mm256_loadu_ps(a.sum.as_ptr().add(i));
            for r in 0..4 {
                acc[r] = _mm256_fmadd_ps(scales8(fields[r].add(2 * i), xd), xs, acc[r]);
            }
            i += 8;
        }
        let mut tail = [0f32; 4];
        while i < nb {
            for r in 0..4 {
                tail[r] += f16_at(fields[r].add(2 * i)) * a.d[i] * a.sum[i];
            }
            i += 1;
        }
        let s = reduce4(acc);
        [
            s[0] + tail[0],
            s[1] + tail[1],
            s[2] + tail[2],
            s[3] + tail[3],
        ]
    }
}

#[inline(always)]
unsafe fn q4_0<M: MulSum>(w: &[u8], a: ActRow) -> f32 {
    unsafe {
        let nb = (w.len() / 18).min(a.blocks.len());
        let qs = w.as_ptr().add(2 * nb);
        let dot = blocks32::<M>(nb, w.as_ptr(), a, |i| {
            (nibbles(qs.add(16 * i)), load_x(a.blocks.get_unchecked(i)))
        });
        dot - 8.0 * scaled_xsum(nb, w.as_ptr(), a)
    }
}

#[inline(always)]
unsafe fn q4_1<M: MulSum>(w: &[u8], a: ActRow) -> f32 {
    unsafe {
        let nb = (w.len() / 20).min(a.blocks.len());
        let qs = w.as_ptr().add(4 * nb);
        let dot = blocks32::<M>(nb, w.as_ptr(), a, |i| {
            (nibbles(qs.add(16 * i)), load_x(a.blocks.get_unchecked(i)))
        });
        dot + scaled_xsum(nb, w.as_ptr().add(2 * nb), a)
    }
}

#[inline(always)]
unsafe fn q8_0<M: MulSum>(w: &[u8], a: ActRow) -> f32 {
    unsafe {
        let nb = (w.len() / 34).min(a.blocks.len());
        let qs = w.as_ptr().add(2 * nb);
        blocks32::<M>(nb, w.as_ptr(), a, |i| {
            let q = _mm256_loadu_si256(qs.add(32 * i) as *const __m256i);
            // |w| x sign(x, w): u8 x i8 with the same products.
            let x = load_x(a.blocks.get_unchecked(i));
            (_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q))
        })
    }
}

/// Like `blocks32` for four rows at once against the same activations (loaded once per
/// block): `quants(row, i, x)` gives row's block i quants and the activations they multiply.
#[inline(always)]
unsafe fn blocks32_x4<M: MulSum>(
    nb: usize,
    wd: [*const u8; 4],
    a: ActRow,
    quants: impl Fn(usize, usize, __m256i) -> (__m256i, __m256i),
) -> [f32; 4] {
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 8 <= nb {
            let xd = a.d.as_ptr().add(i);
            let s = [
                scales8(wd[0].add(2 * i), xd),
                scales8(wd[1].add(2 * i), xd),
                scales8(wd[2].add(2 * i), xd),
                scales8(wd[3].add(2 * i), xd),
            ];
            for j in 0..8 {
                let x = load_x(a.blocks.get_unchecked(i + j));
                for r in 0..4 {
                    let (u, v) = quants(r, i + j, x);
                    let dot = _mm256_cvtepi32_ps(M::mul_sum(u, v));
                    acc[r] = _mm256_fmadd_ps(dot, lane(s[r], j as i32), acc[r]);
                }
            }
            i += 8;
        }
        while i < nb {
            let x = load_x(a.blocks.get_unchecked(i));
            for r in 0..4 {
                let sc = f16_at(wd[r].add(2 * i)) * a.d[i];
                let (u, v) = quants(r, i, x);
                let dot = _mm256_cvtepi32_ps(M::mul_sum(u, v));
                acc[r] = _mm256_fmadd_ps(dot, _mm256_set1_ps(sc), acc[r]);
            }
            i += 1;
        }
        // Four horizontal sums at once: [sum acc0, sum acc1, sum acc2, sum acc3].
        let t = _mm256_hadd_ps(
            _mm256_hadd_ps(acc[0], acc[1]),
            _mm256_hadd_ps(acc[2], acc[3]),
        );
        let t = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        let mut out = [0f32; 4];
        _mm_storeu_ps(out.as_mut_ptr(), t);
        out
    }
}

#[inline(always)]
fn rows4(w: &[u8], rb: usize) -> [*const u8; 4] {
    assert!(w.len() >= 4 * rb);
    let p = w.as_ptr();
    // SAFETY: w holds four rows of rb bytes (checked above).
    unsafe { [p, p.add(rb), p.add(2 * rb), p.add(3 * rb)] }
}

#[inline(always)]
unsafe fn q4_0x4<M: MulSum>(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
    unsafe {
        let nb = (rb / 18).min(a.blocks.len());
        let p = rows4(w, rb);
        let dots = blocks32_x4::<M>(nb, p, a, |r, i, x| (nibbles(p[r].add(2 * nb + 16 * i)), x));
        let offs = scaled_xsum_x4(nb, p, a);
        for r in 0..4 {
            out[r] = dots[r] + -8.0 * offs[r];
        }
    }
}

#[inline(always)]
unsafe fn q4_1x4<M: MulSum>(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
    unsafe {
        let nb = (rb / 20).min(a.blocks.len());
        let p = rows4(w, rb);
        let dots = blocks32_x4::<M>(nb, p, a, |r, i, x| (nibbles(p[r].add(4 * nb + 16 * i)), x));
        let m = [
            p[0].add(2 * nb),
            p[1].add(2 * nb),
            p[2].add(2 * nb),
            p[3].add(2 * nb),
        ];
        let offs = scaled_xsum_x4(nb, m, a);
        for r in 0..4 {
            out[r] = dots[r] + 1.0 * offs[r];
        }
    }
}

#[inline(always)]
unsafe fn q8_0x4<M: MulSum>(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
    unsafe {
        let nb = (rb / 34).min(a.blocks.len());
        let p = rows4(w, rb);
        *out = blocks32_x4::<M>(nb, p, a, |r, i, x| {
            let q = _mm256_loadu_si256(p[r].add(2 * nb + 32 * i) as *const __m256i);
            (_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q))
        });
    }
}

/// A Q5 block's 32 high bits (qh u32 at p) as bytes 0x10 / 0x00 in element order.
#[inline(always)]
unsafe fn q5_high(p: *const u8) -> __m256i {
    unsafe {
        let qh = std::ptr::read_unaligned(p as *const i32);
        // Byte j takes byte j/8 of qh (within each 128-bit lane: bytes 0,1 then 2,3).
        let shuf = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        );
        let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(qh), shuf), bits);
        _mm256_and_si256(_mm256_cmpeq_epi8(b, bits), _mm256_set1_epi8(0x10))
    }
}

/// The 5-bit quants of a packed Q5 block body (qh u32, qs[16]) as u8.
#[inline(always)]
unsafe fn q5_quants(p: *const u8) -> __m256i {
    unsafe { _mm256_or_si256(nibbles(p.add(4)), q5_high(p)) }
}

#[inline(always)]
unsafe fn q5_0<M: MulSum>(w: &[u8], a: ActRow) -> f32 {
    unsafe {
        let nb = (w.len() / 22).min(a.blocks.len());
        let body = w.as_ptr().add(2 * nb);
        let dot = blocks32::<M>(nb, w.as_ptr(), a, |i| {
            (
                q5_quants(body.add(20 * i)),
                load_x(a.blocks.get_unchecked(i)),
            )
        });
        dot - 16.0 * scaled_xsum(nb, w.as_ptr(), a)
    }
}

#[inline(always)]
unsafe fn q5_1<M: MulSum>(w: &[u8], a: ActRow) -> f32 {
    unsafe {
        let nb = (w.len() / 24).min(a.blocks.len());
        let body = w.as_ptr().add(4 * nb);
        let dot = blocks32::<M>(nb, w.as_ptr(), a, |i| {
            (
                q5_quants(body.add(20 * i)),
                load_x(a.blocks.get_unchecked(i)),
            )
        });
        dot + scaled_xsum(nb, w.as_ptr().add(2 * nb), a)
    }
}

#[inline(always)]
unsafe fn q5_0x4<M: MulSum>(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
    unsafe {
        let nb = (rb / 22).min(a.blocks.len());
        let p = rows4(w, rb);
        let dots = blocks32_x4::<M>(nb, p, a, |r, i, x| {
            (q5_quants(p[r].add(2 * nb + 20 * i)), x)
        });
        let offs = scaled_xsum_x4(nb, p, a);
        for r in 0..4 {
            out[r] = dots[r] + -16.0 * offs[r];
        }
    }
}

#[inline(always)]
unsafe fn q5_1x4<M: MulSum>(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
    unsafe {
        let nb = (rb / 24).min(a.blocks.len());
        let p = rows4(w, rb);
        let dots = blocks32_x4::<M>(nb, p, a, |r, i, x| {
            (q5_quants(p[r].add(4 * nb + 20 * i)), x)
        });
        let m = [
            p[0].add(2 * nb),
            p[1].add(2 * nb),
            p[2].add(2 * nb),
            p[3].add(2 * nb),
        ];
        let offs = scaled_xsum_x4(nb, m, a);
        for r in 0..4 {
            out[r] = dots[r] + 1.0 * offs[r];
        }
    }
}

/// Rows r..r+4 of a decoded tile against one activation row: the prefill inner loop, no
/// unpacking. Same products and summation order as `blocks32_x4` + `scaled_xsum_x4`, so the
/// result equals the four-row kernels' bit for bit.
#[inline(always)]
unsafe fn tile4<M: MulSum>(tile: &DecodedTile, r: usize, a: ActRow, out: &mut [f32; 4]) {
    unsafe {
        let nb = tile.nb.min(a.blocks.len());
        let tn = tile.nb;
        assert!(tile.s.len() >= (r + 4) * tn && tile.q.len() >= (r + 4) * tn * 32);
        let (q, s, o) = (tile.q.as_ptr(), tile.s.as_ptr(), tile.o.as_ptr());
        let quants = |at: usize, x: __m256i| {
            let qv = _mm256_loadu_si256(q.add(at * 32) as *const __m256i);
            if tile.signed {
                (_mm256_sign_epi8(qv, qv), _mm256_sign_epi8(x, qv))
            } else {
                (qv, x)
            }
        };
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut offs = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 8 <= nb {
            let xd = _mm256_loadu_ps(a.d.as_ptr().add(i));
            let xs = _mm256_loadu_ps(a.sum.as_ptr().add(i));
            let mut sc = [_mm256_setzero_ps(); 4];
            for k in 0..4 {
                let at = (r + k) * tn + i;
                sc[k] = _mm256_mul_ps(_mm256_loadu_ps(s.add(at)), xd);
                let ov = _mm256_mul_ps(_mm256_loadu_ps(o.add(at)), xd);
                offs[k] = _mm256_fmadd_ps(ov, xs, offs[k]);
            }
            for j in 0..8 {
                let x = load_x(a.blocks.get_unchecked(i + j));
                for k in 0..4 {
                    let (u, v) = quants((r + k) * tn + i + j, x);
                    let dot = _mm256_cvtepi32_ps(M::mul_sum(u, v));
                    acc[k] = _mm256_fmadd_ps(dot, lane(sc[k], j as i32), acc[k]);
                }
            }
            i += 8;
        }
        let mut tail = [0f32; 4];
        while i < nb {
            let x = load_x(a.blocks.get_unchecked(i));
            for k in 0..4 {
                let at = (r + k) * tn + i;
                let (u, v) = quants(at, x);
                let dot = _mm256_cvtepi32_ps(M::mul_sum(u, v));
                acc[k] = _mm256_fmadd_ps(dot, _mm256_set1_ps(*s.add(at) * a.d[i]), acc[k]);
                tail[k] += *o.add(at) * a.d[i] * a.sum[i];
            }
            i += 1;
        }
        let dots = reduce4(acc);
        let offs = reduce4(offs);
        for k in 0..4 {
            out[k] = dots[k] + tile.c * (offs[k] + tail[k]);
        }
    }
}

/// [sum v0, sum v1, sum v2, sum v3] of four vectors.
#[inline(always)]
unsafe fn reduce4(v: [__m256; 4]) -> [f32; 4] {
    unsafe {
        let t = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
        let t = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        let mut out = [0f32; 4];
        _mm_storeu_ps(out.as_mut_ptr(), t);
        out
    }
}

/// The 8 scales and 8 mins of a Q4_K / Q5_K super-block.
#[inline(always)]
fn k4_scales(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        (sc[j], m[j]) = super::scalar::scale_min_k4(j, s);
    }
    (sc, m)
}

/// 8 u8 -> 8 f32.
#[inline(always)]
unsafe fn u8x8_to_f32(v: &[u8; 8]) -> __m256 {
    unsafe {
        let b = _mm_loadl_epi64(v.as_ptr() as *const __m128i);
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b))
    }
}

#[inline(always)]
unsafe fn q4_k<M: MulSum>(w: &[u8], a: ActRow) -> f32 {
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut mins = _mm256_setzero_ps();
        for (i, x) in a.blocks.chunks_exact(8).enumerate().take(w.len() / 144) {
            let p = w.as_ptr().add(i * 144);
            let (sc, m) = k4_scales(std::slice::from_raw_parts(p.add(4), 12));
            let xd = _mm256_loadu_ps(a.d.as_ptr().add(8 * i));
            // Per sub-block: d * sc_j * d_x,j and dmin * m_j * d_x,j.
            let s8 = _mm256_mul_ps(
                _mm256_mul_ps(_mm256_set1_ps(f16_at(p)), u8x8_to_f32(&sc)),
                xd,
            );
            let m8 = _mm256_mul_ps(
                _mm256_mul_ps(_mm256_set1_ps(f16_at(p.add(2))), u8x8_to_f32(&m)),
                xd,
            );
            mins = _mm256_fmadd_ps(m8, _mm256_loadu_ps(a.sum.as_ptr().add(8 * i)), mins);
            for j in 0..4 {
                let q = _mm256_loadu_si256(p.add(16 + 32 * j) as *const __m256i);
                let lo = _mm256_and_si256(q, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                let d0 = _mm256_cvtepi32_ps(M::mul_sum(lo, load_x(&x[2 * j])));
                let d1 = _mm256_cvtepi32_ps(M::mul_sum(hi, load_x(&x[2 * j + 1])));
                acc[0] = _mm256_fmadd_ps(d0, lane(s8, 2 * j as i32), acc[0]);
                acc[1] = _mm256_fmadd_ps(d1, lane(s8, 2 * j as i32 + 1), acc[1]);
            }
        }
        hsum(_mm256_add_ps(acc[0], acc[1])) - hsum(mins)
    }
}

#[inline(always)]
unsafe fn q5_k<M: MulSum>(w: &[u8], a: ActRow) -> f32 {
    unsafe {
        let a = a.blocks;
        let m4 = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        let mut acc = _mm256_setzero_ps();
        let mut mins = 0f32;
        for (i, x) in a.chunks_exact(8).enumerate().take(w.len() / 176) {
            let p = w.as_ptr().add(i * 176);
            let (d, dmin) = (f16_at(p), f16_at(p.add(2)));
            let (sc, m) = k4_scales(std::slice::from_raw_parts(p.add(4), 12));
            let mut qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
            for j in 0..4 {
                let q = _mm256_loadu_si256(p.add(48 + 32 * j) as *const __m256i);
                let h0 = _mm256_slli_epi16(_mm256_and_si256(qh, one), 4);
                let h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4);
                qh = _mm256_srli_epi16(qh, 2);
                let lo = _mm256_or_si256(_mm256_and_si256(q, m4), h0);
                let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h1);
                let (x0, x1) = (&x[2 * j], &x[2 * j + 1]);
                let d0 = _mm256_set1_ps(d * x0.d * sc[2 * j] as f32);
                let d1 = _mm256_set1_ps(d * x1.d * sc[2 * j + 1] as f32);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(M::mul_sum(lo, load_x(x0))), d0, acc);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(M::mul_sum(hi, load_x(x1))), d1, acc);
                mins += dmin
                    * (x0.d * m[2 * j] as f32 * x0.sum() as f32
                        + x1.d * m[2 * j + 1] as f32 * x1.sum() as f32);
            }
        }
        hsum(acc) - mins
    }
}

#[inline(always)]
unsafe fn q6_k<M: MulSum>(w: &[u8], a: ActRow) -> f32 {
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(0x03);
        let mut acc = [_mm256_setzero_ps(); 2];
        for (i, x) in a.blocks.chunks_exact(8).enumerate().take(w.len() / 210) {
            let p = w.as_ptr().add(i * 210);
            let d = f16_at(p.add(208));
            for n in 0..2 {
                let ql0 = _mm256_loadu_si256(p.add(64 * n) as *const __m256i);
                let ql1 = _mm256_loadu_si256(p.add(64 * n + 32) as *const __m256i);
                let qh = _mm256_loadu_si256(p.add(128 + 32 * n) as *const __m256i);
                // The 8 i8 scales of this half: two per activation block 4n..4n+4.
                let sc = p.add(192 + 8 * n) as *const i8;
                let s8 =
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(sc as *const __m128i)));
                let s8 = _mm256_mul_ps(s8, _mm256_set1_ps(d));
                let quants = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, m4),
                        _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4),
                    ),
                ];
                let m32 = _mm256_set1_epi8(32);
                for (k, q) in quants.into_iter().enumerate() {
                    let xb = &x[4 * n + k];
                    let xd = *a.d.get_unchecked(8 * i + 4 * n + k);
                    // Lanes 0..4 hold the first 16 values (scale 2k), 4..8 the next (2k+1).
                    let idx = _mm256_setr_epi32(
                        2 * k as i32,
                        2 * k as i32,
                        2 * k as i32,
                        2 * k as i32,
                        2 * k as i32 + 1,
                        2 * k as i32 + 1,
                        2 * k as i32 + 1,
                        2 * k as i32 + 1,
                    );
                    let scale =
                        _mm256_mul_ps(_mm256_permutevar8x32_ps(s8, idx), _mm256_set1_ps(xd));
                    // Signed quants q - 32 as |q| x sign(x, q): no offset correction needed.
                    let qs = _mm256_sub_epi8(q, m32);
                    let xv = load_x(xb);
                    let dot = M::mul_sum(_mm256_sign_epi8(qs, qs), _mm256_sign_epi8(xv, qs));
                    acc[k & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[k & 1]);
                }
            }
        }
        hsum(_mm256_add_ps(acc[0], acc[1]))
    }
}

/// Q4_K, four rows against the same activations.
#[inline(always)]
unsafe fn q4_kx4<M: MulSum>(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let p = rows4(w, rb);
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut mins = [_mm256_setzero_ps(); 4];
        for (i, x) in a.blocks.chunks_exact(8).enumerate().take(rb / 144) {
            let xd = _mm256_loadu_ps(a.d.as_ptr().add(8 * i));
            let xs = _mm256_loadu_ps(a.sum.as_ptr().add(8 * i));
            let mut s8 = [_mm256_setzero_ps(); 4];
            for r in 0..4 {
                let b = p[r].add(i * 144);
                let (sc, m) = k4_scales(std::slice::from_raw_parts(b.add(4), 12));
                let d = _mm256_set1_ps(f16_at(b));
                s8[r] = _mm256_mul_ps(_mm256_mul_ps(d, u8x8_to_f32(&sc)), xd);
                let dmin = _mm256_set1_ps(f16_at(b.add(2)));
                let m8 = _mm256_mul_ps(_mm256_mul_ps(dmin, u8x8_to_f32(&m)), xd);
                mins[r] = _mm256_fmadd_ps(m8, xs, mins[r]);
            }
            for j in 0..4 {
                let (x0, x1) = (load_x(&x[2 * j]), load_x(&x[2 * j + 1]));
                for r in 0..4 {
                    let q = _mm256_loadu_si256(p[r].add(i * 144 + 16 + 32 * j) as *const __m256i);
                    let lo = _mm256_and_si256(q, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                    let d0 = _mm256_cvtepi32_ps(M::mul_sum(lo, x0));
                    let d1 = _mm256_cvtepi32_ps(M::mul_sum(hi, x1));
                    acc[r] = _mm256_fmadd_ps(d0, lane(s8[r], 2 * j as i32), acc[r]);
                    acc[r] = _mm256_fmadd_ps(d1, lane(s8[r], 2 * j as i32 + 1), acc[r]);
                }
            }
        }
        let dots = reduce4(acc);
        let mins = reduce4(mins);
        for r in 0..4 {
            out[r] = dots[r] - mins[r];
        }
    }
}

/// Q6_K, four rows against the same activations.
#[inline(always)]
unsafe fn q6_kx4<M: MulSum>(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(0x03);
        let m32 = _mm256_set1_epi8(32);
        let p = rows4(w, rb);
        let mut acc = [_mm256_setzero_ps(); 4];
        for (i, x) in a.blocks.chunks_exact(8).enumerate().take(rb / 210) {
            for n in 0..2 {
                // Plain arrays, not array::from_fn: a closure would not inherit this function's
                // target features and the loads would become calls.
                let xs = [
                    load_x(&x[4 * n]),
                    load_x(&x[4 * n + 1]),
                    load_x(&x[4 * n + 2]),
                    load_x(&x[4 * n + 3]),
                ];
                let xd = [
                    *a.d.get_unchecked(8 * i + 4 * n),
                    *a.d.get_unchecked(8 * i + 4 * n + 1),
                    *a.d.get_unchecked(8 * i + 4 * n + 2),
                    *a.d.get_unchecked(8 * i + 4 * n + 3),
                ];
                for r in 0..4 {
                    let b = p[r].add(i * 210);
                    let ql0 = _mm256_loadu_si256(b.add(64 * n) as *const __m256i);
                    let ql1 = _mm256_loadu_si256(b.add(64 * n + 32) as *const __m256i);
                    let qh = _mm256_loadu_si256(b.add(128 + 32 * n) as *const __m256i);
                    let sc = b.add(192 + 8 * n) as *const __m128i;
                    let s8 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(sc)));
                    let s8 = _mm256_mul_ps(s8, _mm256_set1_ps(f16_at(b.add(208))));
                    let quants = [
                        _mm256_or_si256(
                            _mm256_and_si256(ql0, m4),
                            _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(ql1, m4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4),
                        ),
                    ];
                    for (k, q) in quants.into_iter().enumerate() {
                        let idx = _mm256_setr_epi32(
                            2 * k as i32,
                            2 * k as i32,
                            2 * k as i32,
                            2 * k as i32,
                            2 * k as i32 + 1,
                            2 * k as i32 + 1,
                            2 * k as i32 + 1,
                            2 * k as i32 + 1,
                        );
                        let scale =
                            _mm256_mul_ps(_mm256_permutevar8x32_ps(s8, idx), _mm256_set1_ps(xd[k]));
                        let qs = _mm256_sub_epi8(q, m32);
                        let dot = M::mul_sum(_mm256_sign_epi8(qs, qs), _mm256_sign_epi8(xs[k], qs));
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r]);
                    }
                }
            }
        }
        *out = reduce4(acc);
    }
}

macro_rules! instantiate {
    ($module:ident, $features:literal, $mul:ty) => {
        mod $module {
            use super::*;
            #[target_feature(enable = $features)]
            pub unsafe fn q4_0(w: &[u8], a: ActRow) -> f32 {
                unsafe { super::q4_0::<$mul>(w, a) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q4_1(w: &[u8], a: ActRow) -> f32 {
                unsafe { super::q4_1::<$mul>(w, a) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q8_0(w: &[u8], a: ActRow) -> f32 {
                unsafe { super::q8_0::<$mul>(w, a) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q4_0x4(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
                unsafe { super::q4_0x4::<$mul>(w, rb, a, out) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q4_1x4(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
                unsafe { super::q4_1x4::<$mul>(w, rb, a, out) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q8_0x4(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
                unsafe { super::q8_0x4::<$mul>(w, rb, a, out) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q5_0(w: &[u8], a: ActRow) -> f32 {
                unsafe { super::q5_0::<$mul>(w, a) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q5_1(w: &[u8], a: ActRow) -> f32 {
                unsafe { super::q5_1::<$mul>(w, a) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q5_0x4(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
                unsafe { super::q5_0x4::<$mul>(w, rb, a, out) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q5_1x4(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
                unsafe { super::q5_1x4::<$mul>(w, rb, a, out) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn tile4(t: &DecodedTile, r: usize, a: ActRow, out: &mut [f32; 4]) {
                unsafe { super::tile4::<$mul>(t, r, a, out) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q4_kx4(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
                unsafe { super::q4_kx4::<$mul>(w, rb, a, out) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q6_kx4(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
                unsafe { super::q6_kx4::<$mul>(w, rb, a, out) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q4_k(w: &[u8], a: ActRow) -> f32 {
                unsafe { super::q4_k::<$mul>(w, a) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q5_k(w: &[u8], a: ActRow) -> f32 {
                unsafe { super::q5_k::<$mul>(w, a) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q6_k(w: &[u8], a: ActRow) -> f32 {
                unsafe { super::q6_k::<$mul>(w, a) }
            }
        }
    };
}

instantiate!(avx2, "avx2,fma,f16c", Maddubs);
instantiate!(vnni, "avx2,fma,f16c,avx512f,avx512vl,avx512vnni", Dpbusd);
instantiate!(avxvnni, "avx2,fma,f16c,avxvnni", DpbusdVex);
