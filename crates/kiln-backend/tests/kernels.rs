//! Every integer kernel set against the scalar reference, and the scalar integer path against
//! f32 arithmetic on dequantized weights, on random rows of awkward lengths.

use kiln_backend::cpu::kernels::pack::{dequant_packed_row, pack_row, unpack_row};
use kiln_backend::cpu::kernels::{
    available, quantize_act, quantize_act_portable, BlockQ8, QuantAct, SCALAR,
};
use kiln_quant::{dequantize, quantize, GgmlType};

mod common {
    pub mod rng;
}
use common::rng::Rng;

/// A random row in format `ty`: quantized from random floats, or (Q5_K, which kiln does not
/// quantize) random bytes with sane f16 scales.
fn random_row(ty: GgmlType, cols: usize, rng: &mut Rng) -> Vec<u8> {
    if ty == GgmlType::Q5_K {
        let mut b: Vec<u8> = (0..ty.row_bytes(cols).unwrap())
            .map(|_| rng.next() as u8)
            .collect();
        for blk in b.chunks_exact_mut(176) {
            let d = half::f16::from_f32(0.01 + (rng.next() % 100) as f32 / 5000.0).to_bits();
            let m = half::f16::from_f32((rng.next() % 100) as f32 / 8000.0).to_bits();
            blk[0..2].copy_from_slice(&d.to_le_bytes());
            blk[2..4].copy_from_slice(&m.to_le_bytes());
        }
        return b;
    }
    let x: Vec<f32> = (0..cols).map(|_| rng.normal() * 0.05).collect();
    quantize(ty, &x).unwrap()
}

fn packed(ty: GgmlType, ggml: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; ggml.len()];
    pack_row(ty, ggml, &mut p);
    p
}

#[test]
fn packing_round_trips_and_dequantizes_alike() {
    let mut rng = Rng(7);
    for ty in FORMATS {
        for &cols in shapes(ty) {
            let ggml = random_row(ty, cols, &mut rng);
            let p = packed(ty, &ggml);
            let mut back = vec![0u8; p.len()];
            unpack_row(ty, &p, &mut back);
            assert_eq!(back, ggml, "{} cols {cols}", ty.name());
            let mut got = vec![0f32; cols];
            dequant_packed_row(ty, &p, &mut got).unwrap();
            assert_eq!(
                got,
                dequantize(ty, &ggml, cols).unwrap(),
                "{} cols {cols}",
                ty.name()
            );
        }
    }
}

const FORMATS: [GgmlType; 8] = [
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

fn shapes(ty: GgmlType) -> &'static [usize] {
    if ty.block_size() == 256 {
        &[256, 512, 768, 2816]
    } else {
        &[32, 64, 96, 160, 576, 1536, 2848]
    }
}

#[test]
fn simd_kernels_equal_scalar_reference() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let sets = available();
    assert!(sets.iter().any(|k| k.name == "scalar"));
    for ty in FORMATS {
        for &cols in shapes(ty) {
            for _ in 0..8 {
                let w = packed(ty, &random_row(ty, cols, &mut rng));
                let x: Vec<f32> = (0..cols).map(|_| rng.normal()).collect();
                let mut qa = QuantAct::default();
                qa.quantize(&x, 1, cols);
                let a = qa.row(0);
                let mut wf = vec![0f32; cols];
                dequant_packed_row(ty, &w, &mut wf).unwrap();
                let mag: f32 = wf.iter().zip(&x).map(|(w, x)| (w * x).abs()).sum();
                let want = unsafe { (SCALAR.dot_for(ty).unwrap())(&w, a) };
                for k in &sets {
                    let got = unsafe { (k.dot_for(ty).unwrap())(&w, a) };
                    // Same integer sums; only f32 summation order differs.
                    let tol = 2e-6 * mag + 1e-6;
                    assert!(
                        (got - want).abs() <= tol,
                        "{} {} cols {cols}: {got} vs scalar {want} (tol {tol})",
                        k.name,
                        ty.name()
                    );
                }
            }
        }
    }
}

