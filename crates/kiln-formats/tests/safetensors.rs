//! safetensors sets: single files, sharded indexes, and every defect as an error naming the
//! file (and tensor) — never a panic.

use std::path::{Path, PathBuf};

use kiln_formats::{SafetensorsSet, StDtype};

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-st-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A safetensors file of (name, dtype, shape, bytes).
fn write(path: &Path, tensors: &[(&str, &str, &[u64], Vec<u8>)]) {
    let mut header = String::from("{");
    let mut data = Vec::new();
    for (i, (name, dt, shape, b)) in tensors.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header += &format!(
            "\"{name}\":{{\"dtype\":\"{dt}\",\"shape\":{shape:?},\"data_offsets\":[{},{}]}}",
            data.len(),
            data.len() + b.len()
        );
        data.extend_from_slice(b);
    }
    header.push('}');
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn single_file() {
    let d = dir("one");
    write(
        &d.join("model.safetensors"),
        &[
            ("a", "F32", &[2, 2], f32s(&[1., 2., 3., 4.])),
            ("b", "BF16", &[3], vec![0; 6]),
        ],
    );
    let s = SafetensorsSet::open_dir(&d).unwrap();
    assert_eq!(s.len(), 2);
    let a = s.tensor("a").unwrap();
    assert_eq!((a.dtype, a.shape.clone()), (StDtype::F32, vec![2, 2]));
    assert_eq!(s.data(a), &f32s(&[1., 2., 3., 4.])[..]);
    assert_eq!(s.tensor("b").unwrap().n_bytes(), 6);
}

#[test]
fn sharded_index() {
    let d = dir("shards");
    write(
        &d.join("m-1.safetensors"),
        &[("x", "F32", &[1], f32s(&[5.]))],
    );
    write(
        &d.join("m-2.safetensors"),
        &[("y", "F16", &[2], vec![0, 60, 0, 64])],
    );
    std::fs::write(
        d.join("model.safetensors.index.json"),
        r#"{"metadata": {}, "weight_map": {"x": "m-1.safetensors", "y": "m-2.safetensors"}}"#,
    )
    .unwrap();
    let s = SafetensorsSet::open_dir(&d).unwrap();
    let y = s.tensor("y").unwrap();
    assert!(s.path_of(y).ends_with("m-2.safetensors"));
    assert_eq!(s.data(s.tensor("x").unwrap()), &f32s(&[5.])[..]);
}

#[test]
fn defects_are_errors_naming_the_file() {
    // Truncated data.
    let d = dir("trunc");
    let f = d.join("model.safetensors");
    write(&f, &[("a", "F32", &[4], f32s(&[1., 2., 3., 4.]))]);
    let b = std::fs::read(&f).unwrap();
    std::fs::write(&f, &b[..b.len() - 3]).unwrap();
    let e = SafetensorsSet::open_dir(&d).err().unwrap().to_string();
    assert!(
        e.contains("model.safetensors") && e.contains("safetensors"),
        "{e}"
    );

    // Size that does not match dtype x shape.
    let d = dir("size");
    write(
        &d.join("model.safetensors"),
        &[("a", "F32", &[3], vec![0; 8])],
    );
    assert!(SafetensorsSet::open_dir(&d).is_err());

    // Header length past the file.
    let d = dir("header");
    std::fs::write(d.join("model.safetensors"), 1_000_000u64.to_le_bytes()).unwrap();
    let e = SafetensorsSet::open_dir(&d).err().unwrap().to_string();
    assert!(e.contains("model.safetensors"), "{e}");

    // Not even 8 bytes.
    let d = dir("tiny");
    std::fs::write(d.join("model.safetensors"), b"abc").unwrap();
    assert!(SafetensorsSet::open_dir(&d).is_err());

    // Unsupported dtype names the tensor.
    let d = dir("dtype");
    write(
        &d.join("model.safetensors"),
        &[("z", "F8_E4M3", &[2], vec![0; 2])],
    );
    let e = SafetensorsSet::open_dir(&d).err().unwrap().to_string();
    assert!(e.contains("'z'") && e.contains("F8_E4M3"), "{e}");

    // The same tensor in two shards.
    let d = dir("dup");
    write(&d.join("a.safetensors"), &[("w", "F32", &[1], f32s(&[1.]))]);
    write(&d.join("b.safetensors"), &[("w", "F32", &[1], f32s(&[2.]))]);
    let e = SafetensorsSet::open_dir(&d).err().unwrap().to_string();
    assert!(e.contains("'w'") && e.contains("also stored in"), "{e}");

    // Index problems: a shard outside the directory, a missing shard, no weight_map.
    let d = dir("index");
    let idx = d.join("model.safetensors.index.json");
    std::fs::write(&idx, r#"{"weight_map": {"w": "../evil.safetensors"}}"#).unwrap();
    let e = SafetensorsSet::open_dir(&d).err().unwrap().to_string();
    assert!(e.contains("plain file name"), "{e}");
    std::fs::write(&idx, r#"{"weight_map": {"w": "gone.safetensors"}}"#).unwrap();
    let e = SafetensorsSet::open_dir(&d).err().unwrap().to_string();
    assert!(e.contains("gone.safetensors"), "{e}");
    std::fs::write(&idx, r#"{"metadata": {}}"#).unwrap();
    let e = SafetensorsSet::open_dir(&d).err().unwrap().to_string();
    assert!(e.contains("weight_map"), "{e}");

    // A directory with no weights at all.
    let d = dir("empty");
    let e = SafetensorsSet::open_dir(&d).err().unwrap().to_string();
    assert!(e.contains("no .safetensors"), "{e}");
}
