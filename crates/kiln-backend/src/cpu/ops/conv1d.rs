//! 1-D convolution over time as one matrix product: the input's receptive fields are laid
//! out as rows (im2col), then `out = W @ cols (+ bias)`.
//!
//! x (t_in, c_in) time-major; W (c_out, c_in·k) with column `c·k + j` the tap j of input
//! channel c (PyTorch's `(out, in, k)` weight flattened); out (t_out, c_out) with
//! t_out = (t_in + 2·pad − k) / stride + 1 and
//! out[t][o] = b[o] + Σ_{c,j} W[o][c·k + j] · x[t·stride + j − pad][c]  (0 outside 0..t_in).

use crate::cpu::CpuTensor;

pub fn out_len(t_in: usize, kernel: usize, stride: usize, pad: usize) -> usize {
    (t_in + 2 * pad).saturating_sub(kernel) / stride.max(1) + 1
}

/// Receptive fields of x as rows: cols (t_out, c_in·k).
pub fn im2col(
    x: &CpuTensor,
    t_in: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
    cols: &mut CpuTensor,
) -> usize {
    let c_in = x.cols;
    let t_out = out_len(t_in, kernel, stride, pad);
    let width = c_in * kernel;
    assert_eq!(cols.cols, width, "conv1d: scratch has the wrong width");
    assert!(
        cols.data.len() >= t_out * width,
        "conv1d: scratch too small"
    );
    for t in 0..t_out {
        let row = &mut cols.data[t * width..(t + 1) * width];
        for j in 0..kernel {
            let src = (t * stride + j) as isize - pad as isize;
            if src < 0 || src as usize >= t_in {
                for c in 0..c_in {
                    row[c * kernel + j] = 0.0;
                }
            } else {
                let xs = &x.data[src as usize * c_in..(src as usize + 1) * c_in];
                for c in 0..c_in {
                    row[c * kernel + j] = xs[c];
                }
            }
        }
    }
    t_out
}
