//! KV caches stored as f16 or Q8_0 (`--kv-type`): each head row of keys and values is one
//! row of the block format, written by `kv_store`; attention widens the positions in use of
//! one layer into an f32 scratch (allocated with the cache) and runs the f32 kernel. Memory
//! held: 1/2 (f16) or 34/128 (Q8_0) of f32, plus one layer in f32.

use std::sync::{Mutex, MutexGuard};

use kiln_quant::{dequantize_row, quantize_row, GgmlType};

use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::CpuTensor;
use crate::KvType;

pub struct PackedKv {
    ty: KvType,
    n_ctx: usize,
    kv_heads: usize,
    head_dim: usize,
    /// Bytes of one head row.
    row: usize,
    /// Per layer: (kv_heads, n_ctx) rows.
    k: Vec<Vec<u8>>,
    v: Vec<Vec<u8>>,
    /// One layer's keys and values as f32, (kv_heads, n_ctx, hd).
    scratch: Mutex<(Vec<f32>, Vec<f32>)>,
}

impl PackedKv {
    /// `ty` was checked against `head_dim` (`KvType::check`).
    pub fn new(
        ty: KvType,
        n_layers: usize,
        n_ctx: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        let row = ty
            .ggml()
            .row_bytes(head_dim)
            .expect("checked by KvType::check");
        let layer = kv_heads * n_ctx * row;
        PackedKv {
            ty,
            n_ctx,
            kv_heads,
            head_dim,
            row,
            k: (0..n_layers).map(|_| vec![0u8; layer]).collect(),
            v: (0..n_layers).map(|_| vec![0u8; layer]).collect(),
            scratch: Mutex::new((
                vec![0.0; kv_heads * n_ctx * head_dim],
                vec![0.0; kv_heads * n_ctx * head_dim],
            )),
        }
    }

    pub fn bytes(&self) -> usize {
        let packed: usize = self.k.iter().chain(&self.v).map(Vec::len).sum();
        packed + 2 * 4 * self.kv_heads * self.n_ctx * self.head_dim
    }

    /// k, v (n x kv_dim) at positions pos0..pos0+n of `layer`.
    pub fn store(&mut self, layer: usize, k: &CpuTensor, v: &CpuTensor, pos0: usize, n: usize) {
        let (hd, ty) = (self.head_dim, self.ty.ggml());
        for t in 0..n {
            for h in 0..self.kv_heads {
                let dst = (h * self.n_ctx + pos0 + t) * self.row;
                let src = t * k.cols + h * hd;
                narrow_row(
                    ty,
                    &k.data[src..src + hd],
                    &mut self.k[layer][dst..dst + self.row],
                );
                narrow_row(
                    ty,
                    &v.data[src..src + hd],
                    &mut self.v[layer][dst..dst + self.row],
                );
            }
        }
    }

    /// `layer`'s rows `from..from + len` of every head moved to `0..len` (a window cache
    /// dropping the positions its window has passed).
    pub fn move_front(&mut self, layer: usize, from: usize, len: usize) {
        let r = self.row;
        for plane in [&mut self.k[layer], &mut self.v[layer]] {
            for h in 0..self.kv_heads {
                let at = h * self.n_ctx * r;
                plane.copy_within(at + from * r..at + (from + len) * r, at);
            }
        }
    }

    /// Copies positions `0..n` of every layer from `src`, a cache of the same shape and type.
    pub fn copy_from(&mut self, src: &PackedKv, n: usize) {
        assert!(
            (
                self.ty,
                self.n_ctx,
                self.kv_heads,
                self.head_dim,
                self.k.len()
            ) == (src.ty, src.n_ctx, src.kv_heads, src.head_dim, src.k.len()),
            "kv_copy between packed caches of different shapes or types"
        );
        let n = n.min(self.n_ctx);
        for (dst, src) in self
            .k
            .iter_mut()
            .zip(&src.k)
            .chain(self.v.iter_mut().zip(&src.v))
        {
            for h in 0..self.kv_heads {
                let r = h * self.n_ctx * self.row..(h * self.n_ctx + n) * self.row;
                dst[r.clone()].copy_from_slice(&src[r]);
            }
        }
    }

    /// `layer`'s keys and values as f16 bits, (kv_heads, n_ctx, hd), for kernels that read
    /// them as they are (an f16 cache whose buffers are 2-byte aligned, as allocations are).
    pub fn f16_layer(&self, layer: usize) -> Option<(&[u16], &[u16])> {
        if self.ty != KvType::F16 {
            return None;
        }
        // SAFETY: every bit pattern is a u16; align_to puts only aligned values in the middle.
        let (kp, k, ks) = unsafe { self.k[layer].align_to::<u16>() };
        let (vp, v, vs) = unsafe { self.v[layer].align_to::<u16>() };
        (kp.is_empty() && ks.is_empty() && vp.is_empty() && vs.is_empty()).then_some((k, v))
    }

