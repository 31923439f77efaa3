//! Attention against a plain f64 computation with the best kernels this CPU has.

mod common {
    pub mod attention_check;
}

#[test]
fn attention_matches_naive() {
    common::attention_check::attention_matches_naive();
}

#[test]
fn attention_batch_matches_each() {
    common::attention_check::attention_batch_matches_each();
}

#[test]
fn decode_equals_prefill_bits() {
    common::attention_check::decode_equals_prefill_bits();
}
