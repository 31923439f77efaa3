//! The eight-row interleaved layouts and their kernels: packing round-trips, every set with
//! interleaved kernels against the scalar reference on odd shapes, and a token's result
//! independent (bit for bit) of how many tokens share the call.

use kiln_backend::cpu::kernels::pack::pack_row;
use kiln_backend::cpu::kernels::x8::{self, ROWS};
use kiln_backend::cpu::kernels::{available, ActRow, QuantAct, SCALAR};
use kiln_quant::{dequantize, quantize, GgmlType};

mod common {
    pub mod rng;
}
use common::rng::Rng;

const FORMATS: [GgmlType; 7] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

fn shapes(ty: GgmlType) -> &'static [usize] {
    if ty.block_size() == 256 {
        &[256, 768, 2816]
    } else {
        &[32, 96, 576, 1056]
    }
}

/// `rows` random GGML rows of `cols` values (with a few all-zero and constant rows).
fn random_rows(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<Vec<u8>> {
    (0..rows)
        .map(|r| {
            let x: Vec<f32> = match r % 7 {
                5 => vec![0.0; cols],
                6 => vec![0.02; cols],
                _ => (0..cols).map(|_| rng.normal() * 0.05).collect(),
            };
            quantize(ty, &x).unwrap()
        })
        .collect()
}

fn pack_matrix(ty: GgmlType, rows: &[Vec<u8>], cols: usize) -> Vec<u8> {
    let gb = x8::group_bytes(ty, cols);
    let mut out = vec![0u8; x8::matrix_bytes(ty, rows.len(), cols)];
    for (g, dst) in out.chunks_exact_mut(gb).enumerate() {
        let group: Vec<&[u8]> = rows[8 * g..(8 * g + 8).min(rows.len())]
            .iter()
            .map(|r| r.as_slice())
            .collect();
        x8::pack_group(ty, &group, cols, dst);
    }
    out
}

#[test]
fn interleaved_groups_round_trip_and_dequantize_alike() {
    let mut rng = Rng(0x5eed);
    for ty in FORMATS {
        for &cols in shapes(ty) {
            for nrows in [1, 5, 8, 13] {
                let rows = random_rows(ty, nrows, cols, &mut rng);
                let m = pack_matrix(ty, &rows, cols);
                let gb = x8::group_bytes(ty, cols);
                for (r, row) in rows.iter().enumerate() {
                    let group = &m[r / ROWS * gb..(r / ROWS + 1) * gb];
                    let mut back = vec![0u8; row.len()];
                    x8::unpack_row(ty, group, cols, r % ROWS, &mut back);
                    assert_eq!(&back, row, "{} cols {cols} row {r}", ty.name());
                    let mut got = vec![0f32; cols];
                    x8::dequant_row(ty, group, cols, r % ROWS, &mut got).unwrap();
                    assert_eq!(got, dequantize(ty, row, cols).unwrap());
                }
            }
        }
    }
}

/// Sum over i of (|w_i| + max |w| of i's 32-value block) * |x_i|: the size of the terms an
/// offset-corrected kernel adds, against which its rounding is measured.
fn magnitude(w: &[f32], x: &[f32]) -> f32 {
    w.chunks(32)
        .zip(x.chunks(32))
        .map(|(wb, xb)| {
            let amax = wb.iter().fold(0f32, |m, v| m.max(v.abs()));
            wb.iter()
                .zip(xb)
                .map(|(w, x)| (w.abs() + amax) * x.abs())
                .sum::<f32>()
        })
        .sum()
}

#[test]
fn interleaved_kernels_equal_scalar_reference_and_ignore_the_batch() {
    let mut rng = Rng(0xfade_0ff1_ce00_1234);
    let sets: Vec<_> = available().into_iter().filter(|k| k.x8.is_some()).collect();
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        assert!(!sets.is_empty(), "AVX2 machine without interleaved kernels");
    }
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("dotprod") {
        assert!(
            !sets.is_empty(),
            "dotprod machine without interleaved kernels"
        );
    }
    for ty in FORMATS {
        for &cols in shapes(ty) {
            let nrows = 13;
            let rows = random_rows(ty, nrows, cols, &mut rng);
            let m = pack_matrix(ty, &rows, cols);
            let gb = x8::group_bytes(ty, cols);
            let n = 7;
            let x: Vec<f32> = (0..n * cols).map(|_| rng.normal()).collect();
            let mut qa = QuantAct::default();
            qa.quantize(&x, n, cols);
            let acts: Vec<ActRow> = (0..n).map(|t| qa.row(t)).collect();
            for k in &sets {
                let gemm = k.x8_for(ty).unwrap();
                for g in 0..nrows.div_ceil(ROWS) {
                    let group = &m[g * gb..(g + 1) * gb];
                    // All tokens in one call (the kernel splits them), then one at a time.
                    let mut all = vec![[0f32; ROWS]; n];
                    unsafe { gemm(group, cols, &acts, &mut all) };
                    for t in 0..n {
                        let mut one = [[0f32; ROWS]; 1];
                        unsafe { gemm(group, cols, &acts[t..t + 1], &mut one) };
                        assert_eq!(
                            one[0].map(f32::to_bits),
                            all[t].map(f32::to_bits),
                            "{} {} cols {cols}: token {t} alone differs from its batch",
                            k.name,
                            ty.name()
                        );
                        for j in 0..ROWS.min(nrows - 8 * g) {
                            let r = 8 * g + j;
                            let mut p = vec![0u8; rows[r].len()];
                            pack_row(ty, &rows[r], &mut p);
                            let want = unsafe { (SCALAR.dot_for(ty).unwrap())(&p, acts[t]) };
                            let wf = dequantize(ty, &rows[r], cols).unwrap();
                            let xt = &x[t * cols..(t + 1) * cols];
                            let tol = 4e-6 * magnitude(&wf, xt) + 1e-6;
                            let got = all[t][j];
                            assert!(
                                (got - want).abs() <= tol,
                                "{} {} cols {cols} row {r} token {t}: {got} vs scalar {want} \
                                 (tol {tol})",
                                k.name,
                                ty.name()
                            );
                        }
                    }
                }
            }
        }
    }
}
