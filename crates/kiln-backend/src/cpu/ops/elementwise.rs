use crate::cpu::CpuTensor;

/// gate = silu(gate) * up over the first n rows.
pub fn silu_mul(gate: &mut CpuTensor, up: &CpuTensor, n: usize) {
    let len = n * gate.cols;
    for (g, &u) in gate.data[..len].iter_mut().zip(&up.data[..len]) {
        *g = *g / (1.0 + super::exp(-*g)) * u;
    }
}

/// x += y over the first n rows.
pub fn add(x: &mut CpuTensor, y: &CpuTensor, n: usize) {
    let len = n * x.cols;
    for (a, &b) in x.data[..len].iter_mut().zip(&y.data[..len]) {
        *a += b;
    }
}
