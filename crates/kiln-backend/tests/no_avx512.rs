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

#[test]
fn avx2_decode_equals_prefill_bits() {
    std::env::set_var("KILN_NO_AVX512", "1");
    common::attention_check::decode_equals_prefill_bits();
}

/// The int8 block products on AVX-VNNI (256-bit `vpdpbusd`), which a CPU with AVX-512 runs
/// only with the switch: bit for bit the scalar form of the same quantized product.
#[test]
#[cfg(target_arch = "x86_64")]
fn avx_vnni_int8_block_products_match_scalar() {
    use kiln_backend::cpu::kernels::vnni_gemm;
    std::env::set_var("KILN_NO_AVX512", "1");
    if !std::is_x86_feature_detected!("avxvnni") {
        eprintln!("no AVX-VNNI here: skipped");
        return;
    }
    assert_eq!(vnni_gemm::isa(), Some(vnni_gemm::Isa::AvxVnni));
    vnni_gemm::check_against_scalar();
}
