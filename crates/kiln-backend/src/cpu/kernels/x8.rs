//! Eight-row interleaved layouts, made at load for kernel sets whose SIMD lanes map to rows.
//!
//! A matrix becomes groups of 8 consecutive rows (the last group padded with zero rows).
//! Inside a group, block by block, the 8 rows' scales sit side by side (one 16-byte load
//! gives all 8) and their quants are interleaved in 4-byte chunks: a 32-byte vector holds
//! the same 4 positions of 8 rows, so one u8 x i8 dot-product instruction against a
//! broadcast of 4 activation bytes advances 8 rows at once, with no horizontal sums, and
//! the group is read as one contiguous stream.
//!
//! Per 32-value block (legacy formats) or 256-value super-block (K-quants), 8 rows:
//! - Q4_0 (144 B): d[8] f16, then chunks c = 0..4 of 8 x qs[4c..4c+4] (low nibble: value
//!   4c+k, high nibble: value 16+4c+k).
//! - Q4_1 (160 B): d[8], m[8], then the Q4_0 chunks.
//! - Q5_0 (176 B): d[8], then h: 8 x 4 bytes whose byte k holds in bit c the fifth bit of
//!   value 4c+k and in bit 4+c that of value 16+4c+k, then the Q4_0 chunks.
//! - Q5_1 (192 B): d[8], m[8], h, then the Q4_0 chunks.
//! - Q8_0 (272 B): d[8], then chunks c = 0..8 of 8 x (q[4c..4c+4] as u8 ^ 0x80), so the
//!   quants are unsigned with value d * (u - 128).
//! - Q4_K (1184 B): d[8], dmin[8] f16, sc[j][8] and m[j][8] u8 for the 8 sub-blocks
//!   (decoded from the 12-byte packing), then for each qs pair p = 0..4 chunks c = 0..8 of
//!   8 x qs[32p+4c..32p+4c+4] (low nibble: sub-block 2p, high nibble: sub-block 2p+1).
//! - Q6_K (1680 B): d[8] f16, then per 32-value block b = 0..8: ql chunks c = 0..4 of 8 x 4
//!   bytes (low nibble: low 4 bits of value 4c+k, high nibble: of value 16+4c+k), two
//!   high-bit vectors h[e] of 8 x 4 bytes (bits 0-1, 2-3, 4-5, 6-7 of byte k: the top 2
//!   bits of values 8e+k, 16+8e+k, 8e+4+k, 20+8e+k), and sc[g][8] i8 for the block's two
//!   16-value groups. Quants are unsigned 0..63 with value d * sc * (q - 32).

use kiln_quant::GgmlType;

/// Rows per group.
pub const ROWS: usize = 8;

/// How far ahead of the group being computed the weights are prefetched, in bytes
/// (8 KiB; `KILN_X8_PREFETCH` in a `dev-switches` build sets it, 0 leaving it to the
/// hardware prefetcher). Measured on a 2-core Xeon: +25-30% decode over no software prefetch.
pub fn prefetch_distance() -> usize {
    static PF: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PF.get_or_init(|| crate::options::dev_parsed("KILN_X8_PREFETCH").unwrap_or(8192))
}

/// Whether the kernels of `ty` prefetch their own weights (every x86 one; elsewhere the
/// caller does).
pub fn prefetches_itself(ty: GgmlType) -> bool {
    cfg!(target_arch = "x86_64") && supports(ty)
}

/// Whether a format has an interleaved layout.
pub fn supports(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q4_K
            | GgmlType::Q6_K
    )
}

/// Bytes of one block of 8 rows, and values per block.
fn block(ty: GgmlType) -> (usize, usize) {
    match ty {
        GgmlType::Q4_0 => (144, 32),
        GgmlType::Q4_1 => (160, 32),
        GgmlType::Q5_0 => (176, 32),
        GgmlType::Q5_1 => (192, 32),
        GgmlType::Q8_0 => (272, 32),
        GgmlType::Q4_K => (1184, 256),
        GgmlType::Q6_K => (1680, 256),
        _ => unreachable!("x8::supports is checked by callers"),
    }
}

