//! Will it fit? Models are refused before loading when the machine lacks the memory they
//! need, with a message that says how much that is.

use crate::RuntimeError;

/// Bytes a new allocation can have now: the memory limit option (`--memory-limit`,
/// `KILN_MEMORY_LIMIT`) when set, else Linux's
/// MemAvailable; `None` where neither is known (then nothing is refused).
pub fn available_bytes() -> Option<u64> {
    if let Some(v) = kiln_backend::options::get().memory_limit {
        return Some(v);
    }
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Errors unless the weights of GGUF `file` (read as `g`; each matrix at `quant`'s bytes per
/// value when requantized at load) fit in what is available: they are copied out of the
/// mapping (repacked for the kernels), about the file's size.
pub fn check_gguf_fits(
    g: &kiln_formats::GgufFile,
    quant: Option<kiln_quant::GgmlType>,
    file: &std::path::Path,
) -> Result<(), RuntimeError> {
    let need: u64 = g
        .tensors
        .iter()
        .map(|t| match quant {
            Some(q) if t.dims.len() == 2 => q.checked_bytes(t.n_elements()).unwrap_or(t.n_bytes),
            _ => t.n_bytes,
        })
        .sum();
    check_fits(need, &file.display().to_string())
}

/// Errors when `need` bytes (for `what`) exceed what is available.
/// `--no-memory-check` (`KILN_NO_MEMORY_CHECK`) skips the check.
pub fn check_fits(need: u64, what: &str) -> Result<(), RuntimeError> {
    if kiln_backend::options::get().no_memory_check {
        return Ok(());
    }
    match available_bytes() {
        Some(have) if need > have => Err(RuntimeError::OutOfMemory {
            what: what.to_string(),
            need,
            have,
        }),
        _ => Ok(()),
    }
}

/// "1.5 GiB", "340 MiB".
pub fn size_label(bytes: u64) -> String {
    let mib = bytes as f64 / (1u64 << 20) as f64;
    match mib >= 1024.0 {
        true => format!("{:.1} GiB", mib / 1024.0),
        false => format!("{mib:.0} MiB"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(size_label(340 << 20), "340 MiB");
        assert_eq!(size_label(3 << 29), "1.5 GiB");
    }
}
