//! The scalar reference against fixtures made by the `gguf` Python package
//! (`tools/gen_quant_fixtures.py`), plus round-trip bounds and error cases.
//!
//! Dequantization is compared bit for bit: every format decodes with the same f32
//! operations in the same order as the Python reference (one multiply, or a multiply
//! then one add/subtract, never fused), so there is no rounding slack to allow.

use kiln_quant::{
    can_dequantize, can_quantize, dequantize, dequantize_row, quantize, quantize_row, GgmlType,
    QuantError, QK_K,
};
use serde_json::Value;
use std::path::PathBuf;

const ALL: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
];

// ------------------------------------------------------------------ fixtures

struct Case {
    name: String,
    n_per_row: usize,
    input: Option<Vec<Vec<f32>>>,
    quantized: Vec<Vec<u8>>,
    dequantized: Vec<Vec<f32>>,
}

struct Fixture {
    ty: GgmlType,
    cases: Vec<Case>,
}

fn hex_bytes(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn hex_f32s(s: &str) -> Vec<f32> {
    hex_bytes(s)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn hex_rows<T>(v: &Value, f: fn(&str) -> T) -> Vec<T> {
    v.as_array()
        .expect("array of hex rows")
        .iter()
        .map(|r| f(r.as_str().unwrap()))
        .collect()
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn load(name: &str) -> Fixture {
    let path = fixture_dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text).unwrap();
    let id = v["type_id"].as_u64().unwrap() as u32;
    let ty = GgmlType::from_id(id).unwrap_or_else(|| panic!("{name}: unknown type id {id}"));
    // The fixture's own view of the format must agree with our type table.
    assert_eq!(ty.name(), v["format"].as_str().unwrap(), "{name}: name");
    assert_eq!(
        ty.block_size() as u64,
        v["block_size"].as_u64().unwrap(),
        "{name}: block_size"
    );
    assert_eq!(
        ty.type_size() as u64,
        v["type_size"].as_u64().unwrap(),
        "{name}: type_size"
    );
    let cases = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let case = Case {
                name: c["name"].as_str().unwrap().to_string(),
                n_per_row: c["n_per_row"].as_u64().unwrap() as usize,
                input: c.get("input_f32").map(|x| hex_rows(x, hex_f32s)),
                quantized: hex_rows(&c["quantized"], hex_bytes),
                dequantized: hex_rows(&c["dequantized_f32"], hex_f32s),
            };
            let rows = c["rows"].as_u64().unwrap() as usize;
            assert_eq!(case.quantized.len(), rows);
            assert_eq!(case.dequantized.len(), rows);
            assert!(case.dequantized.iter().all(|r| r.len() == case.n_per_row));
            case
        })
        .collect();
    Fixture { ty, cases }
}

/// Every format with a fixture, and which of them Python quantizes.
const FIXTURES: [(&str, bool); 13] = [
    ("f32", true),
    ("f16", true),
    ("bf16", true),
    ("q4_0", true),
    ("q4_1", true),
    ("q5_0", true),
    ("q5_1", true),
    ("q8_0", true),
    ("q2_k", false),
    ("q3_k", false),
    ("q4_k", false),
    ("q5_k", false),
    ("q6_k", false),
];

