//! Attention against a plain f64 computation with the best kernels this CPU has.

mod common {
    pub mod attention_check;
}

#[test]
fn attention_matches_naive() {
    common::attention_check::attention_matches_naive();
}