/// Bytes of one group of 8 rows of `cols` values (a multiple of the block size).
pub fn group_bytes(ty: GgmlType, cols: usize) -> usize {
    let (bytes, values) = block(ty);
    cols / values * bytes
}

/// Bytes of a whole matrix of `rows` rows in groups.
pub fn matrix_bytes(ty: GgmlType, rows: usize, cols: usize) -> usize {
    rows.div_ceil(ROWS) * group_bytes(ty, cols)
}

fn put_f16(dst: &mut [u8], at: usize, src: &[u8]) {
    dst[at..at + 2].copy_from_slice(&src[..2]);
}

/// Up to 8 GGML rows (`rows[r]`, each a whole row of `cols` values) -> one group; rows past
/// `rows.len()` are zero.
pub fn pack_group(ty: GgmlType, rows: &[&[u8]], cols: usize, dst: &mut [u8]) {
    assert!(rows.len() <= ROWS && dst.len() == group_bytes(ty, cols));
    dst.fill(0);
    let (gb, values) = block(ty);
    let bs = ty.type_size();
    for i in 0..cols / values {
        let out = &mut dst[i * gb..(i + 1) * gb];
        for (r, row) in rows.iter().enumerate() {
            let b = &row[i * bs..(i + 1) * bs];
            match ty {
                GgmlType::Q4_0 | GgmlType::Q4_1 => {
                    let head = if ty == GgmlType::Q4_0 { 2 } else { 4 };
                    put_f16(out, 2 * r, &b[0..]);
                    if head == 4 {
                        put_f16(out, 16 + 2 * r, &b[2..]);
                    }
                    let q0 = 8 * head;
                    for c in 0..4 {
                        let at = q0 + 32 * c + 4 * r;
                        out[at..at + 4].copy_from_slice(&b[head + 4 * c..head + 4 * c + 4]);
                    }
                }
                GgmlType::Q5_0 | GgmlType::Q5_1 => {
                    let head = if ty == GgmlType::Q5_0 { 2 } else { 4 };
                    put_f16(out, 2 * r, b);
                    if head == 4 {
                        put_f16(out, 16 + 2 * r, &b[2..]);
                    }
                    let qh = u32::from_le_bytes([b[head], b[head + 1], b[head + 2], b[head + 3]]);
                    let h0 = 8 * head;
                    for k in 0..4 {
                        let mut byte = 0u8;
                        for c in 0..4 {
                            byte |= ((qh >> (4 * c + k) & 1) as u8) << c;
                            byte |= ((qh >> (16 + 4 * c + k) & 1) as u8) << (4 + c);
                        }
                        out[h0 + 4 * r + k] = byte;
                    }
                    for c in 0..4 {
                        let at = h0 + 32 + 32 * c + 4 * r;
                        let src = head + 4 + 4 * c;
                        out[at..at + 4].copy_from_slice(&b[src..src + 4]);
                    }
                }
                GgmlType::Q8_0 => {
                    put_f16(out, 2 * r, b);
                    for c in 0..8 {
                        for k in 0..4 {
                            out[16 + 32 * c + 4 * r + k] = b[2 + 4 * c + k] ^ 0x80;
                        }
                    }
                }
                GgmlType::Q4_K => {
                    put_f16(out, 2 * r, b);
                    put_f16(out, 16 + 2 * r, &b[2..]);
                    for j in 0..8 {
                        let (sc, m) = super::scalar::scale_min_k4(j, &b[4..16]);
                        out[32 + 8 * j + r] = sc;
                        out[96 + 8 * j + r] = m;
                    }
                    for p in 0..4 {
                        for c in 0..8 {
                            let at = 160 + 256 * p + 32 * c + 4 * r;
                            let src = 16 + 32 * p + 4 * c;
                            out[at..at + 4].copy_from_slice(&b[src..src + 4]);
                        }
                    }
                }
                GgmlType::Q6_K => pack_q6_k(b, r, out),
                _ => unreachable!("x8::supports is checked by callers"),
            }
        }
    }
}

