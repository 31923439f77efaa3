#![no_main]

// The template guard (memory bound of a render) instead of the plain allocation cap: a
// template that builds a huge string is stopped by the guard, which is what this checks.
#[global_allocator]
static ALLOC: kiln_text_alloc::GuardedAlloc = kiln_text_alloc::GuardedAlloc;

use kiln_fuzz::kiln_text as kiln_text_alloc;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kiln_fuzz::chat_template(data);
});
