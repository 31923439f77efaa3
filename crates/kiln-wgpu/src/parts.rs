//! Weights larger than the adapter binds at once (`max_storage_buffer_binding_size`: 128 MiB
//! on lavapipe and some mobile drivers, less than a large vocabulary's embedding): held as
//! row ranges in buffers of their own, each product run part by part into scratch and
//! copied into its rows (lib.rs `products` hands such weights here; `embed` gathers part by
//! part).

use kiln_backend::{BackendError, WeightData};

use crate::device::Buf;
use crate::pack::{Packed, FMT_F16};
use crate::{
    ensure, grid_1d, Product, WgpuBackend, WgpuTensor, WgpuWeight, MODE_ADD, MODE_GATE_UP,
    MODE_STORE, OP_SILU_MUL,
};

impl WgpuBackend {
    /// `p` (packed from `w`) on the GPU: one buffer, or row ranges of their own where it is
    /// more than the adapter binds at once.
    pub(crate) fn weight_in_parts(
        &self,
        w: &WeightData<'_>,
        p: Packed,
    ) -> Result<WgpuWeight, BackendError> {
        let row_bytes = p.rw * 4;
        let max = self.gpu.max_binding as usize;
        let weight = |bytes: &[u8], rows: usize, parts: Vec<WgpuWeight>| WgpuWeight {
            buf: parts
                .first()
                .map_or_else(|| self.gpu.buffer_init(bytes), |p| p.buf.clone()),
            fmt: p.fmt,
            rw: p.rw,
            rows,
            cols: w.cols,
            stored_bytes: w.bytes.len(),
            parts,
        };
        if p.bytes.len() <= max {
            return Ok(weight(&p.bytes, w.rows, Vec::new()));
        }
        // More than one binding holds: row ranges of their own (f16 rows of an odd width
        // share words, so those cannot be cut).
        let per = max / row_bytes.max(1);
        if per == 0 || (p.fmt == FMT_F16 && w.cols % 2 == 1) {
            return Err(BackendError::Weight {
                name: w.name.into(),
                what: format!(
                    "{} bytes on the GPU: more than the adapter binds at once ({max}), and \
                     its rows cannot be split",
                    p.bytes.len()
                ),
            });
        }
        let parts = (0..w.rows)
            .step_by(per)
            .map(|r0| {
                let r1 = (r0 + per).min(w.rows);
                weight(
                    &p.bytes[r0 * row_bytes..r1 * row_bytes],
                    r1 - r0,
                    Vec::new(),
                )
            })
            .collect();
        Ok(weight(&[], w.rows, parts))
    }

    /// One product of `products` whose weight is held in parts: each part's rows into a
    /// scratch tensor (with its bias rows, and for MODE_ADD the output rows it adds to), then
    /// copied into its rows of `out`; a SwiGLU pair (either matrix in parts) as its gate into
    /// `out` and its up half into scratch, each through `products`, then silu(gate) * up.
    pub(crate) fn products_split(
        &self,
        (w, w2, bias, out, mode): Product<'_>,
        x: &WgpuTensor,
        n: usize,
        norm: Option<(&WgpuTensor, f32)>,
    ) {
        if mode == MODE_GATE_UP {
            let up = w2.expect("a gate/up product has its up matrix");
            let rows = out.cols;
            let buf = ensure(
                &self.gpu,
                &mut self.scratch.borrow_mut().part_up,
                n * rows * 4,
            );
            let u = WgpuTensor {
                buf,
                rows: n,
                cols: rows,
            };
            self.products(&[(w, None, None, out, MODE_STORE)], x, n, norm);
            self.products(&[(up, None, None, &u, MODE_STORE)], x, n, norm);
            self.elementwise(&out.buf, &u.buf, OP_SILU_MUL, 0.0, n * rows);
            return;
        }
        let mut r0 = 0;
        for part in w.pieces() {
            let ri = part.rows;
            let (buf, bias_buf) = {
                let mut sc = self.scratch.borrow_mut();
                let sc = &mut *sc;
                (
                    ensure(&self.gpu, &mut sc.part, n * ri * 4),
                    bias.map(|_| ensure(&self.gpu, &mut sc.part_bias, ri * 4)),
                )
            };
            let tmp = WgpuTensor {
                buf,
                rows: n,
                cols: ri,
            };
            let tb = bias.zip(bias_buf).map(|(b, buf)| {
                self.copy_words(&b.buf, r0, &buf, 0, ri);
                WgpuTensor {
                    buf,
                    rows: 1,
                    cols: ri,
                }
            });
            if mode == MODE_ADD {
                self.copy_2d(&out.buf, (r0, out.cols), &tmp.buf, (0, ri), (n, ri));
            }
            self.products(&[(part, None, tb.as_ref(), &tmp, mode)], x, n, norm);
            self.copy_2d(&tmp.buf, (0, ri), &out.buf, (r0, out.cols), (n, ri));
            r0 += ri;
        }
    }

    /// Copies `rows` rows of `width` words: from word `so` of `src` (rows `ss` words apart)
    /// to word `doff` of `dst` (rows `ds` apart).
    fn copy_2d(
        &self,
        src: &Buf,
        (so, ss): (usize, usize),
        dst: &Buf,
        (doff, ds): (usize, usize),
        (rows, width): (usize, usize),
    ) {
        let n = rows * width;
        if n == 0 {
            return;
        }
        self.gpu.dispatch(
            "misc",
            "copy2d",
            &[
                n as u32,
                width as u32,
                ss as u32,
                so as u32,
                doff as u32,
                ds as u32,
            ],
            &[src, dst],
            grid_1d(n),
        );
    }
}