/// The 256 6-bit quants (0..63) of a GGML Q6_K block.
fn q6_k_values(b: &[u8]) -> [u8; 256] {
    let (ql, qh) = (&b[0..128], &b[128..192]);
    let mut v = [0u8; 256];
    for n in 0..2 {
        for l in 0..32 {
            let (a, c, h) = (ql[64 * n + l], ql[64 * n + l + 32], qh[32 * n + l]);
            v[128 * n + l] = (a & 15) | (h & 3) << 4;
            v[128 * n + l + 32] = (c & 15) | (h >> 2 & 3) << 4;
            v[128 * n + l + 64] = (a >> 4) | (h >> 4 & 3) << 4;
            v[128 * n + l + 96] = (c >> 4) | (h >> 6 & 3) << 4;
        }
    }
    v
}

/// Offsets inside a Q6_K x8 super-block: block b's ql chunks, high-bit vectors, scales.
const fn q6_at(b: usize) -> (usize, usize, usize) {
    let base = 16 + 208 * b;
    (base, base + 128, base + 192)
}

fn pack_q6_k(b: &[u8], r: usize, out: &mut [u8]) {
    put_f16(out, 2 * r, &b[208..]);
    let v = q6_k_values(b);
    for blk in 0..8 {
        let v = &v[32 * blk..32 * blk + 32];
        let (ql, qh, sc) = q6_at(blk);
        for c in 0..4 {
            for k in 0..4 {
                out[ql + 32 * c + 4 * r + k] = (v[4 * c + k] & 15) | (v[16 + 4 * c + k] & 15) << 4;
            }
        }
        for e in 0..2 {
            for k in 0..4 {
                let hi = |i: usize| v[i] >> 4;
                out[qh + 32 * e + 4 * r + k] = hi(8 * e + k)
                    | hi(16 + 8 * e + k) << 2
                    | hi(8 * e + 4 + k) << 4
                    | hi(20 + 8 * e + k) << 6;
            }
        }
        out[sc + r] = b[192 + 2 * blk];
        out[sc + 8 + r] = b[192 + 2 * blk + 1];
    }
}

/// Row `r` (0..8) of a group -> its GGML row bytes (`dst`: a whole row).
pub fn unpack_row(ty: GgmlType, group: &[u8], cols: usize, r: usize, dst: &mut [u8]) {
    let (gb, values) = block(ty);
    let bs = ty.type_size();
    for i in 0..cols / values {
        let g = &group[i * gb..(i + 1) * gb];
        let b = &mut dst[i * bs..(i + 1) * bs];
        match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 => {
                let head = if ty == GgmlType::Q4_0 { 2 } else { 4 };
                b[0..2].copy_from_slice(&g[2 * r..2 * r + 2]);
                if head == 4 {
                    b[2..4].copy_from_slice(&g[16 + 2 * r..16 + 2 * r + 2]);
                }
                for c in 0..4 {
                    let at = 8 * head + 32 * c + 4 * r;
                    b[head + 4 * c..head + 4 * c + 4].copy_from_slice(&g[at..at + 4]);
                }
            }
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                let head = if ty == GgmlType::Q5_0 { 2 } else { 4 };
                b[0..2].copy_from_slice(&g[2 * r..2 * r + 2]);
                if head == 4 {
                    b[2..4].copy_from_slice(&g[16 + 2 * r..16 + 2 * r + 2]);
                }
                let h0 = 8 * head;
                let mut qh = 0u32;
                for k in 0..4 {
                    let byte = g[h0 + 4 * r + k] as u32;
                    for c in 0..4 {
                        qh |= (byte >> c & 1) << (4 * c + k);
                        qh |= (byte >> (4 + c) & 1) << (16 + 4 * c + k);
                    }
                }
                b[head..head + 4].copy_from_slice(&qh.to_le_bytes());
                for c in 0..4 {
                    let at = h0 + 32 + 32 * c + 4 * r;
                    let dst = head + 4 + 4 * c;
                    b[dst..dst + 4].copy_from_slice(&g[at..at + 4]);
                }
            }
            GgmlType::Q8_0 => {
                b[0..2].copy_from_slice(&g[2 * r..2 * r + 2]);
                for c in 0..8 {
                    for k in 0..4 {
                        b[2 + 4 * c + k] = g[16 + 32 * c + 4 * r + k] ^ 0x80;
                    }
                }
            }
            GgmlType::Q4_K => {
                b[0..2].copy_from_slice(&g[2 * r..2 * r + 2]);
                b[2..4].copy_from_slice(&g[16 + 2 * r..16 + 2 * r + 2]);
                let sc = |j: usize| g[32 + 8 * j + r];
                let m = |j: usize| g[96 + 8 * j + r];
                // The inverse of scale_min_k4's 6-bit packing.
                for j in 0..4 {
                    b[4 + j] = sc(j) | (sc(j + 4) >> 4) << 6;
                    b[8 + j] = m(j) | (m(j + 4) >> 4) << 6;
                    b[12 + j] = (sc(j + 4) & 15) | (m(j + 4) & 15) << 4;
                }
                for p in 0..4 {
                    for c in 0..8 {
                        let at = 160 + 256 * p + 32 * c + 4 * r;
                        let d = 16 + 32 * p + 4 * c;
                        b[d..d + 4].copy_from_slice(&g[at..at + 4]);
                    }
                }
            }
            GgmlType::Q6_K => unpack_q6_k(g, r, b),
            _ => unreachable!("x8::supports is checked by callers"),
        }
    }
}

