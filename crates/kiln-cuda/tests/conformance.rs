//! The backend conformance suite (`kiln_backend::conformance`) on the CUDA backend, against
//! the CPU reference. These need an NVIDIA GPU: they are `#[ignore]`d, and run with
//! `cargo test --release -p kiln-cuda --test conformance -- --ignored` on a GPU machine.

use kiln_backend::conformance::Tolerances;
use kiln_cuda::CudaBackend;

/// Bounds (max |cuda - reference| / max |reference|), those the CUDA op tests held.
fn tolerances() -> Tolerances {
    Tolerances {
        embed: 1e-6,
        norm: 1e-5,
        signal_norm: 1e-5,
        elementwise: 1e-5,
        rope: 1e-5,
        // Decode products take activations in int8 blocks of 32; prompts go through cuBLAS
        // with weights and activations widened or rounded to f16.
        product: 1e-2,
        fused_product: 1e-2,
        batched: 1e-2,
        // f16 caches (the default) and f16 tensor-core prompt attention.
        attention: 5e-3,
        attention_packed: 5e-3,
        attention_dense: 1e-2,
        conv: 1e-5,
        lstm: 1e-5,
        stft: 1e-5,
    }
}

fn run(op: fn(&CudaBackend, &Tolerances)) {
    // Sampling candidates selected on the GPU, so `top_candidates` runs its kernel.
    let b = CudaBackend::new()
        .expect("these tests need a CUDA GPU")
        .with_gpu_candidates();
    op(&b, &tolerances())
}

kiln_backend::conformance_tests!(
    #[ignore]
    run
);
