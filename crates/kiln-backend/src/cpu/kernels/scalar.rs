//! The scalar reference of the integer kernels: every SIMD kernel is tested against these.
//! Each computes sum over blocks of (weight block) . (activation block) with exact integer
//! inner sums and f32 scaling.

use super::ActRow;

#[inline]
pub fn f16(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Q4_0, packed: d[nb] f16, then qs[nb][16]: value j = (qs[j] & 15) - 8, value j+16 =
/// (qs[j] >> 4) - 8.
pub unsafe fn dot_q4_0(w: &[u8], a: ActRow) -> f32 {
    let nb = w.len() / 18;
    let (d, qs) = w.split_at(2 * nb);
    let mut sum = 0f32;
    for (i, (q, x)) in qs.chunks_exact(16).zip(a.blocks).enumerate() {
        let mut isum = 0i32;
        for j in 0..16 {
            isum += (q[j] & 15) as i32 * x.qs[j] as i32 + (q[j] >> 4) as i32 * x.qs[j + 16] as i32;
        }
        sum += f16(d, 2 * i) * x.d * (isum - 8 * x.sum()) as f32;
    }
    sum
}

/// Q4_1, packed: d[nb] f16, m[nb] f16, then qs[nb][16]: value = d * q + m.
pub unsafe fn dot_q4_1(w: &[u8], a: ActRow) -> f32 {
    let nb = w.len() / 20;
    let (dm, qs) = w.split_at(4 * nb);
    let mut sum = 0f32;
    for (i, (q, x)) in qs.chunks_exact(16).zip(a.blocks).enumerate() {
        let mut isum = 0i32;
        for j in 0..16 {
            isum += (q[j] & 15) as i32 * x.qs[j] as i32 + (q[j] >> 4) as i32 * x.qs[j + 16] as i32;
        }
        sum += f16(dm, 2 * i) * x.d * isum as f32 + f16(dm, 2 * (nb + i)) * x.d * x.sum() as f32;
    }
    sum
}

/// Q8_0, packed: d[nb] f16, then qs[nb][32] i8.
pub unsafe fn dot_q8_0(w: &[u8], a: ActRow) -> f32 {
    let nb = w.len() / 34;
    let (d, qs) = w.split_at(2 * nb);
    let mut sum = 0f32;
    for (i, (q, x)) in qs.chunks_exact(32).zip(a.blocks).enumerate() {
        let isum: i32 = (0..32).map(|j| q[j] as i8 as i32 * x.qs[j] as i32).sum();
        sum += f16(d, 2 * i) * x.d * isum as f32;
    }
    sum
}

/// Q5_0, packed: d[nb] f16, then (qh u32, qs[16])[nb]: value j = (nibble | bit j of qh
/// << 4) - 16.
pub unsafe fn dot_q5_0(w: &[u8], a: ActRow) -> f32 {
    let nb = w.len() / 22;
    let (d, body) = w.split_at(2 * nb);
    let mut sum = 0f32;
    for (i, (b, x)) in body.chunks_exact(20).zip(a.blocks).enumerate() {
        sum += f16(d, 2 * i) * x.d * (q5_isum(b, x) - 16 * x.sum()) as f32;
    }
    sum
}

/// Q5_1, packed: d[nb] f16, m[nb] f16, then (qh u32, qs[16])[nb]: value = d * q + m.
pub unsafe fn dot_q5_1(w: &[u8], a: ActRow) -> f32 {
    let nb = w.len() / 24;
    let (dm, body) = w.split_at(4 * nb);
    let mut sum = 0f32;
    for (i, (b, x)) in body.chunks_exact(20).zip(a.blocks).enumerate() {
        sum += f16(dm, 2 * i) * x.d * q5_isum(b, x) as f32
            + f16(dm, 2 * (nb + i)) * x.d * x.sum() as f32;
    }
    sum
}

/// sum of the 5-bit unsigned quants of one Q5 block (qh u32, qs[16]) times the activations.
fn q5_isum(b: &[u8], x: &super::BlockQ8) -> i32 {
    let qh = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let mut isum = 0i32;
    for j in 0..16 {
        let lo = (b[4 + j] & 15) as i32 | (((qh >> j) & 1) << 4) as i32;
        let hi = (b[4 + j] >> 4) as i32 | (((qh >> (j + 16)) & 1) << 4) as i32;
        isum += lo * x.qs[j] as i32 + hi * x.qs[j + 16] as i32;
    }
    isum
}

pub const Q4_0: u8 = 0;
pub const Q4_1: u8 = 1;
pub const Q8_0: u8 = 2;
pub const Q5_0: u8 = 3;
pub const Q5_1: u8 = 4;

/// Four rows, one at a time (the reference for the four-row SIMD kernels).
pub unsafe fn dot4<const F: u8>(w: &[u8], row_bytes: usize, a: ActRow, out: &mut [f32; 4]) {
    for (r, o) in out.iter_mut().enumerate() {
        let row = &w[r * row_bytes..(r + 1) * row_bytes];
        *o = unsafe {
            match F {
                Q4_0 => dot_q4_0(row, a),
                Q4_1 => dot_q4_1(row, a),
                Q5_0 => dot_q5_0(row, a),
                Q5_1 => dot_q5_1(row, a),
                _ => dot_q8_0(row, a),
            }
        };
    }
}

/// The 6-bit scale and min of sub-block j of Q4_K / Q5_K (12 packed bytes).
#[inline]
pub fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q4_K (144 B / 256): d, dmin f16, scales[12], qs[128]; 8 sub-blocks of 32:
/// value = d * sc * q - dmin * m. Bytes 32j..32j+32 hold sub-block 2j (low nibbles) and
/// 2j+1 (high nibbles).
pub unsafe fn dot_q4_k(w: &[u8], a: ActRow) -> f32 {
    let a = a.blocks;
    let mut sum = 0f32;
    for (b, x) in w.chunks_exact(144).zip(a.chunks_exact(8)) {
        let (d, dmin, scales, qs) = (f16(b, 0), f16(b, 2), &b[4..16], &b[16..144]);
        for j in 0..4 {
            let q = &qs[32 * j..32 * j + 32];
            for (h, xb) in [(0, &x[2 * j]), (1, &x[2 * j + 1])] {
                let (sc, m) = scale_min_k4(2 * j + h, scales);
                let isum: i32 = (0..32)
                    .map(|l| ((q[l] >> (4 * h)) & 15) as i32 * xb.qs[l] as i32)
                    .sum();
                sum +=
                    d * xb.d * sc as f32 * isum as f32 - dmin * xb.d * m as f32 * xb.sum() as f32;
            }
        }
    }
    sum
}

/// Q5_K (176 B / 256): d, dmin, scales[12], qh[32], qs[128]; like Q4_K with a fifth bit:
/// sub-block i takes bit i of qh[l].
pub unsafe fn dot_q5_k(w: &[u8], a: ActRow) -> f32 {
    let a = a.blocks;
    let mut sum = 0f32;
    for (b, x) in w.chunks_exact(176).zip(a.chunks_exact(8)) {
        let (d, dmin, scales, qh, qs) = (f16(b, 0), f16(b, 2), &b[4..16], &b[16..48], &b[48..176]);
        for j in 0..4 {
            let q = &qs[32 * j..32 * j + 32];
            for (h, xb) in [(0, &x[2 * j]), (1, &x[2 * j + 1])] {
                let sb = 2 * j + h;
                let (sc, m) = scale_min_k4(sb, scales);
                let isum: i32 = (0..32)
                    .map(|l| {
                        let v = ((q[l] >> (4 * h)) & 15) | (((qh[l] >> sb) & 1) << 4);
                        v as i32 * xb.qs[l] as i32
                    })
                    .sum();
                sum +=
                    d * xb.d * sc as f32 * isum as f32 - dmin * xb.d * m as f32 * xb.sum() as f32;
            }
        }
    }
    sum
}

/// Q6_K (210 B / 256): ql[128], qh[64], scales[16] i8, d f16; 16 groups of 16:
/// value = d * sc * (q - 32), q = 4 low bits from ql, 2 high bits from qh.
pub unsafe fn dot_q6_k(w: &[u8], a: ActRow) -> f32 {
    let a = a.blocks;
    let mut sum = 0f32;
    for (b, x) in w.chunks_exact(210).zip(a.chunks_exact(8)) {
        let d = f16(b, 208);
        for n in 0..2 {
            let (ql, qh) = (&b[64 * n..64 * n + 64], &b[128 + 32 * n..128 + 32 * n + 32]);
            let sc = &b[192 + 8 * n..192 + 8 * n + 8];
            for k in 0..4 {
                let xb = &x[4 * n + k];
                let mut isum = [0i32; 2];
                for l in 0..32 {
                    let low = if k % 2 == 0 { ql[l] } else { ql[l + 32] };
                    let low = if k < 2 { low & 15 } else { low >> 4 };
                    let q = low | (((qh[l] >> (2 * k)) & 3) << 4);
                    isum[l / 16] += q as i32 * xb.qs[l] as i32;
                }
                for h in 0..2 {
                    let s = sc[2 * k + h] as i8 as i32;
                    sum += d * xb.d * (s * (isum[h] - 32 * xb.sums[h] as i32)) as f32;
                }
            }
        }
    }
    sum
}
