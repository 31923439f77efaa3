use thiserror::Error;

/// Errors of the block formats: always a wrong length or an unsupported type, never data.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum QuantError {
    #[error("{ty}: row of {n} values is not a multiple of the block size {block}")]
    RaggedRow {
        ty: &'static str,
        n: usize,
        block: usize,
    },
    #[error("{ty}: expected {expected} bytes for {n} values, got {got}")]
    WrongByteLength {
        ty: &'static str,
        n: usize,
        expected: usize,
        got: usize,
    },
    #[error("{ty}: {what} is not supported")]
    Unsupported {
        ty: &'static str,
        what: &'static str,
    },
}

/// The GGML tensor types, numbered as in GGUF files.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    BF16,
}

/// Values per super-block of the K formats.
pub const QK_K: usize = 256;

impl GgmlType {
    /// The type for a GGUF `ggml_type` id, or `None` for ids kiln does not read.
    pub fn from_id(id: u32) -> Option<Self> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            30 => BF16,
            _ => return None,
        })
    }

    /// The GGUF `ggml_type` id.
    pub fn id(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2_K => 10,
            Q3_K => 11,
            Q4_K => 12,
            Q5_K => 13,
            Q6_K => 14,
            Q8_K => 15,
            BF16 => 30,
        }
    }

    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            Q8_K => "Q8_K",
            BF16 => "BF16",
        }
    }

    /// Values per block.
    pub fn block_size(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | F16 | BF16 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 => 32,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        use GgmlType::*;
        match self {
            F32 => 4,
            F16 | BF16 => 2,
            Q4_0 => 2 + 16,
            Q4_1 => 2 + 2 + 16,
            Q5_0 => 2 + 4 + 16,
            Q5_1 => 2 + 2 + 4 + 16,
            Q8_0 => 2 + 32,
            Q8_1 => 2 + 2 + 32,
            Q2_K => QK_K / 16 + QK_K / 4 + 2 + 2,
            Q3_K => QK_K / 8 + QK_K / 4 + 12 + 2,
            Q4_K => 2 + 2 + 12 + QK_K / 2,
            Q5_K => 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
            Q6_K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
            Q8_K => 4 + QK_K + QK_K / 16 * 2,
        }
    }

    /// Bytes of a row of `n` values, or an error when `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Result<usize, QuantError> {
        let block = self.block_size();
        if n % block != 0 {
            return Err(QuantError::RaggedRow {
                ty: self.name(),
                n,
                block,
            });
        }
        Ok(n / block * self.type_size())
    }

    /// Bytes of `n` values with overflow checking (for sizes read from files).
    pub fn checked_bytes(self, n: u64) -> Option<u64> {
        let block = self.block_size() as u64;
        if n % block != 0 {
            return None;
        }
        (n / block).checked_mul(self.type_size() as u64)
    }
}

/// `Ok` when `n` values of `ty` take exactly `bytes` bytes.
pub(crate) fn check_row(ty: GgmlType, n: usize, bytes: usize) -> Result<(), QuantError> {
    let block = ty.block_size();
    if n % block != 0 {
        return Err(QuantError::RaggedRow {
            ty: ty.name(),
            n,
            block,
        });
    }
    // Checked: `n` may be a count read from a file.
    match (n / block).checked_mul(ty.type_size()) {
        Some(expected) if expected == bytes => Ok(()),
        expected => Err(QuantError::WrongByteLength {
            ty: ty.name(),
            n,
            expected: expected.unwrap_or(usize::MAX),
            got: bytes,
        }),
    }
}