fn unpack_q6_k(g: &[u8], r: usize, b: &mut [u8]) {
    b[208..210].copy_from_slice(&g[2 * r..2 * r + 2]);
    let mut v = [0u8; 256];
    for blk in 0..8 {
        let (ql, qh, sc) = q6_at(blk);
        let v = &mut v[32 * blk..32 * blk + 32];
        for c in 0..4 {
            for k in 0..4 {
                let q = g[ql + 32 * c + 4 * r + k];
                v[4 * c + k] = q & 15;
                v[16 + 4 * c + k] = q >> 4;
            }
        }
        for e in 0..2 {
            for k in 0..4 {
                let h = g[qh + 32 * e + 4 * r + k];
                v[8 * e + k] |= (h & 3) << 4;
                v[16 + 8 * e + k] |= (h >> 2 & 3) << 4;
                v[8 * e + 4 + k] |= (h >> 4 & 3) << 4;
                v[20 + 8 * e + k] |= (h >> 6 & 3) << 4;
            }
        }
        b[192 + 2 * blk] = g[sc + r];
        b[192 + 2 * blk + 1] = g[sc + 8 + r];
    }
    let (ql, qh) = b[..192].split_at_mut(128);
    for n in 0..2 {
        for l in 0..32 {
            let q = |i: usize| v[128 * n + l + 32 * i];
            ql[64 * n + l] = (q(0) & 15) | (q(2) & 15) << 4;
            ql[64 * n + l + 32] = (q(1) & 15) | (q(3) & 15) << 4;
            qh[32 * n + l] = q(0) >> 4 | (q(1) >> 4) << 2 | (q(2) >> 4) << 4 | (q(3) >> 4) << 6;
        }
    }
}

/// The most activation rows a set's call takes.
pub const MAX_TOKENS: usize = 8;

/// Rows of one group against activation rows: `out[t][r] = row r . acts[t]`. `cols` is the
/// row length; `acts.len() == out.len()`. `group` starts with the group and may run on (to
/// the matrix's end): kernels that prefetch read ahead only inside it. A set's `pairs`
/// kernels take two adjacent groups instead: `out[2t + h][r]` = row r of group h . `acts[t]`.
pub type GemmFn =
    unsafe fn(group: &[u8], cols: usize, acts: &[super::ActRow], out: &mut [[f32; ROWS]]);

