//! PyTorch checkpoints written by real PyTorch (2.11, `tools/make_torch_fixtures.py`) read
//! back exactly: a nested dict holding an OrderedDict of f32 / f16 / bf16 / int64 / scalar
//! tensors (a transposed and a sliced view of one storage among them) and weight-norm g / v
//! pairs; a bare tensor (a voice). `expected.json` holds PyTorch's own values, widened to f32.

use std::path::PathBuf;

use kiln_formats::read_torch;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/torch")).join(name)
}

fn expected() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixture("expected.json")).unwrap()).unwrap()
}

fn check(name: &str, t: &kiln_formats::TorchTensor, want: &serde_json::Value) {
    let shape: Vec<usize> = want["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(t.shape, shape, "{name}: shape");
    assert_eq!(
        t.dtype.name(),
        want["dtype"].as_str().unwrap(),
        "{name}: dtype"
    );
    // Exact in f32 (serde_json's f64 parse may be an ulp of f64 off the printed value; every
    // value is an f32, so rounding it back to f32 is exact).
    let values: Vec<f32> = want["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(t.data, values, "{name}: values");
}

#[test]
fn a_nested_state_dict_matches_pytorch() {
    let want = expected();
    let tensors = read_torch(fixture("state.pth")).unwrap();
    let mut n = 0;
    for section in ["bert", "decoder"] {
        for (key, w) in want[section].as_object().unwrap() {
            let name = format!("{section}.{key}");
            let t = tensors
                .iter()
                .find(|(n, _)| *n == name)
                .unwrap_or_else(|| panic!("{name} missing"));
            check(&name, &t.1, w);
            n += 1;
        }
    }
    assert_eq!(n, tensors.len(), "every tensor is expected");
    // File order is kept.
    assert_eq!(tensors[0].0, "bert.a.weight");
    assert_eq!(tensors[4].0, "bert.e.transposed");
}

#[test]
fn a_bare_tensor_matches_pytorch() {
    let want = expected();
    let tensors = read_torch(fixture("voice.pt")).unwrap();
    assert_eq!(tensors.len(), 1);
    assert_eq!(tensors[0].0, "");
    check("voice", &tensors[0].1, &want["voice"]);
}

#[test]
fn every_truncation_is_an_error() {
    let b = std::fs::read(fixture("voice.pt")).unwrap();
    for n in 0..b.len() {
        let e = kiln_formats::parse_torch(std::path::Path::new("cut.pt"), &b[..n]);
        assert!(e.is_err(), "{n} bytes parsed");
    }
}
