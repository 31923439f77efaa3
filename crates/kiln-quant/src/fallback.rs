//! The type a row of `cols` values actually gets when `ty` was asked for but its block does
//! not divide the row (llama.cpp's rule: K types fall back to the legacy type of about the
//! same size, legacy types to F16).

use crate::GgmlType;

pub fn fallback_type(ty: GgmlType, cols: usize) -> GgmlType {
    use GgmlType::*;
    if cols % ty.block_size() == 0 {
        return ty;
    }
    let legacy = match ty {
        Q2_K | Q3_K => Q4_0,
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K | Q8_K => Q8_0,
        other => other,
    };
    if cols % legacy.block_size() == 0 {
        legacy
    } else {
        F16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn falls_back_like_llama_cpp() {
        assert_eq!(fallback_type(GgmlType::Q4_K, 512), GgmlType::Q4_K);
        assert_eq!(fallback_type(GgmlType::Q4_K, 96), GgmlType::Q5_0);
        assert_eq!(fallback_type(GgmlType::Q6_K, 160), GgmlType::Q8_0);
        assert_eq!(fallback_type(GgmlType::Q4_0, 48), GgmlType::F16);
        assert_eq!(fallback_type(GgmlType::F16, 7), GgmlType::F16);
    }
}
