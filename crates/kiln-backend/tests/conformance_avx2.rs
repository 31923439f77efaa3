//! The conformance suite on the CPU backend with `KILN_NO_AVX512=1 KILN_NO_AVX_VNNI=1`: the
//! plain AVX2 kernels of CPUs before Intel Alder Lake and AMD Zen 5 (`vpmaddubsw` integer
//! products, FMA f32), which CI's CPUs (with AVX-VNNI) would otherwise never choose. Its own
//! test binary: the kernel choice is made once per process.
#![cfg(target_arch = "x86_64")]

use kiln_backend::conformance::Tolerances;
use kiln_backend::cpu::{kernels, CpuBackend};

fn run(op: fn(&CpuBackend, &Tolerances)) {
    static SET: std::sync::Once = std::sync::Once::new();
    SET.call_once(|| {
        std::env::set_var("KILN_NO_AVX512", "1");
        std::env::set_var("KILN_NO_AVX_VNNI", "1");
    });
    assert!(!kernels::avx512_allowed() && !kernels::avx_vnni_allowed());
    assert_eq!(kernels::vnni_gemm::isa(), None, "no integer block products");
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        assert_eq!(kernels::best().name, "avx2");
    }
    op(&CpuBackend::new(2), &Tolerances::cpu())
}

kiln_backend::conformance_tests!(run);