    /// `layer`'s first `len` positions of every head, as f32 in the scratch, the rows split
    /// over the pool's threads.
    pub fn widened(
        &self,
        pool: &Pool,
        layer: usize,
        len: usize,
    ) -> MutexGuard<'_, (Vec<f32>, Vec<f32>)> {
        let mut g = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let (hd, ty) = (self.head_dim, self.ty.ggml());
        let (ks, vs) = &mut *g;
        let (kd, vd) = (SharedMut(ks.as_mut_ptr()), SharedMut(vs.as_mut_ptr()));
        let (k, v) = (&self.k[layer], &self.v[layer]);
        pool.run(self.kv_heads * len, |i0, i1| {
            // The whole wrappers, not their pointer fields (closures capture fields).
            let (kd, vd): (SharedMut, SharedMut) = (kd, vd);
            for i in i0..i1 {
                let (h, p) = (i / len, i % len);
                let src = (h * self.n_ctx + p) * self.row;
                let dst = (h * self.n_ctx + p) * hd;
                // SAFETY: row (h, p) of the scratch is written by this worker alone, and
                // dst + hd <= kv_heads * n_ctx * hd, the scratch's length.
                let (ko, vo) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(kd.0.add(dst), hd),
                        std::slice::from_raw_parts_mut(vd.0.add(dst), hd),
                    )
                };
                widen_row(ty, &k[src..src + self.row], ko);
                widen_row(ty, &v[src..src + self.row], vo);
            }
        });
        g
    }
}

/// One stored row back to f32: F16 with the CPU's conversion instructions where it has them,
/// Q8_0 as d * q per block (vectorizes); the scalar reference decodes anything else.
fn widen_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    match ty {
        GgmlType::F16 => {
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("f16c") && std::is_x86_feature_detected!("avx") {
                // SAFETY: F16C and AVX were detected; lengths match (2 bytes per value).
                return unsafe { widen_f16_f16c(src, dst) };
            }
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::Q8_0 => {
            for (o, b) in dst.chunks_exact_mut(32).zip(src.chunks_exact(34)) {
                let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
                for (x, &q) in o.iter_mut().zip(&b[2..]) {
                    *x = q as i8 as f32 * d;
                }
            }
        }
        other => dequantize_row(other, src, dst).expect("row size checked at creation"),
    }
}

