//! Picks where the logits are: argmax keys, sampling candidates, a grammar's mask, and the
//! greedy pick fed to the next step on the device (`LlmOps::argmax_feed`).

use cudarc::driver::sys;
use kiln_backend::FED_TOKEN;

use crate::device::Readback;
use crate::launch::{ensure, Args};
use crate::{CudaBackend, CudaTensor};

/// Values a block of kernels/*.cu topk_chunks sorts (at most this many sampling candidates).
const TOPK_CHUNK: usize = 2048;

/// The column of an argmax key (kernels/*.cu argmax_key: the value's order-preserving bits
/// above !column); a row of NaNs leaves 0, read as column 0.
fn key_column(key: u64) -> u32 {
    if key == 0 {
        0
    } else {
        !(key as u32)
    }
}

/// The value of an argmax key.
fn key_value(key: u64) -> f32 {
    let b = (key >> 32) as u32;
    f32::from_bits(if b & 0x8000_0000 != 0 {
        b & 0x7fff_ffff
    } else {
        !b
    })
}

impl CudaBackend {
    /// Queues argmax keys of the first `n` rows of `x` (their first `cols` values) into `out`.
    fn queue_argmax(&self, x: &CudaTensor, n: usize, cols: usize, out: sys::CUdeviceptr) {
        self.dev.memset_u32(out, 0, 2 * n.max(1));
        let mut a = Args::default()
            .a(x.buf.ptr)
            .a(cols as i32)
            .a(x.cols as i32)
            .a(out);
        let bx = cols.div_ceil(256 * 8).clamp(1, 256) as u32;
        self.dev.launch(
            self.dev.func("argmax"),
            (bx, n as u32, 1),
            (256, 1, 1),
            0,
            &mut a.ptrs(),
        );
    }

    pub(crate) fn argmax_rows_gpu(&self, x: &CudaTensor, n: usize, cols: usize) -> Vec<u32> {
        let out = ensure(&mut self.scratch.borrow_mut().argmax, 8 * n.max(1));
        self.queue_argmax(x, n, cols, out);
        let mut v = vec![0u64; n];
        self.dev.dtoh(&mut v, out);
        v.into_iter().map(key_column).collect()
    }

    pub(crate) fn candidates_gpu(
        &self,
        x: &CudaTensor,
        cols: usize,
        k: usize,
        out: &mut Vec<(f32, u32)>,
    ) -> bool {
        if !self.topk || k == 0 || k > TOPK_CHUNK || cols == 0 {
            return false;
        }
        self.xq_src.set(None);
        let chunks = cols.div_ceil(TOPK_CHUNK);
        let buf = ensure(&mut self.scratch.borrow_mut().topk, 8 * chunks * k);
        let mut a = Args::default()
            .a(x.buf.ptr)
            .a(cols as i32)
            .a(k as i32)
            .a(buf);
        self.dev.launch(
            self.dev.func("topk_chunks"),
            (chunks as u32, 1, 1),
            (256, 1, 1),
            0,
            &mut a.ptrs(),
        );
        let keys = &mut self.scratch.borrow_mut().topk_keys;
        keys.resize(chunks * k, 0);
        self.dev.dtoh(keys, buf);
        out.clear();
        out.extend(keys.iter().filter_map(|&key| {
            // (Padding past the row's end sorts as 0, whose column is out of range.)
            let id = !(key as u32);
            ((id as usize) < cols).then_some((key_value(key), id))
        }));
        true
    }

    pub(crate) fn mask_row_gpu(
        &self,
        x: &mut CudaTensor,
        row: usize,
        cols: usize,
        allow: &[u32],
    ) -> bool {
        let cols = cols.min(x.cols).min(allow.len() * 32);
        if row >= x.rows || cols == 0 {
            return false;
        }
        self.xq_src.set(None);
        let buf = ensure(&mut self.scratch.borrow_mut().mask, 4 * allow.len());
        self.dev.htod(buf, allow);
        let mut a = Args::default()
            .a(x.buf.ptr + (row * x.cols * 4) as u64)
            .a(cols as i32)
            .a(buf);
        self.dev.launch(
            self.dev.func("mask_row"),
            (cols.div_ceil(256 * 4).clamp(1, 1024) as u32, 1, 1),
            (256, 1, 1),
            0,
            &mut a.ptrs(),
        );
        true
    }

    pub(crate) fn argmax_feed_gpu(&self, x: &CudaTensor, cols: usize) -> bool {
        if !self.feeds {
            return false;
        }
        let mut fed = self.fed.borrow_mut();
        let rb = match &mut *fed {
            Some(rb) => rb,
            None => match Readback::new() {
                Ok(rb) => fed.insert(rb),
                Err(_) => return false,
            },
        };
        self.queue_argmax(x, 1, cols, self.fed_key.ptr);
        let mut a = Args::default().a(self.fed_key.ptr).a(self.params.ptr);
        self.dev.launch(
            self.dev.func("feed_pick"),
            (1, 1, 1),
            (32, 1, 1),
            0,
            &mut a.ptrs(),
        );
        self.dev.read_back(rb, self.fed_key.ptr);
        // The device's parameters now hold one token, the pick: the mirror says so.
        if let Some((_, v)) = &mut *self.params_host.borrow_mut() {
            v.truncate(2);
            v[1] = 1;
            v.push(FED_TOKEN);
        }
        true
    }

    /// (feed_pick decodes the key as `key_column` does.)
    pub(crate) fn fed_token_gpu(&self) -> Option<u32> {
        Some(key_column(self.fed.borrow().as_ref()?.wait()))
    }
}
