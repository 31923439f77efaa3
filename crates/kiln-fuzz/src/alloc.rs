//! An allocator for fuzzing: the system allocator, except that one request above a cap fails.
//! Rust then aborts with "memory allocation of N bytes failed", which libFuzzer reports as a
//! crash: a parser that sized a buffer from a length in the file before checking it against
//! the bytes there is found even when the OS would have granted the (untouched) memory.

use std::alloc::{GlobalAlloc, Layout, System};

/// Inputs are kilobytes; no honest parse of one needs a single block this large.
pub const DEFAULT_CAP: usize = 256 << 20;

pub struct CappedAlloc {
    pub cap: usize,
}

impl CappedAlloc {
    pub const fn new(cap: usize) -> Self {
        CappedAlloc { cap }
    }
}

// SAFETY: every call is forwarded to `System` unchanged, or refused with a null pointer
// (which `GlobalAlloc` allows).
unsafe impl GlobalAlloc for CappedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > self.cap {
            return std::ptr::null_mut();
        }
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > self.cap {
            return std::ptr::null_mut();
        }
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > self.cap {
            return std::ptr::null_mut();
        }
        System.realloc(ptr, layout, new_size)
    }
}
