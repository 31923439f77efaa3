//! whisper.cpp ggml `.bin`: a file written here (hparams, filters, vocabulary, f32/f16/q8_0
//! tensors; every truncation point and a few corruptions are errors, never panics).

use kiln_formats::{is_whisper_ggml, FormatError, WhisperGgmlFile};
use kiln_quant::GgmlType;

fn i32s(out: &mut Vec<u8>, v: &[i32]) {
    for x in v {
        out.extend(x.to_le_bytes());
    }
}

fn tensor(out: &mut Vec<u8>, name: &str, ty: i32, dims: &[i32], data: &[u8]) {
    i32s(out, &[dims.len() as i32, name.len() as i32, ty]);
    i32s(out, dims);
    out.extend(name.as_bytes());
    out.extend(data);
}

/// hparams of a toy model, a 2 x 3 filterbank, 3 tokens, then a (1, 4) f32 bias, a (2, 3)
/// f16 matrix and a (32) q8_0 row.
fn sample() -> Vec<u8> {
    let mut f = Vec::new();
    f.extend(0x6767_6d6cu32.to_le_bytes());
    i32s(&mut f, &[51864, 1500, 384, 6, 4, 448, 384, 6, 4, 80, 1007]);
    i32s(&mut f, &[2, 3]);
    for v in [0.0f32, 0.5, 1.0, 1.5, 2.0, 2.5] {
        f.extend(v.to_le_bytes());
    }
    i32s(&mut f, &[3]);
    for t in [&b"a"[..], b" the", b"\xe2\x96"] {
        f.extend((t.len() as u32).to_le_bytes());
        f.extend(t);
    }
    let bias: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    tensor(&mut f, "encoder.conv1.bias", 0, &[1, 4], &bias);
    let m: Vec<u8> = [1.0f32, -2.0, 0.5, 3.0, 0.25, -1.5]
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    tensor(&mut f, "w", 1, &[3, 2], &m);
    let row: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
    let q = kiln_quant::quantize(GgmlType::Q8_0, &row).unwrap();
    tensor(&mut f, "q", 8, &[32], &q);
    f
}

fn path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-ggml-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn reads_hparams_vocabulary_and_tensors() {
    let p = path("ok.bin");
    std::fs::write(&p, sample()).unwrap();
    let f = WhisperGgmlFile::open(&p).unwrap();
    let h = f.hparams;
    assert_eq!(
        (h.n_vocab, h.n_audio_state, h.n_text_layer, h.n_mels),
        (51864, 384, 4, 80)
    );
    assert_eq!((h.ftype, h.qnt_version), (7, 1));
    assert_eq!((f.mel_filters.0, f.mel_filters.1), (2, 3));
    assert_eq!(f.mel_filters(), vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
    assert_eq!(f.tokens.len(), 3);
    assert_eq!(f.token(1), Some(&b" the"[..]));
    assert_eq!(f.token(2), Some(&b"\xe2\x96"[..]));
    assert_eq!(f.token(3), None);
    let b = f.tensor("encoder.conv1.bias").unwrap();
    assert_eq!(
        (b.dims.clone(), b.shape(), b.ty),
        (vec![1, 4], vec![4, 1], GgmlType::F32)
    );
    let w = f.tensor("w").unwrap();
    assert_eq!(
        (w.shape(), w.ty, f.data(w).len()),
        (vec![2, 3], GgmlType::F16, 12)
    );
    let q = f.tensor("q").unwrap();
    let back = kiln_quant::dequantize(q.ty, f.data(q), 32).unwrap();
    assert!(
        (back[0] + 16.0).abs() < 0.1 && (back[31] - 15.0).abs() < 0.1,
        "{back:?}"
    );
    assert!(is_whisper_ggml(&sample()));
}

/// Tensors run to the end of the file, so a cut between two of them is a shorter file of
/// whole tensors (the model loader then names the first missing one); any other cut is an
/// error.
#[test]
fn every_truncation_is_an_error() {
    let full = sample();
    let whole = WhisperGgmlFile::from_bytes("full.bin", full.clone()).unwrap();
    let ends: Vec<usize> = whole
        .tensors
        .iter()
        .map(|t| (t.offset + t.n_bytes) as usize)
        .collect();
    for cut in 0..full.len() {
        let r = WhisperGgmlFile::from_bytes("cut.bin", full[..cut].to_vec());
        if ends.contains(&cut) {
            let f = r.unwrap();
            assert_eq!(
                f.tensors.len(),
                ends.iter().position(|&e| e == cut).unwrap() + 1
            );
            continue;
        }
        let e = r.err().unwrap_or_else(|| panic!("cut at {cut} parsed"));
        let msg = e.to_string();
        assert!(msg.starts_with("cut.bin: "), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
    }
}

#[test]
fn corrupt_headers_are_errors() {
    let s = sample();
    let at = |needle: &[u8]| s.windows(needle.len()).position(|w| w == needle).unwrap();
    let mut bad_magic = s.clone();
    bad_magic[0] = b'x';
    assert!(matches!(
        WhisperGgmlFile::from_bytes("m.bin", bad_magic),
        Err(FormatError::NotFormat { .. })
    ));
    // A tensor type ggml does not have.
    let mut bad_type = s.clone();
    let w = at(b"w\x00\x3c") - 4 * 5; // n_dims, name_len, type, dims[2] precede the name
    bad_type[w + 8..w + 12].copy_from_slice(&77i32.to_le_bytes());
    let e = WhisperGgmlFile::from_bytes("t.bin", bad_type)
        .err()
        .unwrap();
    assert!(e.to_string().contains("unknown ggml type id 77"), "{e}");
    // A q8_0 row that is not whole blocks.
    let mut bad_row = s.clone();
    let q = s.len() - 34 - 1 - 4;
    bad_row[q..q + 4].copy_from_slice(&33i32.to_le_bytes());
    let e = WhisperGgmlFile::from_bytes("r.bin", bad_row).err().unwrap();
    assert!(e.to_string().contains("not whole Q8_0 blocks"), "{e}");
    // A vocabulary size larger than the file.
    let mut big = s.clone();
    let v = 4 + 11 * 4 + 8 + 24;
    big[v..v + 4].copy_from_slice(&1_000_000i32.to_le_bytes());
    let e = WhisperGgmlFile::from_bytes("v.bin", big).err().unwrap();
    assert!(e.to_string().contains("vocabulary"), "{e}");
    // Negative counts.
    let mut neg = s.clone();
    neg[4..8].copy_from_slice(&(-5i32).to_le_bytes());
    assert!(WhisperGgmlFile::from_bytes("n.bin", neg).is_err());
}
