//! NumPy `.npy` arrays (little-endian f32, C order) and `.npz` archives of them (zip, stored
//! or deflated members are told apart; only stored members are read; see [`crate::zip`]).

use std::path::Path;

use crate::FormatError;

#[derive(Debug, Clone)]
pub struct NpyArray {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

fn invalid(path: &Path, what: String) -> FormatError {
    FormatError::Invalid {
        path: path.to_path_buf(),
        what,
    }
}

/// Parses one `.npy` image; `what` names it in errors (a file or an archive member).
pub fn parse_npy(path: &Path, what: &str, b: &[u8]) -> Result<NpyArray, FormatError> {
    let bad = |why: &str| invalid(path, format!("{what}: {why}"));
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        return Err(bad("not a .npy array (no magic)"));
    }
    let (hlen, start): (usize, usize) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
        v => return Err(bad(&format!("unsupported .npy version {v}"))),
    };
    let header = b
        .get(start..start.saturating_add(hlen))
        .ok_or_else(|| bad("header runs past the end"))?;
    let header = String::from_utf8_lossy(header);
    let field = |key: &str| -> Option<String> {
        let i = header.find(&format!("'{key}'"))?;
        let rest = &header[i + key.len() + 2..];
        let rest = rest.trim_start().strip_prefix(':')?.trim_start();
        Some(rest.to_string())
    };
    let descr = field("descr").ok_or_else(|| bad("header has no descr"))?;
    if !descr.starts_with("'<f4'") {
        return Err(bad(&format!(
            "dtype {} (only little-endian float32 is read)",
            descr.split(',').next().unwrap_or("")
        )));
    }
    if field("fortran_order").is_some_and(|v| v.starts_with("True")) {
        return Err(bad("Fortran-order arrays are not read"));
    }
    let shape_s = field("shape").ok_or_else(|| bad("header has no shape"))?;
    let inner = shape_s
        .strip_prefix('(')
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| bad("malformed shape"))?;
    let mut shape = Vec::new();
    for d in inner.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        shape.push(
            d.parse::<usize>()
                .map_err(|_| bad(&format!("bad dimension '{d}'")))?,
        );
    }
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad("shape overflows"))?;
    let body = &b[start + hlen..];
    if n.checked_mul(4) != Some(body.len()) {
        return Err(bad(&format!(
            "{} data bytes, shape {shape:?} of f32 needs {}",
            body.len(),
            n.saturating_mul(4)
        )));
    }
    let data = body
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok(NpyArray { shape, data })
}

pub fn read_npy(path: impl AsRef<Path>) -> Result<NpyArray, FormatError> {
    let path = path.as_ref();
    let b = std::fs::read(path).map_err(|source| FormatError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_npy(path, "array", &b)
}

/// The members of an `.npz` archive: (name without `.npy`, array).
pub fn read_npz(path: impl AsRef<Path>) -> Result<Vec<(String, NpyArray)>, FormatError> {
    let path = path.as_ref();
    let b = std::fs::read(path).map_err(|source| FormatError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_npz(path, &b)
}

/// The members of an `.npz` image held in memory; `path` names it in errors.
pub fn parse_npz(path: &Path, b: &[u8]) -> Result<Vec<(String, NpyArray)>, FormatError> {
    let members = crate::zip::members(path, b).map_err(|e| match e {
        FormatError::Invalid { what, .. } if what.contains("no end of central directory") => {
            invalid(path, "not an .npz archive (no zip entries)".into())
        }
        e => e,
    })?;
    let mut out = Vec::new();
    for m in members {
        if m.method != 0 {
            return Err(invalid(
                path,
                format!(
                    "member '{}' is compressed (method {}); save with np.savez, not savez_compressed",
                    m.name, m.method
                ),
            ));
        }
        let key = m.name.strip_suffix(".npy").unwrap_or(&m.name).to_string();
        out.push((key, parse_npy(path, &m.name, m.data(b))?));
    }
    if out.is_empty() {
        return Err(invalid(path, "not an .npz archive (no zip entries)".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(shape: &str, vals: &[f32]) -> Vec<u8> {
        let mut h = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend((h.len() as u16).to_le_bytes());
        b.extend(h.as_bytes());
        b.extend(vals.iter().flat_map(|v| v.to_le_bytes()));
        b
    }

    #[test]
    fn parses_and_rejects() {
        let p = Path::new("t.npy");
        let a = parse_npy(p, "t", &npy("(2, 1, 2)", &[1., 2., 3., 4.])).unwrap();
        assert_eq!(a.shape, vec![2, 1, 2]);
        assert_eq!(a.data, vec![1., 2., 3., 4.]);
        let e = parse_npy(p, "t", &npy("(2, 3)", &[1., 2.]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("data bytes"), "{e}");
        let e = parse_npy(p, "t", b"garbage!!!!!").unwrap_err().to_string();
        assert!(e.contains("magic"), "{e}");
    }

    /// 2^62 floats need 2^64 bytes: `n * 4` wrapped to 0 in release builds and an empty
    /// body passed for them (found reviewing the parsers for the fuzz targets).
    #[test]
    fn a_shape_whose_size_overflows_is_an_error() {
        let p = Path::new("wrap.npy");
        let e = parse_npy(p, "t", &npy("(4611686018427387904,)", &[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("0 data bytes"), "{e}");
    }
}
