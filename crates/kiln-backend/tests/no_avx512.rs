//! `KILN_NO_AVX512=1` keeps the AVX2 versions of the f32 code (its own test binary: the
//! choice is made once per process), so they are tested on AVX-512 machines too.

mod common {
    pub mod attention_check;
}

#[test]
fn avx2_attention_matches_naive() {
    std::env::set_var("KILN_NO_AVX512", "1");
    assert!(!kiln_backend::cpu::kernels::avx512_allowed());
    common::attention_check::attention_matches_naive();
}

#[test]
fn avx2_attention_batch_matches_each() {
    std::env::set_var("KILN_NO_AVX512", "1");
    common::attention_check::attention_batch_matches_each();
}