/// One row of f32 into the stored format (`dst` its row size): F16 with the CPU's conversion
/// instructions where it has them (the bits of the reference's round to nearest even), the
/// reference quantizer otherwise.
fn narrow_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if ty == GgmlType::F16
        && dst.len() == 2 * src.len()
        && std::is_x86_feature_detected!("f16c")
        && std::is_x86_feature_detected!("avx")
    {
        // SAFETY: F16C and AVX were detected; dst holds 2 bytes per value.
        return unsafe { narrow_f16_f16c(src, dst) };
    }
    // Lengths follow from the checked row size.
    quantize_row(ty, src, dst).expect("row size checked at creation");
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn narrow_f16_f16c(src: &[f32], dst: &mut [u8]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len() / 2);
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
        _mm_storeu_si128(dst.as_mut_ptr().add(2 * i) as *mut __m128i, h);
        i += 8;
    }
    for j in i..n {
        dst[2 * j..2 * j + 2].copy_from_slice(&half::f16::from_f32(src[j]).to_le_bytes());
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn widen_f16_f16c(src: &[u8], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = dst.len().min(src.len() / 2);
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(src.as_ptr().add(2 * i) as *const __m128i);
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    for j in i..n {
        dst[j] = half::f16::from_le_bytes([src[2 * j], src[2 * j + 1]]).to_f32();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widening_equals_the_reference_decoder() {
        let x: Vec<f32> = (0..128)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        for ty in [GgmlType::F16, GgmlType::Q8_0] {
            let mut packed = vec![0u8; ty.row_bytes(128).unwrap()];
            quantize_row(ty, &x, &mut packed).unwrap();
            let (mut want, mut got) = (vec![0f32; 128], vec![0f32; 128]);
            dequantize_row(ty, &packed, &mut want).unwrap();
            widen_row(ty, &packed, &mut got);
            assert_eq!(got, want, "{}", ty.name());
        }
    }

    /// Storing a row gives the reference quantizer's bytes: ties, subnormals, overflow to
    /// infinity and a tail past the vector width.
    #[test]
    fn narrowing_equals_the_reference_quantizer() {
        let mut x: Vec<f32> = (0..128)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        // Halfway between two f16 values (ties to even), f16 subnormals, past f16's range.
        x[..6].copy_from_slice(&[
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            3.0e-6,
            -5.0e-8,
            7.0e4,
            -1.0e9,
        ]);
        for n in [128, 40, 5] {
            for ty in [GgmlType::F16, GgmlType::Q8_0] {
                if n % ty.block_size() != 0 {
                    continue;
                }
                let bytes = ty.row_bytes(n).unwrap();
                let (mut want, mut got) = (vec![0u8; bytes], vec![0u8; bytes]);
                quantize_row(ty, &x[..n], &mut want).unwrap();
                narrow_row(ty, &x[..n], &mut got);
                assert_eq!(got, want, "{} {n}", ty.name());
            }
        }
    }

    /// Attention over an f16 cache read as it is (the tiled kernel widening each block as it
    /// loads it) gives the bits of the same kernel over the widened f32 copy, decode and
    /// prompt tiles, head sizes 64 and 128, several sequences in one call.
    #[test]
    fn f16_read_directly_equals_widened() {
        use crate::cpu::ops::attention::{attention_segs, attention_segs_f16, Seg, SegOf};
        use crate::AttnShape;
        let pool = Pool::new(2);
        let rnd = |i: usize| (((i * 7919 + 13) % 1009) as f32 - 504.0) / 300.0;
        for hd in [64usize, 128] {
            let (kvh, heads, n_ctx) = (2, 4, 96);
            let mut kv = PackedKv::new(KvType::F16, 1, n_ctx, kvh, hd);
            let kd = kvh * hd;
            // Positions 0..70 stored.
            let n = 70;
            let k = CpuTensor {
                data: (0..n * kd).map(rnd).collect(),
                cols: kd,
            };
            let v = CpuTensor {
                data: (0..n * kd).map(|i| rnd(i + 5)).collect(),
                cols: kd,
            };
            kv.store(0, &k, &v, 0, n);
            // Two sequences over the same cache: one decoding at 69, one a 9-token chunk
            // at 61..70.
            let shapes = [(69usize, 1usize), (61, 9)];
            let rows: usize = shapes.iter().map(|s| s.1).sum();
            let q = CpuTensor {
                data: (0..rows * heads * hd).map(|i| rnd(i + 11)).collect(),
                cols: heads * hd,
            };
            let shape = |(pos0, n_tokens): (usize, usize)| AttnShape {
                n_heads: heads,
                n_kv_heads: kvh,
                head_dim: hd,
                pos0,
                n_tokens,
                window: 0,
            };
            let Some((k16, v16)) = kv.f16_layer(0) else {
                panic!("f16 cache not 2-byte aligned")
            };
            let mut got = CpuTensor {
                data: vec![0.0; rows * heads * hd],
                cols: heads * hd,
            };
            let segs16 = [
                SegOf {
                    k: k16,
                    v: v16,
                    n_ctx,
                    s: shape(shapes[0]),
                    row0: 0,
                },
                SegOf {
                    k: k16,
                    v: v16,
                    n_ctx,
                    s: shape(shapes[1]),
                    row0: 1,
                },
            ];
            let ran = attention_segs_f16(&pool, &q, &segs16, &mut got);
            #[cfg(target_arch = "x86_64")]
            assert_eq!(
                ran,
                crate::cpu::ops::attention::simd_ok().0 && std::is_x86_feature_detected!("f16c"),
                "the f16 path runs wherever the tiled kernel can"
            );
            if !ran {
                // Elsewhere (ARM) f16 caches are widened: nothing here to compare.
                return;
            }
            let g = kv.widened(&pool, 0, n);
            let (kw, vw) = (&g.0, &g.1);
            let mut want = CpuTensor {
                data: vec![0.0; rows * heads * hd],
                cols: heads * hd,
            };
            let segs: [Seg<'_>; 2] = [
                SegOf {
                    k: kw,
                    v: vw,
                    n_ctx,
                    s: shape(shapes[0]),
                    row0: 0,
                },
                SegOf {
                    k: kw,
                    v: vw,
                    n_ctx,
                    s: shape(shapes[1]),
                    row0: 1,
                },
            ];
            attention_segs(&pool, &q, &segs, &mut want);
            let bits = |t: &CpuTensor| t.data.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "head size {hd}");
        }
    }
}
