//! `KILN_NO_SIMD=1` forces the scalar kernels (its own test binary: the choice is made once
//! per process).

#[test]
fn env_var_forces_scalar_kernels() {
    std::env::set_var("KILN_NO_SIMD", "1");
    assert_eq!(kiln_backend::cpu::kernels::best().name, "scalar");
    assert_eq!(kiln_backend::cpu::CpuBackend::new(2).kernels(), "scalar");
}
