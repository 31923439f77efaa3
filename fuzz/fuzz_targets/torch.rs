#![no_main]

use kiln_fuzz::alloc::{CappedAlloc, DEFAULT_CAP};

#[global_allocator]
static ALLOC: CappedAlloc = CappedAlloc::new(DEFAULT_CAP);

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kiln_fuzz::torch(data);
});