fn assert_bits_eq(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits(),
            "{what}: value {i}: got {g:e} ({:#010x}), want {w:e} ({:#010x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

#[test]
fn dequantize_matches_python_bit_for_bit() {
    for (name, _) in FIXTURES {
        let fx = load(name);
        for case in &fx.cases {
            let mut all_bytes = Vec::new();
            let mut all_want = Vec::new();
            for (r, (bytes, want)) in case.quantized.iter().zip(&case.dequantized).enumerate() {
                let mut got = vec![f32::NAN; case.n_per_row];
                dequantize_row(fx.ty, bytes, &mut got).unwrap();
                assert_bits_eq(&got, want, &format!("{name}/{}/row {r}", case.name));
                all_bytes.extend_from_slice(bytes);
                all_want.extend_from_slice(want);
            }
            // Rows back to back decode the same as one by one.
            let got = dequantize(fx.ty, &all_bytes, all_want.len()).unwrap();
            assert_bits_eq(&got, &all_want, &format!("{name}/{}/all rows", case.name));
        }
    }
}

#[test]
fn quantize_matches_python_bytes() {
    for (name, python_quantizes) in FIXTURES {
        let fx = load(name);
        let cases: Vec<_> = fx.cases.iter().filter(|c| c.input.is_some()).collect();
        assert_eq!(
            !cases.is_empty(),
            python_quantizes,
            "{name}: python_quantized case"
        );
        for case in cases {
            let input = case.input.as_ref().unwrap();
            for (r, (x, want)) in input.iter().zip(&case.quantized).enumerate() {
                let mut got = vec![0xAAu8; want.len()];
                quantize_row(fx.ty, x, &mut got).unwrap();
                if got != *want {
                    let bs = fx.ty.type_size();
                    let blk = got
                        .chunks(bs)
                        .zip(want.chunks(bs))
                        .position(|(g, w)| g != w)
                        .unwrap();
                    panic!(
                        "{name}/row {r}: block {blk} differs\n got  {:02x?}\n want {:02x?}\n input {:?}",
                        &got[blk * bs..(blk + 1) * bs],
                        &want[blk * bs..(blk + 1) * bs],
                        &x[blk * fx.ty.block_size()..(blk + 1) * fx.ty.block_size()]
                    );
                }
            }
        }
    }
}

#[test]
fn fixtures_cover_every_required_format() {
    let have: Vec<GgmlType> = FIXTURES.iter().map(|(n, _)| load(n).ty).collect();
    for ty in ALL {
        let exempt = matches!(ty, GgmlType::Q8_1 | GgmlType::Q8_K); // Python has no codec
        assert!(exempt || have.contains(&ty), "no fixture for {}", ty.name());
    }
}

// ------------------------------------------------------------------ round trips

/// Deterministic pseudo-random source (xorshift64*), normal deviates by Box-Muller.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn normal(&mut self) -> f32 {
        let u1 = self.uniform().max(1e-7);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
    }
}

/// Rows of normal values, each block at its own scale (1e-4 .. 1e3), some with an offset.
fn test_data(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = Rng(seed);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let scale = 10f32.powf(rng.uniform() * 7.0 - 4.0);
        let offset = if rng.uniform() < 0.3 {
            rng.normal() * scale
        } else {
            0.0
        };
        for _ in 0..32.min(n - out.len()) {
            out.push(rng.normal() * scale + offset);
        }
    }
    out
}

fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let q = quantize(ty, x).unwrap();
    assert_eq!(q.len(), ty.row_bytes(x.len()).unwrap());
    dequantize(ty, &q, x.len()).unwrap()
}

fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Checks |y - x| <= bound(block of x) for every value, block by block.
fn check_blocks(ty: GgmlType, x: &[f32], y: &[f32], block: usize, bound: impl Fn(&[f32]) -> f32) {
    for (i, (xb, yb)) in x.chunks(block).zip(y.chunks(block)).enumerate() {
        let b = bound(xb);
        for (j, (a, c)) in xb.iter().zip(yb).enumerate() {
            let err = (a - c).abs();
            assert!(
                err <= b,
                "{}: block {i} value {j}: |{a} - {c}| = {err} > {b}",
                ty.name()
            );
        }
    }
}

/// Largest error of storing `v` as f16: half an ulp, or half the subnormal step (2^-25).
fn f16_err(v: f32) -> f32 {
    v.abs() / 2048.0 + 1.0 / (1u64 << 25) as f32
}

