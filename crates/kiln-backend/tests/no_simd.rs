//! `KILN_NO_SIMD=1` forces the scalar kernels (its own test binary: the choice is made once
//! per process).

mod common {
    pub mod attention_check;
}

#[test]
fn env_var_forces_scalar_kernels() {
    std::env::set_var("KILN_NO_SIMD", "1");
    assert_eq!(kiln_backend::cpu::kernels::best().name, "scalar");
    assert_eq!(kiln_backend::cpu::CpuBackend::new(2).kernels(), "scalar");
    // The portable attention kernel, one sequence and several at once.
    common::attention_check::attention_matches_naive();
    common::attention_check::attention_batch_matches_each();
    // Decoding one token at a time gives the prefill's bits on the scalar kernels too.
    common::attention_check::decode_equals_prefill_bits();
}
