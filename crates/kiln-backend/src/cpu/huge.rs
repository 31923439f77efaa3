//! A model's weights in memory the kernel may back with 2 MiB pages.
//!
//! Decoding streams every weight once a token: through 4 KiB pages that is a TLB miss every
//! 4 KiB, and the hardware prefetchers stop at every page boundary. Where transparent huge
//! pages are given only on request (`madvise`, the default of many distributions), a `Vec`
//! never gets them, and a weight of a small model (under 2 MiB) could not fill one anyway.
//! So weights are carved from arenas: 2 MiB-aligned anonymous mappings of at least 64 MiB,
//! marked for huge pages. An arena is unmapped when the last weight carved from it goes.

use std::ops::{Deref, DerefMut};

/// A weight's bytes: carved from an arena (Linux), or a `Vec` (small ones, other systems,
/// or where mapping fails).
pub struct Bytes(Inner);

enum Inner {
    Vec(Vec<u8>),
    #[cfg(target_os = "linux")]
    Arena(arena::Region),
}

impl Bytes {
    /// `len` zero bytes. Weights live as long as their model: what a dropped one held comes
    /// back when its whole arena does (so KV caches, which come and go and are touched a
    /// position at a time, stay in `Vec`s).
    pub fn zeroed(len: usize) -> Bytes {
        #[cfg(target_os = "linux")]
        if len >= arena::MIN {
            if let Some(r) = arena::Region::new(len) {
                return Bytes(Inner::Arena(r));
            }
        }
        Bytes(Inner::Vec(vec![0u8; len]))
    }

    /// Whether the bytes were carved from an arena (tests).
    pub fn in_arena(&self) -> bool {
        !matches!(self.0, Inner::Vec(_))
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Self {
        Bytes(Inner::Vec(v))
    }
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Inner::Vec(v) => v,
            // SAFETY: the region's bytes lie in its arena's mapping (checked when carved)
            // and no other region overlaps them.
            #[cfg(target_os = "linux")]
            Inner::Arena(r) => unsafe { std::slice::from_raw_parts(r.ptr(), r.len) },
        }
    }
}

impl DerefMut for Bytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Inner::Vec(v) => v,
            // SAFETY: as `deref`; `&mut self` is the only access to this region.
            #[cfg(target_os = "linux")]
            Inner::Arena(r) => unsafe { std::slice::from_raw_parts_mut(r.ptr(), r.len) },
        }
    }
}

#[cfg(target_os = "linux")]
mod arena {
    use std::sync::{Arc, Mutex, Weak};

    use memmap2::{Advice, MmapMut};

    const HUGE: usize = 2 << 20;
    /// An arena's least size (a small model's weights in one or two).
    const SIZE: usize = 64 << 20;
    /// Smaller buffers stay `Vec`s (norms, biases, small matrices).
    pub(super) const MIN: usize = 64 << 10;

    struct Arena {
        _map: MmapMut,
        /// The first 2 MiB boundary in the mapping, and the bytes from there.
        base: *mut u8,
        cap: usize,
    }

    // SAFETY: the mapping is owned by the arena; each region's bytes are reachable only
    // through the one `Region` that was handed them.
    unsafe impl Send for Arena {}
    unsafe impl Sync for Arena {}

    impl Arena {
        /// At least `cap` bytes, whole huge pages, marked for them.
        fn new(cap: usize) -> Option<Arc<Arena>> {
            let cap = cap.checked_next_multiple_of(HUGE)?;
            let mut map = MmapMut::map_anon(cap.checked_add(HUGE)?).ok()?;
            // Not every system gives huge pages; the arena is still a valid buffer.
            let _ = map.advise(Advice::HugePage);
            let start = map.as_mut_ptr();
            let skip = (HUGE - start as usize % HUGE) % HUGE;
            Some(Arc::new(Arena {
                // SAFETY: skip < HUGE and the mapping is cap + HUGE bytes.
                base: unsafe { start.add(skip) },
                _map: map,
                cap,
            }))
        }
    }

    /// The arena being filled and its next free offset.
    static CURRENT: Mutex<(Weak<Arena>, usize)> = Mutex::new((Weak::new(), 0));

    pub(super) struct Region {
        arena: Arc<Arena>,
        off: usize,
        pub(super) len: usize,
    }

    impl Region {
        /// `len` bytes of the arena being filled, or of a new one.
        pub(super) fn new(len: usize) -> Option<Region> {
            let need = len.checked_next_multiple_of(64)?;
            let mut cur = CURRENT.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(a) = cur.0.upgrade().filter(|a| cur.1 + need <= a.cap) {
                let off = cur.1;
                cur.1 += need;
                return Some(Region { arena: a, off, len });
            }
            let arena = Arena::new(need.max(SIZE))?;
            *cur = (Arc::downgrade(&arena), need);
            Some(Region { arena, off: 0, len })
        }

        pub(super) fn ptr(&self) -> *mut u8 {
            // SAFETY: off + len <= cap, checked when carved.
            unsafe { self.arena.base.add(self.off) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_zeroed_disjoint_and_outlive_each_other() {
        let sizes = [70_000, 1 << 20, 3 << 20, 100 << 20, 65_536, 10];
        let mut bufs: Vec<Bytes> = sizes.iter().map(|&n| Bytes::zeroed(n)).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            assert_eq!(b.len(), sizes[i]);
            assert!(b.iter().all(|&x| x == 0));
            b.fill(i as u8 + 1);
        }
        #[cfg(target_os = "linux")]
        assert!(bufs[..5].iter().all(|b| b.in_arena()) && !bufs[5].in_arena());
        // Dropping some leaves the others' bytes as written, and new ones zeroed.
        bufs.remove(1);
        bufs.remove(2);
        let again = Bytes::zeroed(1 << 20);
        assert!(again.iter().all(|&x| x == 0));
        for (b, fill) in bufs.iter().zip([1u8, 3, 5, 6]) {
            assert!(b.iter().all(|&x| x == fill), "{fill}");
        }
    }
}