#[test]
fn round_trip_error_bounds() {
    let n = 64 * QK_K;
    let x = test_data(7, n);

    // Floats: exact, or one rounding at the target precision.
    assert_eq!(round_trip(GgmlType::F32, &x), x);
    for (a, b) in x.iter().zip(round_trip(GgmlType::F16, &x)) {
        assert!((a - b).abs() <= f16_err(*a), "F16: {a} -> {b}");
    }
    for (a, b) in x.iter().zip(round_trip(GgmlType::BF16, &x)) {
        assert!((a - b).abs() <= a.abs() / 256.0, "BF16: {a} -> {b}");
    }

    // Symmetric 32-blocks: d = A / k for the block's largest magnitude A. Values land
    // within half a step, except the value opposite in sign to the extreme, which can be
    // clipped a whole step. Plus the f16 error of d times the largest quant, plus f32
    // rounding.
    let sym = |k: f32, steps: f32| {
        move |b: &[f32]| {
            let d = absmax(b) / k;
            d * steps + k * f16_err(d) + absmax(b) * 1e-6
        }
    };
    let y = round_trip(GgmlType::Q4_0, &x);
    check_blocks(GgmlType::Q4_0, &x, &y, 32, sym(8.0, 1.0));
    let y = round_trip(GgmlType::Q5_0, &x);
    check_blocks(GgmlType::Q5_0, &x, &y, 32, sym(16.0, 1.0));
    for ty in [GgmlType::Q8_0, GgmlType::Q8_1] {
        let y = round_trip(ty, &x);
        check_blocks(ty, &x, &y, 32, sym(127.0, 0.5));
    }

    // Asymmetric 32-blocks: d = (max - min) / k, half a step plus the f16 errors of d
    // (times the largest quant) and of the min.
    let asym = |k: f32| {
        move |b: &[f32]| {
            let (lo, hi) = b
                .iter()
                .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
            let d = (hi - lo) / k;
            d * 0.5 + k * f16_err(d) + f16_err(lo) + absmax(b) * 1e-6
        }
    };
    let y = round_trip(GgmlType::Q4_1, &x);
    check_blocks(GgmlType::Q4_1, &x, &y, 32, asym(15.0));
    let y = round_trip(GgmlType::Q5_1, &x);
    check_blocks(GgmlType::Q5_1, &x, &y, 32, asym(31.0));

    // Q8_K: f32 scale, so only the rounding of the quants: half a step.
    let y = round_trip(GgmlType::Q8_K, &x);
    check_blocks(GgmlType::Q8_K, &x, &y, QK_K, |b| {
        absmax(b) / 127.0 * 0.5001 + 1e-30
    });
}

/// K formats: the error is bounded relative to the largest value of the super-block (its
/// sub-block scales are quantized against the largest one), and on data of one scale the
/// RMS error is close to that of a plain uniform quantizer with the same bits.
#[test]
fn k_quant_round_trip_bounds() {
    // Super-blocks whose sub-blocks share one scale: the usual case for weights.
    let mut rng = Rng(11);
    let x: Vec<f32> = (0..64 * QK_K).map(|_| rng.normal()).collect();
    let mut rels = Vec::new();
    for (ty, max_rel_rms) in [
        (GgmlType::Q4_K, 0.08),
        (GgmlType::Q5_K, 0.04),
        (GgmlType::Q6_K, 0.02),
    ] {
        let y = round_trip(ty, &x);
        let err2: f64 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let sig2: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
        let rel = (err2 / sig2).sqrt();
        assert!(rel < max_rel_rms, "{}: relative RMS error {rel}", ty.name());
        rels.push(rel);
    }
    // Each extra bit about halves the error.
    assert!(
        rels[1] < 0.6 * rels[0] && rels[2] < 0.6 * rels[1],
        "{rels:?}"
    );

    // Mixed scales within a super-block: bounded by a step of the largest sub-block.
    let x = test_data(13, 64 * QK_K);
    let y = round_trip(GgmlType::Q4_K, &x);
    check_blocks(GgmlType::Q4_K, &x, &y, QK_K, |b| {
        let (lo, hi) = b
            .iter()
            .fold((0f32, 0f32), |(l, h), &v| (l.min(v), h.max(v)));
        (hi - lo) / 15.0 * 1.1 + 1e-30
    });
    let y = round_trip(GgmlType::Q5_K, &x);
    check_blocks(GgmlType::Q5_K, &x, &y, QK_K, |b| {
        let (lo, hi) = b
            .iter()
            .fold((0f32, 0f32), |(l, h), &v| (l.min(v), h.max(v)));
        (hi - lo) / 31.0 * 1.1 + 1e-30
    });
    let y = round_trip(GgmlType::Q6_K, &x);
    check_blocks(GgmlType::Q6_K, &x, &y, QK_K, |b| {
        absmax(b) / 32.0 * 1.1 + 1e-30
    });
}

