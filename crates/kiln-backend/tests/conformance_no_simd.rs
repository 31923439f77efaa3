//! The conformance suite on the CPU backend with `KILN_NO_SIMD=1` (its own test binary: the
//! kernel choice is made once per process, before the first backend).
//! The scalar kernels are the same code on every target: x86-64 runs them (under
//! qemu the aarch64 leg runs the NEON sets through `conformance.rs` only).
#![cfg(target_arch = "x86_64")]

use kiln_backend::conformance::Tolerances;
use kiln_backend::cpu::CpuBackend;

fn run(op: fn(&CpuBackend, &Tolerances)) {
    static SET: std::sync::Once = std::sync::Once::new();
    SET.call_once(|| std::env::set_var("KILN_NO_SIMD", "1"));
    assert_eq!(kiln_backend::cpu::kernels::best().name, "scalar");
    op(&CpuBackend::new(2), &Tolerances::cpu())
}

kiln_backend::conformance_tests!(run);
