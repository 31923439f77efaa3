use kiln_formats::{FormatError, GgufFile, GgufWriter, Value};
use kiln_quant::GgmlType;

fn tmp(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn sample() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("llama".into()))
        .meta("u8", Value::U8(7))
        .meta("i8", Value::I8(-7))
        .meta("u16", Value::U16(65535))
        .meta("i16", Value::I16(-300))
        .meta("u32", Value::U32(4_000_000_000))
        .meta("i32", Value::I32(-5))
        .meta("f32", Value::F32(1.5))
        .meta("bool", Value::Bool(true))
        .meta("u64", Value::U64(u64::MAX))
        .meta("i64", Value::I64(i64::MIN))
        .meta("f64", Value::F64(-2.25))
        .meta("utf8", Value::String("héllo 世界 🦀".into()))
        .meta(
            "nested",
            Value::Array(vec![
                Value::Array(vec![Value::I32(1), Value::I32(2)]),
                Value::Array(vec![Value::I32(3)]),
            ]),
        )
        .meta(
            "strings",
            Value::Array(vec![Value::String("a".into()), Value::String("".into())]),
        )
        .meta("empty", Value::Array(vec![]));
    let f: Vec<u8> = (0..64).flat_map(|i| (i as f32).to_le_bytes()).collect();
    w.tensor("a", &[16, 4], GgmlType::F32, f);
    w.tensor("b", &[32], GgmlType::Q8_0, vec![0u8; 34]);
    w
}

#[test]
fn round_trip_every_value_type() {
    let w = sample();
    let p = tmp("rt.gguf", &w.to_bytes());
    let g = GgufFile::open(&p).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.architecture().unwrap(), "llama");
    assert_eq!(g.get("u8"), Some(&Value::U8(7)));
    assert_eq!(g.get("i8"), Some(&Value::I8(-7)));
    assert_eq!(g.get("u16"), Some(&Value::U16(65535)));
    assert_eq!(g.get("i16"), Some(&Value::I16(-300)));
    assert_eq!(g.get_u64("u32").unwrap(), 4_000_000_000);
    assert_eq!(g.get("i32"), Some(&Value::I32(-5)));
    assert_eq!(g.get_f64("f32").unwrap(), 1.5);
    assert_eq!(g.opt_bool("bool").unwrap(), Some(true));
    assert_eq!(g.get_u64("u64").unwrap(), u64::MAX);
    assert_eq!(g.get("i64"), Some(&Value::I64(i64::MIN)));
    assert_eq!(g.get_f64("f64").unwrap(), -2.25);
    assert_eq!(g.get_str("utf8").unwrap(), "héllo 世界 🦀");
    let nested = g.get_array("nested").unwrap();
    assert_eq!(nested[0], Value::Array(vec![Value::I32(1), Value::I32(2)]));
    assert_eq!(
        g.get_array("strings").unwrap()[1],
        Value::String(String::new())
    );
    assert!(g.get_array("empty").unwrap().is_empty());
    let a = g.tensor("a").unwrap();
    assert_eq!(a.dims, vec![16, 4]);
    assert_eq!(a.ty, GgmlType::F32);
    assert_eq!(a.offset % 32, 0);
    let data = g.tensor_data(a);
    assert_eq!(f32::from_le_bytes(data[4 * 63..].try_into().unwrap()), 63.0);
    assert_eq!(g.tensor("b").unwrap().n_bytes, 34);
    // Wrong type and missing keys are errors, not panics.
    assert!(matches!(
        g.get_str("u8"),
        Err(FormatError::WrongType { .. })
    ));
    assert!(matches!(
        g.get_u64("nope"),
        Err(FormatError::MissingKey { .. })
    ));
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample().to_bytes();
    for len in 0..bytes.len() {
        let p = tmp("trunc.gguf", &bytes[..len]);
        let err = GgufFile::open(&p)
            .err()
            .unwrap_or_else(|| panic!("prefix {len} parsed"));
        let msg = err.to_string();
        assert!(msg.contains("trunc.gguf"), "{msg}");
    }
}

#[test]
fn tensor_past_the_end() {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("llama".into()));
    w.tensor("big", &[64], GgmlType::F32, vec![0u8; 64 * 4]);
    let mut bytes = w.to_bytes();
    bytes.truncate(bytes.len() - 4);
    let err = GgufFile::open(tmp("oob.gguf", &bytes))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("tensor 'big'") && err.contains("past the end"),
        "{err}"
    );
}

#[test]
fn bad_headers() {
    let err = GgufFile::open(tmp("rand.bin", b"\x7fELF random bytes here"))
        .err()
        .unwrap();
    assert!(err.to_string().contains("not a GGUF file"), "{err}");
    let mut h = b"GGUF".to_vec();
    h.extend_from_slice(&3u32.to_le_bytes());
    h.extend_from_slice(&u64::MAX.to_le_bytes()); // absurd tensor count
    h.extend_from_slice(&0u64.to_le_bytes());
    let err = GgufFile::open(tmp("absurd.gguf", &h))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("tensor count"), "{err}");
    let mut h = b"GGUF".to_vec();
    h.extend_from_slice(&9u32.to_le_bytes());
    let err = GgufFile::open(tmp("v9.gguf", &h))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("unsupported GGUF version 9"), "{err}");
    let err = GgufFile::open("/definitely/not/here.gguf")
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("/definitely/not/here.gguf"), "{err}");
}

#[test]
fn random_bytes_never_panic() {
    // A deterministic xorshift stream mutating a valid file: every outcome must be Ok or Err.
    let base = sample().to_bytes();
    let mut s = 0x9e3779b97f4a7c15u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for i in 0..400 {
        let mut b = base.clone();
        for _ in 0..(1 + i % 8) {
            let pos = (next() % b.len() as u64) as usize;
            b[pos] = next() as u8;
        }
        let _ = GgufFile::open(tmp("fuzz.gguf", &b));
    }
}