#[test]
fn scalar_integer_dot_tracks_f32_dot() {
    let mut rng = Rng(0xfeed_beef_0bad_cafe);
    for ty in FORMATS {
        for &cols in shapes(ty) {
            let ggml = random_row(ty, cols, &mut rng);
            let w = packed(ty, &ggml);
            let x: Vec<f32> = (0..cols).map(|_| rng.normal()).collect();
            let mut qa = QuantAct::default();
            qa.quantize(&x, 1, cols);
            let wf = dequantize(ty, &ggml, cols).unwrap();
            let exact: f64 = wf.iter().zip(&x).map(|(w, x)| *w as f64 * *x as f64).sum();
            // Activation rounding moves each x by at most amax(block) / 254.
            let bound: f64 = wf
                .chunks(32)
                .zip(x.chunks(32))
                .map(|(wb, xb)| {
                    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                    wb.iter().map(|w| w.abs() as f64).sum::<f64>() * amax / 254.0
                })
                .sum();
            let got = unsafe { (SCALAR.dot_for(ty).unwrap())(&w, qa.row(0)) } as f64;
            assert!(
                (got - exact).abs() <= bound * 1.01 + 1e-4,
                "{} cols {cols}: {got} vs f32 {exact} (bound {bound})",
                ty.name()
            );
        }
    }
}

#[test]
fn activation_quantization_round_trips() {
    let mut rng = Rng(42);
    let x: Vec<f32> = (0..96).map(|_| rng.normal()).chain([0.0; 32]).collect();
    let mut a = vec![BlockQ8::default(); 4];
    quantize_act(&x, &mut a);
    for (b, xb) in a.iter().zip(x.chunks(32)) {
        let s: i32 = b.qs.iter().map(|&q| q as i32).sum();
        assert_eq!(s, b.sum());
        for (q, v) in b.qs.iter().zip(xb) {
            assert!((*q as f32 * b.d - v).abs() <= b.d / 2.0 + 1e-7);
        }
    }
    assert_eq!(a[3].d, 0.0);
}

/// The dispatched (SIMD) quantizer gives exactly the portable one's blocks.
#[test]
fn activation_quantization_is_the_same_everywhere() {
    let mut rng = Rng(4242);
    let mut x: Vec<f32> = (0..32 * 64).map(|_| rng.normal()).collect();
    x[..32].fill(0.0);
    x[40] = 1e-30;
    x[100] = -3.5e4;
    let mut a = vec![BlockQ8::default(); 64];
    let mut b = vec![BlockQ8::default(); 64];
    quantize_act(&x, &mut a);
    quantize_act_portable(&x, &mut b);
    for (i, (a, b)) in a.iter().zip(&b).enumerate() {
        assert_eq!(
            (a.d.to_bits(), a.sums, a.qs),
            (b.d.to_bits(), b.sums, b.qs),
            "block {i}"
        );
    }
}

#[test]
fn four_row_kernels_equal_single_rows() {
    let mut rng = Rng(0xabcdef);
    for ty in FORMATS {
        for &cols in shapes(ty) {
            let rows: Vec<Vec<u8>> = (0..4)
                .map(|_| packed(ty, &random_row(ty, cols, &mut rng)))
                .collect();
            let rb = rows[0].len();
            let w: Vec<u8> = rows.concat();
            let x: Vec<f32> = (0..cols).map(|_| rng.normal()).collect();
            let mut qa = QuantAct::default();
            qa.quantize(&x, 1, cols);
            let want: Vec<f32> = rows
                .iter()
                .map(|r| unsafe { (SCALAR.dot_for(ty).unwrap())(r, qa.row(0)) })
                .collect();
            for k in available() {
                let Some(k4) = k.dot4_for(ty) else { continue };
                let mut got = [0f32; 4];
                unsafe { k4(&w, rb, qa.row(0), &mut got) };
                for r in 0..4 {
                    let mut wf = vec![0f32; cols];
                    dequant_packed_row(ty, &rows[r], &mut wf).unwrap();
                    let mag: f32 = wf.iter().zip(&x).map(|(w, x)| (w * x).abs()).sum();
                    let tol = 2e-6 * mag + 1e-6;
                    assert!(
                        (got[r] - want[r]).abs() <= tol,
                        "{} {} cols {cols} row {r}: {} vs {}",
                        k.name,
                        ty.name(),
                        got[r],
                        want[r]
                    );
                }
            }
        }
    }
}

