//! f32 block products on AVX-512 FMA for weights marked `prefer_batches` on CPUs with neither
//! AMX tiles nor AVX-512 BF16 (Intel Skylake-SP to Ice Lake and Tiger Lake: most x86 cloud
//! machines): the weight packed once at load in 16-row blocks, each k a 64-byte vector of
//! the block's 16 values, so a strip of 8 rows of x x 32 columns runs from registers
//! (`strip_8x32!` with `vfmadd231ps`: one broadcast of x a row, two vectors of W a k).
//! Sums in f32 as the row dots, in another order.

use super::amx::{round_up, MB, NB};

/// Rows of W per packed block (lanes of a vector).
const TN: usize = 16;

/// Whether these products run here: AVX-512F allowed, and neither AMX nor AVX-512 BF16 (whose
/// bf16 block products are faster).
pub fn available() -> bool {
    super::avx512_allowed() && !super::amx::bf16_products()
}

/// W (n rows of k) in vector order: block b, k, lane j = W[16 b + j][k] (zeros past n).
#[derive(Debug, Clone, Default)]
pub struct PackedF32 {
    pub data: Vec<f32>,
    pub k: usize,
    pub n: usize,
    pub np: usize,
}

impl PackedF32 {
    /// Packs W from its rows: `row(j, buf)` writes W[j][..k].
    pub fn from_rows(n: usize, k: usize, mut row: impl FnMut(usize, &mut [f32])) -> Self {
        let np = round_up(n.max(1), NB);
        let mut data = vec![0f32; np * k];
        let mut buf = vec![0f32; k];
        for j in 0..n {
            row(j, &mut buf);
            let base = j / TN * TN * k + j % TN;
            for (kk, &v) in buf.iter().enumerate() {
                data[base + kk * TN] = v;
            }
        }
        PackedF32 { data, k, n, np }
    }

    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }
}

pub use super::amx::Block;

/// C (m, columns j0..j1) = A · Wᵀ for A's rows 0..m (`a`: `round_up(m, MB)` rows of `b.k`
/// f32, rows past m zeros), by 32 x 32 blocks handed to `emit(i0, j0, block)`. `j0`, `j1`
/// multiples of [`NB`], `j1 <= b.np`.
///
/// # Safety
/// AVX-512F is present and allowed ([`available`] implies it).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_cols(
    a: &[f32],
    m: usize,
    b: &PackedF32,
    j0: usize,
    j1: usize,
    c: &mut Block,
    emit: impl FnMut(usize, usize, &[f32]),
) {
    assert!(
        j0 % NB == 0 && j1 % NB == 0 && j1 <= b.np,
        "gemm_cols range"
    );
    let (k, mp) = (b.k, round_up(m.max(1), MB));
    assert!(k > 0 && a.len() >= mp * k && b.data.len() >= b.np * k);
    let lda = (k * 4) as isize;
    let strip_of = |r0: usize, nb: usize, rows: &mut [f32]| {
        // SAFETY: rows r0..r0+8 of `a` and the two packed blocks lie inside the operands
        // (checked above); `rows` holds the strip's 8 x 32 values; AVX-512F is present
        // (caller).
        unsafe {
            let b0 = b.data.as_ptr().add(nb * TN * k);
            let (ap, cp) = (a.as_ptr().add(r0 * k), rows.as_mut_ptr());
            super::strip_8x32!("vfmadd231ps", ap, lda, b0, b0.add(TN * k), k, cp);
        }
    };
    super::amx::strips(m, j0, j1, c, strip_of, emit)
}

/// Elsewhere [`available`] is false, so this is never called.
#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_cols(
    _: &[f32],
    _: usize,
    _: &PackedF32,
    _: usize,
    _: usize,
    _: &mut Block,
    _: impl FnMut(usize, usize, &[f32]),
) {
    unreachable!("AVX-512 is x86_64 only")
}

/// Checks [`gemm_cols`] against f64 sums of the same products (f32 rounding of k terms);
/// panics on a difference. For the tests of each process's kernel choice.
#[doc(hidden)]
pub fn check_against_f64() {
    assert!(super::avx512_allowed(), "no AVX-512 here");
    let mut rnd = super::amx::check_values(0x2468_ace1);
    for (m, n, k) in [
        (1, 1, 1),
        (33, 17, 40),
        (64, 64, 64),
        (70, 100, 250),
        (5, 48, 1536),
    ] {
        let x: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
        let w: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
        let b = PackedF32::from_rows(n, k, |j, r| r.copy_from_slice(&w[j * k..(j + 1) * k]));
        let mut a = vec![0f32; round_up(m, MB) * k];
        a[..m * k].copy_from_slice(&x);
        let mut blk = Block::default();
        let c = super::amx::check_gather(m, n, b.np, |j_lo, emit| {
            // SAFETY: the set was checked above; the operands are built whole.
            unsafe { gemm_cols(&a, m, &b, j_lo, b.np, &mut blk, emit) }
        });
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|p| x[i * k + p] as f64 * w[j * k + p] as f64)
                    .sum();
                let got = c[i * n + j] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * (k as f64).sqrt() * (1.0 + want.abs()),
                    "{m}x{n}x{k} ({i},{j}): {got} vs {want}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// The kernel on any AVX-512 machine (dispatch picks it only without AMX and BF16).
    #[test]
    fn gemm_matches_f64_sums() {
        if !super::super::avx512_allowed() {
            eprintln!("no AVX-512 here: skipped");
            return;
        }
        super::check_against_f64();
    }
}
