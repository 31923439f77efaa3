//! 1-D convolution and transposed convolution over `(channels, len)` feature maps.
//!
//! Direct form, vectorised along time: for each output channel, every (input channel, tap)
//! pair adds `w * x[shifted]` to the output row. Output channels are split over threads.

use crate::cpu::{CpuTensor, Pool};
use crate::Conv1dShape;

/// Range of output positions `t` whose source `t * stride + off` lies in `0..len_in`.
fn valid(off: isize, stride: usize, len_in: usize, len_out: usize) -> (usize, usize) {
    let s = stride as isize;
    let lo = if off >= 0 { 0 } else { ((-off) + s - 1) / s };
    let hi = if (len_in as isize) - off <= 0 {
        0
    } else {
        (((len_in as isize) - off + s - 1) / s) as usize
    };
    (lo as usize, hi.min(len_out))
}

/// Shares a mutable slice between threads that write disjoint rows.
#[derive(Clone, Copy)]
struct Rows(*mut f32);
// SAFETY: each thread writes only the rows of its own output-channel range.
unsafe impl Send for Rows {}
unsafe impl Sync for Rows {}

pub fn conv1d(
    pool: &Pool,
    x: &CpuTensor,
    w: &CpuTensor,
    bias: Option<&CpuTensor>,
    s: Conv1dShape,
    out: &mut CpuTensor,
) {
    let lo_len = s.len_out();
    let (cig, cog) = (s.c_in / s.groups, s.c_out / s.groups);
    assert!(x.data.len() >= s.c_in * s.len_in, "conv1d input too small");
    assert!(
        w.data.len() >= s.c_out * cig * s.k,
        "conv1d weight too small"
    );
    assert!(
        out.data.len() >= s.c_out * lo_len,
        "conv1d output too small"
    );
    let rows = Rows(out.data.as_mut_ptr());
    pool.run(s.c_out, |a, b| {
        let rows = rows;
        for o in a..b {
            // SAFETY: row `o` belongs to this thread alone and lies inside `out` (checked).
            let y = unsafe { std::slice::from_raw_parts_mut(rows.0.add(o * lo_len), lo_len) };
            let b0 = bias.map_or(0.0, |b| b.data[o]);
            y.fill(b0);
            let g = o / cog;
            for i in 0..cig {
                let ci = g * cig + i;
                let xr = &x.data[ci * s.len_in..(ci + 1) * s.len_in];
                for k in 0..s.k {
                    let wv = w.data[(o * cig + i) * s.k + k];
                    if wv == 0.0 {
                        continue;
                    }
                    let off = (k * s.dilation) as isize - s.pad as isize;
                    let (t0, t1) = valid(off, s.stride, s.len_in, lo_len);
                    if t0 >= t1 {
                        continue;
                    }
                    if s.stride == 1 {
                        let src0 = (t0 as isize + off) as usize;
                        let xs = &xr[src0..src0 + (t1 - t0)];
                        for (yv, &xv) in y[t0..t1].iter_mut().zip(xs) {
                            *yv += wv * xv;
                        }
                    } else {
                        for t in t0..t1 {
                            y[t] += wv * xr[(t as isize * s.stride as isize + off) as usize];
                        }
                    }
                }
            }
        }
    });
}

pub fn conv_transpose1d(
    pool: &Pool,
    x: &CpuTensor,
    w: &CpuTensor,
    bias: Option<&CpuTensor>,
    s: Conv1dShape,
    out: &mut CpuTensor,
) {
    let lo_len = s.len_out_transposed();
    let (cig, cog) = (s.c_in / s.groups, s.c_out / s.groups);
    assert!(
        x.data.len() >= s.c_in * s.len_in,
        "conv_transpose1d input too small"
    );
    assert!(
        w.data.len() >= s.c_in * cog * s.k,
        "conv_transpose1d weight too small"
    );
    assert!(
        out.data.len() >= s.c_out * lo_len,
        "conv_transpose1d output too small"
    );
    let rows = Rows(out.data.as_mut_ptr());
    // y[o, t * stride + k * dil - pad] += w[ci, o % cog, k] * x[ci, t]
    pool.run(s.c_out, |a, b| {
        let rows = rows;
        for o in a..b {
            // SAFETY: row `o` belongs to this thread alone and lies inside `out` (checked).
            let y = unsafe { std::slice::from_raw_parts_mut(rows.0.add(o * lo_len), lo_len) };
            y.fill(bias.map_or(0.0, |b| b.data[o]));
            let (g, oo) = (o / cog, o % cog);
            for i in 0..cig {
                let ci = g * cig + i;
                let xr = &x.data[ci * s.len_in..(ci + 1) * s.len_in];
                for k in 0..s.k {
                    let wv = w.data[(ci * cog + oo) * s.k + k];
                    let off = (k * s.dilation) as isize - s.pad as isize;
                    // Output index p = t * stride + off, 0 <= p < lo_len.
                    for (t, &xv) in xr.iter().enumerate() {
                        let p = t as isize * s.stride as isize + off;
                        if p >= 0 && (p as usize) < lo_len {
                            y[p as usize] += wv * xv;
                        }
                    }
                }
            }
        }
    });
}
