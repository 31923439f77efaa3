//! The conformance suite on the CPU backend with `KILN_NO_AVX512=1` (its own test binary: the
//! kernel choice is made once per process, before the first backend).
//! x86-64 only (the choice does not exist elsewhere).
#![cfg(target_arch = "x86_64")]

use kiln_backend::conformance::Tolerances;
use kiln_backend::cpu::CpuBackend;

fn run(op: fn(&CpuBackend, &Tolerances)) {
    static SET: std::sync::Once = std::sync::Once::new();
    SET.call_once(|| std::env::set_var("KILN_NO_AVX512", "1"));
    assert!(!kiln_backend::cpu::kernels::avx512_allowed());
    op(&CpuBackend::new(2), &Tolerances::cpu())
}

kiln_backend::conformance_tests!(run);