/// Prefill's decoded tiles give exactly (bit for bit) what the four-row kernels give, so a
/// token's logits do not depend on the batch it is computed in.
#[test]
fn decoded_tiles_equal_four_row_kernels_exactly() {
    use kiln_backend::cpu::kernels::tile::DecodedTile;
    let mut rng = Rng(0x7157);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
    ] {
        for &cols in shapes(ty) {
            let rows: Vec<Vec<u8>> = (0..8)
                .map(|_| packed(ty, &random_row(ty, cols, &mut rng)))
                .collect();
            let rb = rows[0].len();
            let w: Vec<u8> = rows.concat();
            let x: Vec<f32> = (0..cols).map(|_| rng.normal()).collect();
            let mut qa = QuantAct::default();
            qa.quantize(&x, 1, cols);
            let mut tile = DecodedTile::default();
            tile.decode_rows(ty, &w, rb, 8);
            for k in available() {
                let Some(tk) = k.tile4_for(ty) else { continue };
                for r0 in [0, 4] {
                    let mut got = [0f32; 4];
                    let mut want = [0f32; 4];
                    unsafe { tk(&tile, r0, qa.row(0), &mut got) };
                    unsafe { (k.dot4_for(ty).unwrap())(&w[r0 * rb..], rb, qa.row(0), &mut want) };
                    let sc: Vec<f32> = (0..4)
                        .map(|j| unsafe { (SCALAR.dot_for(ty).unwrap())(&rows[r0 + j], qa.row(0)) })
                        .collect();
                    assert_eq!(
                        got.map(f32::to_bits),
                        want.map(f32::to_bits),
                        "{} {} cols {cols} rows {r0}..: {got:?} vs {want:?} scalar {sc:?}",
                        k.name,
                        ty.name()
                    );
                }
            }
        }
    }
}

/// `KILN_REQUIRE_KERNELS=a,b` (CI sets it for the aarch64 run) fails unless those sets are
/// available here, so a detection slip cannot leave a set untested. Besides the product
/// kernel sets ("avx2", "avx-vnni", "avx512-vnni", "neon", "neon-dotprod"): "amx" (AMX
/// tiles), "avx512-bf16" and "neon-bf16" (the bf16 block products without tiles), every integer convolution
/// kernel this CPU has ("amx", "avx512-vnni-conv", "avx-vnni-conv", "avx2-conv",
/// "neon-i8mm-conv", "neon-dotprod-conv": each is tested against the same sums) and the
/// int8 block products' set ("avx512-vnni-gemm", "avx-vnni-gemm", "neon-dotprod-gemm" or
/// "neon-i8mm-gemm").
#[test]
fn required_kernel_sets_are_available() {
    let mut names: Vec<&str> = available().iter().map(|k| k.name).collect();
    if kiln_backend::cpu::kernels::amx::available() {
        names.push("amx");
    }
    if kiln_backend::cpu::kernels::amx::avx512_bf16_available() {
        names.push("avx512-bf16");
    }
    if kiln_backend::cpu::kernels::amx::neon_bf16_available() {
        names.push("neon-bf16");
    }
    names.extend(kiln_backend::cpu::integer_conv_kernels());
    names.extend(kiln_backend::cpu::kernels::vnni_gemm::isa().map(|i| i.name()));
    eprintln!("kernel sets: {names:?}");
    #[cfg(target_arch = "aarch64")]
    assert!(names.contains(&"neon"), "{names:?}");
    let required = kiln_backend::options::value("KILN_REQUIRE_KERNELS").unwrap_or_default();
    for r in required.split(',').filter(|r| !r.is_empty()) {
        assert!(
            names.contains(&r),
            "kernel set {r} required, available: {names:?}"
        );
    }
}
