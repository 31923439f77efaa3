#![no_main]

use kiln_fuzz::alloc::{CappedAlloc, DEFAULT_CAP};

#[global_allocator]
static ALLOC: CappedAlloc = CappedAlloc::new(DEFAULT_CAP);

static QUIET: std::sync::Once = std::sync::Once::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // kiln-audio turns a panic inside symphonia into an error (decode_bytes catches it), but
    // libfuzzer-sys's panic hook aborts on every panic, caught or not. Here only a panic that
    // escapes decode_bytes is a crash: libfuzzer-sys still aborts on that one.
    QUIET.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    kiln_fuzz::audio(data);
});
