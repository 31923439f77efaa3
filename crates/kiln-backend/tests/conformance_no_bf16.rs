//! The conformance suite on the CPU backend with `KILN_NO_AMX=1 KILN_NO_BF16=1`: what Intel
//! CPUs from Skylake-SP to Ice Lake run (f32 block products over packed weights; int8 where
//! allowed). Its own test binary: the kernel choice is made once per process.
//! x86-64 and aarch64 (there: the NEON f32 block products of CPUs without bf16, Apple M1).
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

use kiln_backend::conformance::Tolerances;
use kiln_backend::cpu::CpuBackend;

fn run(op: fn(&CpuBackend, &Tolerances)) {
    static SET: std::sync::Once = std::sync::Once::new();
    SET.call_once(|| {
        std::env::set_var("KILN_NO_AMX", "1");
        std::env::set_var("KILN_NO_BF16", "1");
    });
    assert!(!kiln_backend::cpu::kernels::amx::bf16_products());
    op(&CpuBackend::new(2), &Tolerances::cpu())
}

kiln_backend::conformance_tests!(run);