/// The awkward rows of the Python fixtures (zeros, -0, constants, huge and tiny blocks)
/// through the formats Python cannot quantize.
#[test]
fn k_quants_on_awkward_rows() {
    let fx = load("q8_0");
    let rows = fx.cases[0].input.as_ref().unwrap();
    assert_eq!(rows[0].len() % QK_K, 0);
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
    ] {
        for x in rows {
            let y = round_trip(ty, x);
            assert!(
                y.iter().all(|v| v.is_finite()),
                "{}: non-finite output",
                ty.name()
            );
            for (sb, (xs, ys)) in x.chunks(QK_K).zip(y.chunks(QK_K)).enumerate() {
                let bound = absmax(xs) / 7.0;
                for (a, b) in xs.iter().zip(ys) {
                    assert!(
                        (a - b).abs() <= bound,
                        "{}: super-block {sb}: {a} -> {b}",
                        ty.name()
                    );
                }
            }
        }
    }
}

#[test]
fn q8_1_quants_equal_q8_0() {
    let x = test_data(17, 32 * 40);
    let a = quantize(GgmlType::Q8_0, &x).unwrap();
    let b = quantize(GgmlType::Q8_1, &x).unwrap();
    for (qa, qb) in a.chunks(34).zip(b.chunks(36)) {
        assert_eq!(qa[..2], qb[..2], "d");
        assert_eq!(qa[2..], qb[4..], "quants");
    }
    assert_eq!(
        dequantize(GgmlType::Q8_0, &a, x.len()).unwrap(),
        dequantize(GgmlType::Q8_1, &b, x.len()).unwrap()
    );
}

// ------------------------------------------------------------------ odd inputs

#[test]
fn zero_rows_give_zeros() {
    for ty in ALL.into_iter().filter(|&t| can_quantize(t)) {
        let n = 2 * QK_K;
        let y = round_trip(ty, &vec![0.0; n]);
        assert!(y.iter().all(|&v| v == 0.0), "{}: {:?}", ty.name(), &y[..8]);
    }
}

#[test]
fn constant_rows_stay_close() {
    for ty in ALL.into_iter().filter(|&t| can_quantize(t)) {
        // Magnitudes where the f16 scales stay normal (tiny blocks are covered elsewhere).
        for c in [0.7f32, -3.25, 0.1, 1000.0, 20000.0] {
            let y = round_trip(ty, &vec![c; QK_K]);
            for v in y {
                assert!((v - c).abs() <= c.abs() * 0.01, "{}: {c} -> {v}", ty.name());
            }
        }
    }
}

#[test]
fn non_finite_input_does_not_panic() {
    for ty in ALL.into_iter().filter(|&t| can_quantize(t)) {
        for bad in [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            -f32::MAX,
        ] {
            let mut x = test_data(19, QK_K);
            x[3] = bad;
            let q = quantize(ty, &x).unwrap();
            dequantize(ty, &q, x.len()).unwrap();
            let all = vec![bad; QK_K];
            let q = quantize(ty, &all).unwrap();
            dequantize(ty, &q, all.len()).unwrap();
        }
    }
}

