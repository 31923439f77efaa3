//! The backend conformance suite (`kiln_backend::conformance`) on every wgpu kernel variant
//! the adapter runs (`common::backends()`: subgroup reductions and the workgroup-memory
//! fallback, fused and separate matvec prologue), against the CPU reference.
//!
//! Without a GPU adapter each test prints why and passes; with `KILN_REQUIRE_GPU=1` (CI,
//! after tools/setup-lavapipe.sh) a missing adapter fails.

mod common;

use kiln_backend::conformance::Tolerances;
use kiln_wgpu::WgpuBackend;

/// Bounds (max |gpu - reference| / max |reference|), measured on lavapipe with a margin.
fn tolerances() -> Tolerances {
    Tolerances {
        // Dequantized rows: the same formulas in f32.
        embed: 1e-6,
        // Norms, activations, RoPE (from a host-computed table): f32 in another order.
        norm: 1e-5,
        // Layer norm by rows, AdaIN and AdaLN in a shader: the mean and the centred sum of
        // squares in f32 tree sums, where the reference sums in f64 (5.5e-7 seen).
        signal_norm: 5e-6,
        elementwise: 1e-5,
        rope: 1e-5,
        // Quantized products take activations in int8 blocks as the CPU does, but a GPU may
        // divide within 2.5 ULP (Vulkan's precision rule for d = max/127 and 1/d), so an
        // activation at a rounding midpoint can take the other int8 step, moving an output
        // by that step times its weight (2.4e-4 seen on an H200; lavapipe rounds as the CPU:
        // ~1e-6). The fused products round their activations the same way (6.7e-4 seen on
        // an H200: gate_up_silu, Q2_K + Q6_K, 70 tokens).
        product: 1e-3,
        fused_product: 1e-3,
        batched: 1e-3,
        // f32 arithmetic either way; through an f16 cache (against the reference's f16
        // cache) a key rotated a last bit differently may round to the other f16 (2e-5 seen).
        attention: 1e-5,
        attention_packed: 1e-4,
        // Dense attention and the signal convolutions run on the CPU's fast path (through
        // copies), which rounds through bf16 on a CPU with AMX tiles (2.4e-3 seen).
        attention_dense: cpu_bf16(1e-5),
        conv: cpu_bf16(1e-5),
        lstm: 1e-5,
        stft: 1e-5,
    }
}

/// `exact`, or bf16's bound where the CPU's fast path uses AMX tiles.
fn cpu_bf16(exact: f32) -> f32 {
    match kiln_backend::cpu::kernels::amx::bf16_products() {
        true => 1e-2,
        false => exact,
    }
}

fn run(op: fn(&WgpuBackend, &Tolerances)) {
    let tol = tolerances();
    for b in common::backends() {
        op(&b, &tol);
    }
}

kiln_backend::conformance_tests!(run);
