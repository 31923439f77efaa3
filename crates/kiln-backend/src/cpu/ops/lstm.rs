//! One LSTM direction (PyTorch gate order i, f, g, o) from a zero state.

use super::dot;
use crate::cpu::CpuTensor;
use crate::LstmShape;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

pub fn lstm(
    x: &CpuTensor,
    w_ih: &CpuTensor,
    w_hh: &CpuTensor,
    bias: &CpuTensor,
    s: LstmShape,
    out: &mut CpuTensor,
) {
    let (h, n_in) = (s.hidden, s.n_in);
    assert!(
        x.data.len() >= s.len * n_in && x.cols == n_in,
        "lstm input shape"
    );
    assert!(
        w_ih.data.len() >= 4 * h * n_in && w_hh.data.len() >= 4 * h * h,
        "lstm weights"
    );
    assert!(
        out.cols >= s.out_col + h && out.data.len() >= s.len * out.cols,
        "lstm output"
    );
    // Input projections of every step at once: gx (len, 4h) = x @ w_ih^T + bias.
    let mut gx = vec![0f32; s.len * 4 * h];
    for t in 0..s.len {
        let xt = &x.data[t * n_in..(t + 1) * n_in];
        for (j, g) in gx[t * 4 * h..(t + 1) * 4 * h].iter_mut().enumerate() {
            *g = dot(&w_ih.data[j * n_in..(j + 1) * n_in], xt) + bias.data[j];
        }
    }
    let (mut hs, mut cs, mut gates) = (vec![0f32; h], vec![0f32; h], vec![0f32; 4 * h]);
    for step in 0..s.len {
        let t = if s.reverse { s.len - 1 - step } else { step };
        for (j, g) in gates.iter_mut().enumerate() {
            *g = gx[t * 4 * h + j] + dot(&w_hh.data[j * h..(j + 1) * h], &hs);
        }
        for u in 0..h {
            let i = sigmoid(gates[u]);
            let f = sigmoid(gates[h + u]);
            let g = gates[2 * h + u].tanh();
            let o = sigmoid(gates[3 * h + u]);
            cs[u] = f * cs[u] + i * g;
            hs[u] = o * cs[u].tanh();
        }
        let row = t * out.cols + s.out_col;
        out.data[row..row + h].copy_from_slice(&hs);
    }
}