/// Panics unless `group` holds `groups` groups of `cols / per` blocks of `bytes`, `out` a
/// row of each per token, and every activation row covers `cols` (what the SIMD entry
/// points check before raw-pointer loops).
#[inline(always)]
pub fn check_args(
    group: &[u8],
    cols: usize,
    a: &[super::ActRow],
    out: &[[f32; ROWS]],
    groups: usize,
    per: usize,
    bytes: usize,
) {
    assert!(group.len() >= groups * (cols / per * bytes) && groups * a.len() == out.len());
    for x in a {
        assert!(x.blocks.len() >= cols / 32 && x.d.len() >= cols / 32);
        assert!(x.ds.len() >= cols / 32 && x.h32.len() >= cols / 16);
    }
}

/// A SIMD entry point (a [`GemmFn`]) over a body generic over the token count T: lengths
/// checked, tokens in calls of at most `$max_t`. No closures inside: they would not inherit
/// the target features. `$f::<$g.., T>` is the body.
macro_rules! gemm_entry {
    ($features:literal, $max_t:expr, $name:ident, $per:expr, $bytes:expr, $f:ident $(, $g:tt)*) => {
        #[target_feature(enable = $features)]
        pub unsafe fn $name(
            group: &[u8],
            cols: usize,
            a: &[$crate::cpu::kernels::ActRow],
            out: &mut [[f32; $crate::cpu::kernels::x8::ROWS]],
        ) {
            $crate::cpu::kernels::x8::check_args(group, cols, a, out, 1, $per, $bytes);
            let (g, n) = (group.as_ptr(), cols / $per);
            // The first pass over the group may prefetch what follows it in `group`.
            let mut lim = group.as_ptr_range().end;
            let mut t = 0;
            while t < a.len() {
                let k = (a.len() - t).min($max_t);
                let (x, o) = (&a[t..t + k], &mut out[t..t + k]);
                // SAFETY: lengths checked above; the features were detected.
                unsafe {
                    match k {
                        1 => $f::<$($g,)* 1>(g, n, x, o, lim),
                        2 => $f::<$($g,)* 2>(g, n, x, o, lim),
                        3 => $f::<$($g,)* 3>(g, n, x, o, lim),
                        _ => $f::<$($g,)* 4>(g, n, x, o, lim),
                    }
                }
                lim = g;
                t += k;
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use gemm_entry;

/// The interleaved kernels of a kernel set.
pub struct X8Kernels {
    /// Activation rows one call takes at most (at most [`MAX_TOKENS`]).
    pub max_tokens: usize,
    /// The same products over two adjacent groups a call, where wider vectors make that
    /// faster (see [`GemmFn`]).
    pub pairs: Option<&'static X8Kernels>,
    pub q4_0: GemmFn,
    pub q4_1: GemmFn,
    pub q5_0: GemmFn,
    pub q5_1: GemmFn,
    pub q8_0: GemmFn,
    pub q4_k: GemmFn,
    pub q6_k: GemmFn,
}

impl X8Kernels {
    pub fn for_type(&self, ty: GgmlType) -> Option<GemmFn> {
        use GgmlType::*;
        match ty {
            Q4_0 => Some(self.q4_0),
            Q4_1 => Some(self.q4_1),
            Q5_0 => Some(self.q5_0),
            Q5_1 => Some(self.q5_1),
            Q8_0 => Some(self.q8_0),
            Q4_K => Some(self.q4_k),
            Q6_K => Some(self.q6_k),
            F32 | F16 | BF16 | Q8_1 | Q2_K | Q3_K | Q5_K | Q8_K => None,
        }
    }
}

/// Dequantizes row `r` (0..8) of a group into `out` (cols values), a block at a time (no
/// allocation): the same values as the GGML row's dequantization.
pub fn dequant_row(
    ty: GgmlType,
    group: &[u8],
    cols: usize,
    r: usize,
    out: &mut [f32],
) -> Result<(), kiln_quant::QuantError> {
    let (gb, values) = block(ty);
    let mut row = [0u8; 210];
    let bs = ty.type_size();
    for i in 0..cols / values {
        unpack_row(ty, &group[i * gb..(i + 1) * gb], values, r, &mut row[..bs]);
        kiln_quant::dequantize_row(ty, &row[..bs], &mut out[i * values..(i + 1) * values])?;
    }
    Ok(())
}
