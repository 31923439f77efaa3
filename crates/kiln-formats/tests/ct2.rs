//! CTranslate2 model.bin: a file written here (every truncation point must be an error, never
//! a panic), and the real Whisper tiny.en file.

use kiln_formats::{Ct2Dtype, Ct2File, FormatError};

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend(((s.len() + 1) as u16).to_le_bytes());
    out.extend(s.as_bytes());
    out.push(0);
}

/// A version-6 file: a (2, 3) f16 matrix, an int16 scalar, an alias.
fn sample() -> Vec<u8> {
    let mut f = Vec::new();
    f.extend(6u32.to_le_bytes());
    string(&mut f, "TestSpec");
    f.extend(3u32.to_le_bytes());
    f.extend(2u32.to_le_bytes());
    string(&mut f, "enc/w");
    f.push(2);
    f.extend(2u32.to_le_bytes());
    f.extend(3u32.to_le_bytes());
    f.push(4);
    f.extend(12u32.to_le_bytes());
    for v in [1.0f32, -2.0, 0.5, 3.0, 0.25, -1.5] {
        f.extend(half::f16::from_f32(v).to_le_bytes());
    }
    string(&mut f, "enc/num_heads");
    f.push(0);
    f.push(2);
    f.extend(2u32.to_le_bytes());
    f.extend(6i16.to_le_bytes());
    f.extend(1u32.to_le_bytes());
    string(&mut f, "dec/w");
    string(&mut f, "enc/w");
    f
}

fn write(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-ct2-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn reads_variables_scalars_and_aliases() {
    let p = write("ok.bin", &sample());
    let f = Ct2File::open(&p).unwrap();
    assert_eq!((f.version, f.spec.as_str(), f.revision), (6, "TestSpec", 3));
    let w = f.var("dec/w").unwrap();
    assert_eq!(w.name, "enc/w");
    assert_eq!((w.shape.clone(), w.dtype), (vec![2, 3], Ct2Dtype::F16));
    assert_eq!(
        f.f32_values(w).unwrap(),
        vec![1.0, -2.0, 0.5, 3.0, 0.25, -1.5]
    );
    assert_eq!(f.scalar_i64("enc/num_heads").unwrap(), 6);
    assert!(f.scalar_i64("enc/w").is_err());
    assert!(f.var("nope").is_none());
}

#[test]
fn every_truncation_and_corruption_is_an_error() {
    let full = sample();
    for cut in 0..full.len() {
        let p = write("cut.bin", &full[..cut]);
        let e = Ct2File::open(&p)
            .err()
            .unwrap_or_else(|| panic!("cut at {cut} opened"));
        let msg = e.to_string();
        assert!(msg.contains("cut.bin"), "{msg}");
    }
    // A byte count that disagrees with the shape names the tensor.
    let mut bad = full.clone();
    let at = 4 + 2 + 9 + 4 + 4 + 2 + 6 + 1 + 8 + 1; // the first variable's n_bytes
    bad[at] = 10;
    let e = Ct2File::open(write("bad.bin", &bad)).err().unwrap();
    assert!(
        matches!(&e, FormatError::Tensor { name, .. } if name == "enc/w"),
        "{e}"
    );
    // Unknown version, trailing junk.
    let mut v = full.clone();
    v[0] = 99;
    assert!(Ct2File::open(write("v.bin", &v)).is_err());
    let mut t = full.clone();
    t.push(0);
    assert!(Ct2File::open(write("t.bin", &t)).is_err());
}

#[test]
fn real_whisper_tiny_en() {
    let dir = kiln_assets::resolve("whisper-tiny.en", &mut |_| {}).unwrap();
    let dir = if dir.is_dir() {
        dir
    } else {
        dir.parent().unwrap().into()
    };
    let f = Ct2File::open(dir.join("model.bin")).unwrap();
    assert_eq!((f.version, f.spec.as_str()), (6, "WhisperSpec"));
    assert_eq!(f.vars.len(), 148);
    let emb = f.var("decoder/projection/weight").unwrap();
    assert_eq!(emb.name, "decoder/embeddings/weight");
    assert_eq!(emb.shape, vec![51864, 384]);
    assert_eq!(f.scalar_i64("encoder/num_heads").unwrap(), 6);
    assert_eq!(
        f.var("encoder/conv1/weight").unwrap().shape,
        vec![384, 80, 3]
    );
}

/// Four dims of 65536 make 2^64 elements: the unchecked product wrapped to 0 in release
/// builds, so a header claiming no bytes for them was accepted (found reviewing the parsers
/// for the fuzz targets).
#[test]
fn a_shape_whose_size_overflows_is_an_error() {
    let mut b = 6u32.to_le_bytes().to_vec();
    string(&mut b, "Spec");
    b.extend(1u32.to_le_bytes()); // revision
    b.extend(1u32.to_le_bytes()); // one variable
    string(&mut b, "w");
    b.push(4);
    for _ in 0..4 {
        b.extend(65536u32.to_le_bytes());
    }
    b.push(0); // float32
    b.extend(0u32.to_le_bytes()); // "0 bytes"
    b.extend(0u32.to_le_bytes()); // no aliases
    let e = Ct2File::from_bytes("wrap.bin", b)
        .err()
        .expect("must fail")
        .to_string();
    assert!(
        e.contains("wrap.bin") && e.contains("'w'") && e.contains("needs"),
        "{e}"
    );
}