#[test]
fn arbitrary_bytes_decode_without_panic() {
    let mut rng = Rng(23);
    for ty in ALL {
        let bytes: Vec<u8> = (0..ty.row_bytes(4 * QK_K).unwrap())
            .map(|_| rng.next_u64() as u8)
            .collect();
        assert_eq!(dequantize(ty, &bytes, 4 * QK_K).unwrap().len(), 4 * QK_K);
    }
}

#[test]
fn empty_rows() {
    for ty in ALL {
        dequantize_row(ty, &[], &mut []).unwrap();
        assert!(dequantize(ty, &[], 0).unwrap().is_empty());
        if can_quantize(ty) {
            quantize_row(ty, &[], &mut []).unwrap();
            assert!(quantize(ty, &[]).unwrap().is_empty());
        }
    }
}

#[test]
fn supported_types() {
    assert!(ALL.iter().all(|&t| can_dequantize(t)));
    let no_quant: Vec<_> = ALL
        .iter()
        .filter(|&&t| !can_quantize(t))
        .map(|t| t.name())
        .collect();
    assert_eq!(no_quant, ["Q2_K", "Q3_K"]);
}

// ------------------------------------------------------------------ errors

#[test]
fn ragged_rows_are_errors() {
    for ty in ALL.into_iter().filter(|t| t.block_size() > 1) {
        let n = ty.block_size() + 1;
        let bytes = vec![0u8; ty.type_size() * 2];
        let err = dequantize_row(ty, &bytes, &mut vec![0.0; n]).unwrap_err();
        assert!(
            matches!(err, QuantError::RaggedRow { n: 33 | 257, .. }),
            "{err}"
        );
        assert!(matches!(
            dequantize(ty, &bytes, n),
            Err(QuantError::RaggedRow { .. })
        ));
        if can_quantize(ty) {
            let err =
                quantize_row(ty, &vec![0.0; n], &mut vec![0u8; ty.type_size() * 2]).unwrap_err();
            assert!(matches!(err, QuantError::RaggedRow { .. }), "{err}");
            assert!(matches!(
                quantize(ty, &vec![0.0; n]),
                Err(QuantError::RaggedRow { .. })
            ));
        }
    }
}

#[test]
fn wrong_byte_lengths_are_errors() {
    for ty in ALL {
        let n = 2 * QK_K;
        let right = ty.row_bytes(n).unwrap();
        for got in [0, right - 1, right + 1, right + ty.type_size()] {
            let err = dequantize_row(ty, &vec![0u8; got], &mut vec![0.0; n]).unwrap_err();
            assert_eq!(
                err,
                QuantError::WrongByteLength {
                    ty: ty.name(),
                    n,
                    expected: right,
                    got
                }
            );
            assert!(dequantize(ty, &vec![0u8; got], n).is_err());
            if can_quantize(ty) {
                let err = quantize_row(ty, &vec![0.0; n], &mut vec![0u8; got]).unwrap_err();
                assert_eq!(
                    err,
                    QuantError::WrongByteLength {
                        ty: ty.name(),
                        n,
                        expected: right,
                        got
                    }
                );
            }
        }
    }
}

#[test]
fn absurd_counts_are_errors_not_overflow() {
    for ty in ALL {
        let block = ty.block_size();
        let n = usize::MAX / block * block;
        assert!(matches!(
            dequantize(ty, &[0u8; 64], n),
            Err(QuantError::WrongByteLength { .. })
        ));
    }
}

#[test]
fn unsupported_quantization() {
    for ty in [GgmlType::Q2_K, GgmlType::Q3_K] {
        let x = vec![0.0; QK_K];
        let want = QuantError::Unsupported {
            ty: ty.name(),
            what: "quantization",
        };
        assert_eq!(quantize(ty, &x).unwrap_err(), want);
        assert_eq!(
            quantize_row(ty, &x, &mut vec![0u8; ty.type_size()]).unwrap_err(),
            want
        );
        // Unsupported wins over a length problem.
        assert_eq!(quantize_row(ty, &x[..5], &mut []).unwrap_err(), want);
    }
}
