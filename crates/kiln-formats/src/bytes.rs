//! The bytes a reader parses: a read-only map of a file, or bytes already in memory (an
//! archive member, a download, a fuzzer's input). Readers see `&[u8]` either way.

use std::ops::Deref;

use memmap2::Mmap;

pub(crate) enum Bytes {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Map(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

impl Bytes {
    /// Tells the OS the pages covering `[start, end)` may be dropped (a hint; a map faults
    /// them back in with the same contents, owned bytes are left alone).
    pub(crate) fn release(&self, start: usize, end: usize) {
        #[cfg(unix)]
        if let Bytes::Map(m) = self {
            const PAGE: usize = 4096;
            let start = start / PAGE * PAGE;
            let end = end.div_ceil(PAGE).saturating_mul(PAGE).min(m.len());
            if end > start {
                // SAFETY: the map is a read-only view of a file; dropping its pages only makes
                // the next read fault them in again with the same contents. Callers release a
                // tensor once its bytes have been copied, holding no borrow of them.
                let _ = unsafe {
                    m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
                };
            }
        }
        #[cfg(not(unix))]
        let _ = (start, end);
    }
}
