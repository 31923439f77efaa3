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

/// Shares the output between the two direction threads (disjoint columns).
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: direction d writes only columns d*h..(d+1)*h of each row.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// The recurrence of a bidirectional LSTM from zero state, input gates given:
/// gx (len, 8h) = [x W_ih_fwd^T + b_fwd | x W_ih_bwd^T + b_bwd], w_hh (2h, 4h) = [W_hh_fwd^T;
/// W_hh_bwd^T] -> out (len, 2h) = [h_fwd | h_bwd]. The two directions run on two threads.
pub fn bilstm_steps(
    pool: &crate::cpu::Pool,
    gx: &CpuTensor,
    w_hh: &CpuTensor,
    len: usize,
    h: usize,
    out: &mut CpuTensor,
) {
    assert!(
        gx.cols == 8 * h && gx.data.len() >= len * 8 * h,
        "bilstm gates shape"
    );
    assert!(
        w_hh.cols == 4 * h && w_hh.data.len() >= 8 * h * h,
        "bilstm recurrent weights"
    );
    assert!(
        out.cols == 2 * h && out.data.len() >= len * 2 * h,
        "bilstm output"
    );
    let o = Out(out.data.as_mut_ptr());
    pool.run(2, |a, b| {
        let o = o;
        for dir in a..b {
            // SAFETY: columns dir*h..(dir+1)*h of every row belong to this direction alone
            // and lie inside `out` (checked above).
            unsafe { direction(gx, w_hh, len, h, dir, o.0) };
        }
    });
}

widest!(
    /// One direction of [`bilstm_steps`], on the widest vectors the CPU has.
    ///
    /// # Safety
    /// `out` holds `len` rows of 2h values whose columns dir*h..(dir+1)*h no one else writes.
    unsafe fn direction(
        gx: &CpuTensor,
        w_hh: &CpuTensor,
        len: usize,
        h: usize,
        dir: usize,
        out: *mut f32,
    ) = direction_body
);

#[inline(always)]
unsafe fn direction_body(
    gx: &CpuTensor,
    w_hh: &CpuTensor,
    len: usize,
    h: usize,
    dir: usize,
    out: *mut f32,
) {
    let wt = &w_hh.data[dir * 4 * h * h..(dir + 1) * 4 * h * h];
    let (mut hs, mut cs, mut gates) = (vec![0f32; h], vec![0f32; h], vec![0f32; 4 * h]);
    for step in 0..len {
        let t = if dir == 1 { len - 1 - step } else { step };
        let g0 = &gx.data[t * 8 * h + dir * 4 * h..t * 8 * h + (dir + 1) * 4 * h];
        // gates = g0 + h W_hh^T as a sum of W_hh^T's rows scaled by h[u], GB gates at a time
        // (held in registers over every u).
        let mut j0 = 0;
        while j0 + GB <= 4 * h {
            let mut acc: [f32; GB] = g0[j0..j0 + GB].try_into().expect("GB gates");
            for (u, &hv) in hs.iter().enumerate() {
                let row: &[f32; GB] = wt[u * 4 * h + j0..u * 4 * h + j0 + GB]
                    .try_into()
                    .expect("GB weights");
                for l in 0..GB {
                    acc[l] += hv * row[l];
                }
            }
            gates[j0..j0 + GB].copy_from_slice(&acc);
            j0 += GB;
        }
        for j in j0..4 * h {
            gates[j] = g0[j];
            for (u, &hv) in hs.iter().enumerate() {
                gates[j] += hv * wt[u * 4 * h + j];
            }
        }
        for u in 0..h {
            let i = fast_sigmoid(gates[u]);
            let f = fast_sigmoid(gates[h + u]);
            let g = fast_tanh(gates[2 * h + u]);
            let og = fast_sigmoid(gates[3 * h + u]);
            cs[u] = f * cs[u] + i * g;
            hs[u] = og * fast_tanh(cs[u]);
        }
        // SAFETY: row t, columns dir*h..(dir+1)*h are this direction's (caller).
        let dst = unsafe { std::slice::from_raw_parts_mut(out.add(t * 2 * h + dir * h), h) };
        dst.copy_from_slice(&hs);
    }
}

/// Gates per register block of the recurrence (8 AVX-512 registers).
const GB: usize = 128;

#[inline(always)]
fn fast_sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + super::exp(-x))
}

/// tanh x = 1 - 2 / (e^{2x} + 1)
#[inline(always)]
fn fast_tanh(x: f32) -> f32 {
    1.0 - 2.0 / (super::exp(2.0 * x) + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two-direction recurrence against two calls of the reference `lstm`.
    #[test]
    fn bilstm_steps_matches_lstm() {
        // 4h = 160: one register block of gates and a tail.
        let (len, n_in, h) = (13, 10, 40);
        let mut seed = 11u64;
        let mut rnd = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
                })
                .collect()
        };
        let t = |data: Vec<f32>, cols: usize| CpuTensor { data, cols };
        let x = t(rnd(len * n_in), n_in);
        let wi = [rnd(4 * h * n_in), rnd(4 * h * n_in)];
        let wh = [rnd(4 * h * h), rnd(4 * h * h)];
        let bs = [rnd(4 * h), rnd(4 * h)];
        let mut want = t(vec![0.0; len * 2 * h], 2 * h);
        for d in 0..2 {
            let s = LstmShape {
                len,
                n_in,
                hidden: h,
                reverse: d == 1,
                out_col: d * h,
            };
            let (a, b, c) = (
                t(wi[d].clone(), n_in),
                t(wh[d].clone(), h),
                t(bs[d].clone(), 1),
            );
            lstm(&x, &a, &b, &c, s, &mut want);
        }
        let mut gx = vec![0f32; len * 8 * h];
        for tt in 0..len {
            for d in 0..2 {
                for j in 0..4 * h {
                    gx[tt * 8 * h + d * 4 * h + j] = dot(
                        &wi[d][j * n_in..(j + 1) * n_in],
                        &x.data[tt * n_in..(tt + 1) * n_in],
                    ) + bs[d][j];
                }
            }
        }
        // [W_hh_fwd^T; W_hh_bwd^T]
        let mut wht = vec![0f32; 8 * h * h];
        for d in 0..2 {
            for j in 0..4 * h {
                for u in 0..h {
                    wht[(d * h + u) * 4 * h + j] = wh[d][j * h + u];
                }
            }
        }
        let whh = t(wht, 4 * h);
        let mut got = t(vec![0.0; len * 2 * h], 2 * h);
        bilstm_steps(
            &crate::cpu::Pool::new(2),
            &t(gx, 8 * h),
            &whh,
            len,
            h,
            &mut got,
        );
        for (i, (&a, &b)) in got.data.iter().zip(&want.data).enumerate() {
            assert!((a - b).abs() < 1e-5, "at {i}: {a} vs {b}");
        }
    }
}
