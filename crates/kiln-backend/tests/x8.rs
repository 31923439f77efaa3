//! The eight-row interleaved layouts and their kernels: packing round-trips, every set with
//! interleaved kernels against the scalar reference on odd shapes, and a token's result
//! independent (bit for bit) of how many tokens share the call, in the kernels (one group
//! or a pair a call) and in the backend's products (decode and prefill take both).

use kiln_backend::cpu::kernels::pack::pack_row;
use kiln_backend::cpu::kernels::x8::{self, ROWS};
use kiln_backend::cpu::kernels::{available, ActRow, QuantAct, SCALAR};
use kiln_backend::cpu::CpuBackend;
use kiln_backend::WeightData;
use kiln_backend::{LlmOps, TensorOps};
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

#[test]
fn pair_kernels_equal_the_one_group_kernels_bit_for_bit() {
    let mut rng = Rng(0x9a1e_5eed_0000_0016);
    let mut tested = false;
    for k in available() {
        let Some(pairs) = k.x8.and_then(|s| s.pairs) else {
            continue;
        };
        tested = true;
        for ty in FORMATS {
            for &cols in shapes(ty) {
                // Four groups, the last one partly padding; pairs from each but the last.
                let nrows = 29;
                let rows = random_rows(ty, nrows, cols, &mut rng);
                let m = pack_matrix(ty, &rows, cols);
                let gb = x8::group_bytes(ty, cols);
                // More tokens than one call takes, so that calls of every size run.
                let n = 2 * pairs.max_tokens + 3;
                let x: Vec<f32> = (0..n * cols).map(|_| rng.normal()).collect();
                let mut qa = QuantAct::default();
                qa.quantize(&x, n, cols);
                let acts: Vec<ActRow> = (0..n).map(|t| qa.row(t)).collect();
                let (one, two) = (k.x8_for(ty).unwrap(), pairs.for_type(ty).unwrap());
                for g in 0..3 {
                    let mut want = vec![[0f32; ROWS]; 2 * n];
                    for h in 0..2 {
                        let group = &m[(g + h) * gb..(g + h + 1) * gb];
                        let mut o = vec![[0f32; ROWS]; n];
                        unsafe { one(group, cols, &acts, &mut o) };
                        for t in 0..n {
                            want[2 * t + h] = o[t];
                        }
                    }
                    // The whole matrix from the pair on (as the first call over it gets).
                    let mut all = vec![[0f32; ROWS]; 2 * n];
                    unsafe { two(&m[g * gb..], cols, &acts, &mut all) };
                    for t in 0..n {
                        let mut alone = [[0f32; ROWS]; 2];
                        unsafe { two(&m[g * gb..(g + 2) * gb], cols, &acts[t..t + 1], &mut alone) };
                        for h in 0..2 {
                            let w = want[2 * t + h].map(f32::to_bits);
                            let what = format!(
                                "{} {} cols {cols} group {} token {t}",
                                k.name,
                                ty.name(),
                                g + h
                            );
                            assert_eq!(all[2 * t + h].map(f32::to_bits), w, "{what}: pair kernel");
                            assert_eq!(
                                alone[h].map(f32::to_bits),
                                w,
                                "{what}: pair kernel, one token"
                            );
                        }
                    }
                }
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512vnni") && std::is_x86_feature_detected!("avx512bw") {
        assert!(tested, "AVX-512 VNNI machine without pair kernels");
    }
    let _ = tested;
}

#[test]
fn backend_products_of_a_token_ignore_its_batch() {
    // AMX machines run prefill-sized products as tile block products instead.
    #[cfg(target_arch = "x86_64")]
    if kiln_backend::cpu::kernels::amx::available() {
        return;
    }
    let mut rng = Rng(0xba7c_4000_0000_0019);
    let b = CpuBackend::new(2);
    for ty in FORMATS {
        // Five groups: two pairs and one group alone in the pair kernels' sets.
        let (rows, cols, n) = (40, shapes(ty)[1], 19);
        let load = |rng: &mut Rng| {
            let bytes: Vec<u8> = random_rows(ty, rows, cols, rng).concat();
            let data = WeightData {
                name: "w",
                ty,
                rows,
                cols,
                bytes: &bytes,
            };
            b.load_weight(data).unwrap()
        };
        let (w, up) = (load(&mut rng), load(&mut rng));
        let x: Vec<f32> = (0..n * cols).map(|_| rng.normal()).collect();
        let base: Vec<f32> = (0..n * rows).map(|_| rng.normal()).collect();
        // Each product of tokens t0..t1 -> its n x rows values.
        let run = |t0: usize, t1: usize, op: usize| {
            let k = t1 - t0;
            let xt = b.tensor_from(k, cols, &x[t0 * cols..t1 * cols]);
            let mut out = b.tensor_from(k, rows, &base[t0 * rows..t1 * rows]);
            match op {
                0 => b.matmul(&w, &xt, None, k, &mut out),
                1 => b.matmul_add(&w, &xt, k, &mut out),
                _ => b.gate_up_silu(&w, &up, &xt, k, &mut out),
            }
            let mut v = vec![0f32; k * rows];
            b.read(&out, k, &mut v);
            v
        };
        for op in 0..3 {
            let all = run(0, n, op);
            for t in 0..n {
                let one = run(t, t + 1, op);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&one),
                    bits(&all[t * rows..(t + 1) * rows]),
                    "{} op {op}: token {t} alone differs from its batch",
                    ty.name()
                );
            }
        }
    }
}
