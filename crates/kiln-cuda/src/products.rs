//! The products: matrices as the kernels see them, the one-token products and their hand-over
//! of quantized activations (kernels/products.cu), cuBLAS for prompts.

use super::*;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Mat {
    pub(crate) q: u64,
    pub(crate) s: u64,
    pub(crate) s2: u64,
    pub(crate) bias: u64,
    pub(crate) out: u64,
    pub(crate) rows: i32,
    pub(crate) fmt: i32,
    pub(crate) ld_out: i32,
    /// 1 where an FMT_F32 matrix holds another format widened (kernels/*.cu Mat: the
    /// struct's padding, read by none of them; the host's gemm keeps f32 arithmetic for
    /// genuine f32 weights only).
    pub(crate) widened: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Mats {
    pub(crate) m: [Mat; 3],
    pub(crate) n_mats: i32,
    pub(crate) row0: [i32; 4],
}

/// kernels/*.cu QOut: where a decode product writes its output quantized.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct QOut {
    pub(crate) xq: u64,
    pub(crate) norm_w: u64,
    pub(crate) ss: u64,
}

pub(crate) const MODE_STORE: i32 = 0;

pub(crate) const MODE_ADD: i32 = 1;

pub(crate) const MODE_GATE_UP: i32 = 2;
/// out = gelu_tanh(W0 x) * (W1 x) (GeGLU), as MODE_GATE_UP otherwise.
pub(crate) const MODE_GATE_UP_GELU: i32 = 3;

/// Whether `mode` is a gate/up pair (SiLU or GELU).
pub(crate) fn gate_up(mode: i32) -> bool {
    mode == MODE_GATE_UP || mode == MODE_GATE_UP_GELU
}

/// Rows whose quantized form an activation buffer holds, written by the op that wrote the
/// rows (attention's combine, a decode product's epilogue); taken by the next product.
#[derive(Clone, Copy, PartialEq)]
pub(crate) struct XqSrc {
    /// The rows and their token count.
    pub(crate) x: u64,
    pub(crate) n: usize,
    /// The RMSNorm weights the values were multiplied by (0: none), and where their sum of
    /// squares is (0: the values are normalised already, or no norm).
    pub(crate) norm: u64,
    pub(crate) ss: u64,
    /// The buffer, and whether it also holds the 1 / rms slot the float formats' products
    /// read (attn_combine writes it; a decode product's epilogue does not).
    pub(crate) xq: u64,
    pub(crate) inv: bool,
}

/// Floats of the per-block sums of squares one step's decode products may leave for their
/// consumers (kernels/products.cu QOut: a float per 32 output values; every block writes its
/// own, so nothing needs zeroing).
pub(crate) const SS_SLOTS: usize = 1 << 16;

/// The one format of a launch's matrices as an index of the kernel tables below: 0 (`any`)
/// for a mix (or a float format), then Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, and 6 for a mix of Q4_K
/// and Q6_K (llama.cpp's K-quant files: the decode kernels' `kmix`, holding only those two
/// formats' code; the other kernels take it as `any`).
fn fmt_index(mats: &Mats, mode: i32) -> usize {
    let n_used = if gate_up(mode) {
        2
    } else {
        mats.n_mats as usize
    };
    let used = &mats.m[..n_used];
    let fmt = mats.m[0].fmt;
    let k = |m: &Mat| m.fmt == pack::FMT_Q4_K || m.fmt == pack::FMT_Q6_K;
    match fmt {
        _ if used.iter().all(k) && used.iter().any(|m| m.fmt != fmt) => 6,
        _ if used.iter().any(|m| m.fmt != fmt) => 0,
        pack::FMT_Q4_0 => 1,
        pack::FMT_Q4_1 => 2,
        pack::FMT_Q8_0 => 3,
        pack::FMT_Q4_K => 4,
        pack::FMT_Q6_K => 5,
        _ => 0,
    }
}

/// kernels/products.cu's matvec_<format>_<nr>_<tokens>, by [`fmt_index`], nr 1/2 and room
/// for one token / MAX_TOK (names, not formatted per launch).
const MATVEC: [[[&str; 2]; 2]; 7] = [
    [
        ["matvec_any_1_1", "matvec_any_1_4"],
        ["matvec_any_2_1", "matvec_any_2_4"],
    ],
    [
        ["matvec_q4_0_1_1", "matvec_q4_0_1_4"],
        ["matvec_q4_0_2_1", "matvec_q4_0_2_4"],
    ],
    [
        ["matvec_q4_1_1_1", "matvec_q4_1_1_4"],
        ["matvec_q4_1_2_1", "matvec_q4_1_2_4"],
    ],
    [
        ["matvec_q8_0_1_1", "matvec_q8_0_1_4"],
        ["matvec_q8_0_2_1", "matvec_q8_0_2_4"],
    ],
    [
        ["matvec_q4_k_1_1", "matvec_q4_k_1_4"],
        ["matvec_q4_k_2_1", "matvec_q4_k_2_4"],
    ],
    [
        ["matvec_q6_k_1_1", "matvec_q6_k_1_4"],
        ["matvec_q6_k_2_1", "matvec_q6_k_2_4"],
    ],
    [
        ["matvec_any_1_1", "matvec_any_1_4"],
        ["matvec_any_2_1", "matvec_any_2_4"],
    ],
];

/// kernels/products.cu's matvec_dec_<format>_<rows>_1 (one token), by [`fmt_index`] and rows
/// 1 / 4.
const MATVEC_DEC: [[&str; 2]; 7] = [
    ["matvec_dec_any_1_1", "matvec_dec_any_4_1"],
    ["matvec_dec_q4_0_1_1", "matvec_dec_q4_0_4_1"],
    ["matvec_dec_q4_1_1_1", "matvec_dec_q4_1_4_1"],
    ["matvec_dec_q8_0_1_1", "matvec_dec_q8_0_4_1"],
    ["matvec_dec_q4_k_1_1", "matvec_dec_q4_k_4_1"],
    ["matvec_dec_q6_k_1_1", "matvec_dec_q6_k_4_1"],
    ["matvec_dec_kmix_1_1", "matvec_dec_kmix_4_1"],
];

/// kernels/products.cu's matvec_dec_<format>_4_1g, by [`fmt_index`]: one token of a gate/up
/// pair in three blocks a multiprocessor.
const MATVEC_DEC_GU: [&str; 7] = [
    "matvec_dec_any_4_1g",
    "matvec_dec_q4_0_4_1g",
    "matvec_dec_q4_1_4_1g",
    "matvec_dec_q8_0_4_1g",
    "matvec_dec_q4_k_4_1g",
    "matvec_dec_q6_k_4_1g",
    "matvec_dec_kmix_4_1g",
];

/// kernels/products.cu's matvec_dec_<format>_4_1n / _4_1p, by [`fmt_index`]: one token, four
/// rows a warp, the mode fixed (not a pair / a gate/up pair).
const MATVEC_DEC_FIXED: [[&str; 2]; 7] = [
    ["matvec_dec_any_4_1n", "matvec_dec_any_4_1p"],
    ["matvec_dec_q4_0_4_1n", "matvec_dec_q4_0_4_1p"],
    ["matvec_dec_q4_1_4_1n", "matvec_dec_q4_1_4_1p"],
    ["matvec_dec_q8_0_4_1n", "matvec_dec_q8_0_4_1p"],
    ["matvec_dec_q4_k_4_1n", "matvec_dec_q4_k_4_1p"],
    ["matvec_dec_q6_k_4_1n", "matvec_dec_q6_k_4_1p"],
    ["matvec_dec_kmix_4_1n", "matvec_dec_kmix_4_1p"],
];

/// kernels/products.cu's matvec_dec_<format>_<rows>_l2 / _l: matvec_dec_tloop (the tokens in
/// a loop, 2 / DEC_TILE a block), by [`fmt_index`] and rows 1 / 4.
const MATVEC_DEC_LOOP: [[[&str; 2]; 2]; 7] = [
    [
        ["matvec_dec_any_1_l2", "matvec_dec_any_1_l"],
        ["matvec_dec_any_4_l2", "matvec_dec_any_4_l"],
    ],
    [
        ["matvec_dec_q4_0_1_l2", "matvec_dec_q4_0_1_l"],
        ["matvec_dec_q4_0_4_l2", "matvec_dec_q4_0_4_l"],
    ],
    [
        ["matvec_dec_q4_1_1_l2", "matvec_dec_q4_1_1_l"],
        ["matvec_dec_q4_1_4_l2", "matvec_dec_q4_1_4_l"],
    ],
    [
        ["matvec_dec_q8_0_1_l2", "matvec_dec_q8_0_1_l"],
        ["matvec_dec_q8_0_4_l2", "matvec_dec_q8_0_4_l"],
    ],
    [
        ["matvec_dec_q4_k_1_l2", "matvec_dec_q4_k_1_l"],
        ["matvec_dec_q4_k_4_l2", "matvec_dec_q4_k_4_l"],
    ],
    [
        ["matvec_dec_q6_k_1_l2", "matvec_dec_q6_k_1_l"],
        ["matvec_dec_q6_k_4_l2", "matvec_dec_q6_k_4_l"],
    ],
    [
        ["matvec_dec_kmix_1_l2", "matvec_dec_kmix_1_l"],
        ["matvec_dec_kmix_4_l2", "matvec_dec_kmix_4_l"],
    ],
];

/// kernels/products.cu's matvec_dec_<format>_<rows>_t1: matvec_dec_tokens with one token a
/// block (two tokens' products), by [`fmt_index`] and rows 1 / 4.
const MATVEC_DEC_T1: [[&str; 2]; 7] = [
    ["matvec_dec_any_1_t1", "matvec_dec_any_4_t1"],
    ["matvec_dec_q4_0_1_t1", "matvec_dec_q4_0_4_t1"],
    ["matvec_dec_q4_1_1_t1", "matvec_dec_q4_1_4_t1"],
    ["matvec_dec_q8_0_1_t1", "matvec_dec_q8_0_4_t1"],
    ["matvec_dec_q4_k_1_t1", "matvec_dec_q4_k_4_t1"],
    ["matvec_dec_q6_k_1_t1", "matvec_dec_q6_k_4_t1"],
    ["matvec_dec_kmix_1_t1", "matvec_dec_kmix_4_t1"],
];

/// Tokens a decode kernel's block takes (kernels/*.cu DEC_TILE).
const DEC_TILE: usize = 8;

/// Tokens up to which several tokens' decode products take two tokens a block
/// (matvec_dec_tloop's _l2), above DEC_TILE (_l); two tokens take one a block
/// (matvec_dec_tokens' _t1). The loop is not unrolled: the code and registers of one
/// token, where an unrolled tile of four made a kernel three times one token's size whose
/// warps waited on instruction fetch (ncu, two tokens: 31-36% of the stalls "no
/// instruction", 6% with the loop). On an H100 (Qwen3-0.6B shape, Q4_0, kiln bench
/// --parallel, tok/s; unrolled tiles / one a block / loop of two / loop of eight): 2 tokens
/// 1591 / 2526 / 2312 / 2382, 4: 2570 / 3875 / 4142 / 3575, 8: 4730 / 4807 / 6170 / 4750,
/// 12: - / 5098 / 6279 / 6756, 16: 6825 / 5386 / 7490 / 8469, 32: 7950 / 5808 / 8206 / 11675;
/// and above 32 tokens, a kernel with one warp a row (which read enough in flight only there)
/// against the loop of eight: 48 tokens 8158 / 10955, 64: 9177 / 12698.
const DEC_LOOP2_MAX: usize = 8;

/// Tokens up to which a product of quantized weights runs as the decode kernel, each token's
/// sums computed as they are alone (batch-invariant: a server's answer does not depend on
/// what else it runs); from here on through cuBLAS (the tensor cores: prompts).
pub(crate) const DEC_MAX_TOK: usize = 64;

/// The kernels the launch tables above name, each once (device.rs kernel_names).
pub(crate) fn product_kernel_names() -> impl Iterator<Item = &'static str> {
    let mut names: Vec<&'static str> = Vec::new();
    for n in MATVEC
        .iter()
        .flatten()
        .flatten()
        .chain(MATVEC_DEC.iter().flatten())
        .chain(MATVEC_DEC_GU.iter())
        .chain(MATVEC_DEC_FIXED.iter().flatten())
        .chain(MATVEC_DEC_T1.iter().flatten())
        .chain(MATVEC_DEC_LOOP.iter().flatten().flatten())
    {
        if !names.contains(n) {
            names.push(n);
        }
    }
    names.into_iter()
}

/// Warps a row of a decode product at most (kernels/*.cu DEC_KW_MAX).
const DEC_KW_MAX: usize = 2;

impl CudaBackend {
    pub(crate) fn mat(&self, w: &CudaWeight, bias: Option<&CudaTensor>, out: &CudaTensor) -> Mat {
        Mat {
            q: w.q.ptr,
            s: w.s.ptr,
            s2: w.s2.ptr,
            bias: bias.map_or(0, |b| b.buf.ptr),
            out: out.buf.ptr,
            rows: w.rows as i32,
            fmt: w.fmt,
            ld_out: out.cols as i32,
            widened: w.widened as i32,
        }
    }

    pub(crate) fn mats(&self, list: &[(&CudaWeight, Option<&CudaTensor>, &CudaTensor)]) -> Mats {
        let mut m = Mats {
            n_mats: list.len() as i32,
            ..Default::default()
        };
        let mut r = 0;
        for (i, (w, b, o)) in list.iter().enumerate() {
            m.m[i] = self.mat(w, *b, o);
            m.row0[i] = r;
            r += w.rows as i32;
        }
        m.row0[list.len()] = r;
        m
    }

    /// Three products of x (RMS-normed with `norm` first, where given) in the same launches.
    pub(crate) fn matvec3(
        &self,
        ws: [&CudaWeight; 3],
        biases: [Option<&CudaTensor>; 3],
        x: &CudaTensor,
        n: usize,
        norm: Option<(&CudaTensor, f32)>,
        outs: [&mut CudaTensor; 3],
    ) {
        let m = self.mats(&[
            (ws[0], biases[0], &*outs[0]),
            (ws[1], biases[1], &*outs[1]),
            (ws[2], biases[2], &*outs[2]),
        ]);
        let x = (x.buf.ptr, x.cols);
        self.matvec(m, x, ws[0].cols, n, norm, MODE_STORE, None);
    }

    /// One matvec launch per MAX_TOK tokens over the matrices of `mats`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matvec(
        &self,
        mut mats: Mats,
        x: (u64, usize),
        cols: usize,
        n: usize,
        norm: Option<(&CudaTensor, f32)>,
        mode: i32,
        qout: Option<u64>,
    ) {
        if n > DEC_MAX_TOK && !self.recording.get() {
            let fits = self.own_gemm_fits(&mats, cols, mode);
            if !fits {
                // f32 arithmetic (or odd columns): cuBLAS, where the backend may still start
                // it. The first block product settles whether it is used (LazyBlas::get).
                self.blas.want();
            }
            if fits || self.blas.is_some() {
                self.xq_src.set(None);
                return self.gemm(&mats, x, cols, n, norm, mode);
            }
        }
        let total = if gate_up(mode) {
            mats.m[0].rows as usize
        } else {
            mats.row0[mats.n_mats as usize] as usize
        };
        let quantized = |m: &Mat| m.fmt != FMT_F32 && m.fmt != FMT_F16;
        let n_used = if gate_up(mode) {
            2
        } else {
            mats.n_mats as usize
        };
        let dec = n <= DEC_MAX_TOK && cols % 32 == 0 && mats.m[..n_used].iter().all(quantized);
        // Rows written quantized for the next product (decode kernels with 4 rows a warp:
        // 32 rows a block, one 32-value block of the output).
        let fuse_out = qout.is_some() && self.in_step.get() && total % 32 == 0;
        let (xq_a, xq_b, moved) = {
            let mut sc = self.scratch.borrow_mut();
            // Room for any decode launch's tokens, so that a batch never grows them (nor
            // drops the step's recordings).
            let width = if dec && fuse_out {
                cols.max(total)
            } else {
                cols
            };
            let bytes = pack::xq_bytes(width, DEC_MAX_TOK.max(MAX_TOK));
            assert!(
                !self.recording.get()
                    || [&sc.xq, &sc.xq2]
                        .iter()
                        .all(|b| b.as_ref().is_some_and(|b| b.bytes >= bytes)),
                "activation buffer grown inside a recorded step"
            );
            // A buffer that grows keeps what it held (a previous op's quantized rows, which
            // this product may read): the same sums whether or not it had to grow.
            let sc = &mut *sc;
            let mut moved = [(0u64, 0u64); 2];
            for (i, slot) in [&mut sc.xq, &mut sc.xq2].into_iter().enumerate() {
                if slot.as_ref().is_some_and(|b| b.bytes < bytes) {
                    let old = slot.take().expect("checked");
                    let new = ensure(slot, bytes);
                    self.dev.dtod(new, old.ptr, old.bytes);
                    moved[i] = (old.ptr, new);
                }
            }
            let (a, b) = (ensure(&mut sc.xq, bytes), ensure(&mut sc.xq2, bytes));
            (a, b, moved)
        };
        let norm_w = norm.map_or(0u64, |(w, _)| w.buf.ptr);
        let eps = norm.map_or(0f32, |(_, e)| e);
        // Rows the previous op wrote already quantized (attn_combine, a decode product's
        // epilogue) need no quant_act (where a buffer just grew, they are in its new place).
        let src = self
            .xq_src
            .take()
            .filter(|s| s.x == x.0 && s.n == n && s.norm == norm_w)
            .map(|mut s| {
                if let Some(&(_, new)) = moved.iter().find(|m| m.0 == s.xq && m.1 != 0) {
                    s.xq = new;
                }
                s
            });
        if dec {
            // 1..DEC_MAX_TOK tokens (kernels/*.cu matvec_dec_impl): each token's arithmetic
            // the same whatever the number of tokens, so every choice below depends on the
            // matrices only, never on n.
            let (xq_in, ss_in) = match src {
                Some(s) => (s.xq, s.ss),
                None => {
                    self.quant_act(x.0, cols, n, norm_w, eps, xq_a);
                    (xq_a, 0)
                }
            };
            let xq_out = if xq_in == xq_a { xq_b } else { xq_a };
            // The output quantized too, for the next product; its sums of squares in the
            // step's slots, handed out in turn and from the start again when they run out
            // (a product writes its slots after the wait on the previous kernel, and its
            // consumer is the next product: slots two products back are free).
            let qo = match qout {
                Some(next_norm) if fuse_out => {
                    let ss = if next_norm == 0 {
                        0
                    } else {
                        let need = n * total / 32;
                        let mut slot = self.ss_next.get();
                        if slot + need > SS_SLOTS {
                            slot = 0;
                        }
                        self.ss_next.set(slot + need);
                        self.ss.ptr + 4 * slot as u64
                    };
                    self.xq_src.set(Some(XqSrc {
                        x: mats.m[0].out,
                        n,
                        norm: next_norm,
                        ss,
                        xq: xq_out,
                        inv: false,
                    }));
                    Some(QOut {
                        xq: xq_out,
                        norm_w: next_norm,
                        ss,
                    })
                }
                _ => None,
            };
            // A row over two warps where a block's 32 rows a warp group would leave
            // multiprocessors without a block (blocks of twice the warps). KILN_CUDA_DEC_KW
            // tunes.
            let kw = self.dec_kw(cols, total);
            // Four rows a warp whenever the matrices allow (the H200 sweep in BENCHMARKS,
            // nineteenth session, and for several tokens the fortieth); the sums are the same
            // bits either way. KILN_CUDA_DEC_ROWS tunes.
            let four_ok =
                (0..=mats.n_mats as usize).all(|i| mats.row0[i] % 4 == 0) && total % 4 == 0;
            let rows = match self.tune.dec_rows {
                _ if qo.is_some() => 4,
                Some(4) if four_ok => 4,
                Some(_) => 1,
                None if four_ok => 4,
                None => 1,
            };
            let nt = match n {
                1 | 2 => 1,
                _ if n <= DEC_LOOP2_MAX => 2,
                _ => DEC_TILE,
            };
            let blocks = (total.div_ceil(WARPS * rows) * n.div_ceil(nt)) as u32;
            let warps = WARPS * kw;
            // A gate/up pair whose blocks would not all fit at two a multiprocessor runs
            // in three (one preloaded block a row instead of two): on an H200, Qwen3-4B's
            // 304 blocks, tg128 595 -> 610 t/s; Llama-3.2-3B's 256 fit and stay (908
            // against 834 in three). KILN_CUDA_DEC_GU=0 never, 1 always.
            let fi = fmt_index(&mats, mode);
            let three = match self.tune.dec_gu {
                Some(g) => g == 1,
                None => blocks as usize > 2 * self.dev.num_sms,
            };
            // One token, four rows: the kernel fixed to the launch's mode where the run-time-
            // mode one spills (ptxas: every format but Q4_0 and Q4_1, whose run-time-mode
            // kernel measured faster on the H200 than its 85-register fixed one).
            // KILN_CUDA_DEC_FIXED=0 never, 1 always.
            let fixed = match self.tune.dec_fixed {
                Some(f) => f == 1,
                None => !matches!(fi, 1 | 2),
            };
            let name = if rows == 4 && n == 1 && kw == 1 && gate_up(mode) && three {
                MATVEC_DEC_GU[fi]
            } else if rows == 4 && n == 1 && fixed {
                MATVEC_DEC_FIXED[fi][gate_up(mode) as usize]
            } else if n == 1 {
                MATVEC_DEC[fi][(rows == 4) as usize]
            } else if nt == 1 {
                MATVEC_DEC_T1[fi][(rows == 4) as usize]
            } else {
                MATVEC_DEC_LOOP[fi][(rows == 4) as usize][(nt == DEC_TILE) as usize]
            };
            let mut a = Args::default()
                .a(mats)
                .a(xq_in)
                .a(cols as i32)
                .a(n as i32)
                .a(ss_in)
                .a(eps)
                .a(mode)
                .a(kw as i32)
                .a(qo.unwrap_or_default());
            self.dev.launch(
                self.dev.func(name),
                (blocks, 1, 1),
                (32 * warps as u32, 1, 1),
                0,
                &mut a.ptrs(),
            );
            return;
        }
        // (The matvec kernels read the 1 / rms slot: only a source that wrote it will do.)
        let pre_quantized = src.is_some_and(|s| s.ss == 0 && s.inv) && n <= MAX_TOK;
        let xq = match src {
            Some(s) if pre_quantized => s.xq,
            _ => xq_a,
        };
        let (nr, kw) = self.matvec_shape(&mats, cols, total);
        let blocks = total.div_ceil(WARPS / kw * nr) as u32;
        let prefetch = self.dev.pdl as i32;
        // kernels/*.cu's matvec_<format>_<nr>_<tokens>: room for one token or MAX_TOK.
        let func = self
            .dev
            .func(MATVEC[fmt_index(&mats, mode)][nr - 1][(n > 1) as usize]);
        let outs = mats.m.map(|m| m.out);
        let mut t0 = 0;
        while t0 < n {
            let nt = (n - t0).min(MAX_TOK);
            for (i, m) in mats.m.iter_mut().enumerate() {
                m.out = outs[i] + (t0 * m.ld_out as usize * 4) as u64;
            }
            let xt = x.0 + (t0 * x.1 * 4) as u64;
            if !pre_quantized {
                self.quant_act(xt, cols, nt, norm_w, eps, xq);
            }
            let mut a = Args::default()
                .a(mats)
                .a(xt)
                .a(xq)
                .a(cols as i32)
                .a(nt as i32)
                .a(norm_w)
                .a(mode)
                .a(kw as i32)
                .a(prefetch);
            self.dev.launch(
                func,
                (blocks, 1, 1),
                (32 * WARPS as u32, 1, 1),
                0,
                &mut a.ptrs(),
            );
            t0 += nt;
        }
    }

    /// Warps a row of a decode product (1..=DEC_KW_MAX), from the matrices' shape alone (never
    /// the tokens: a token's sums must not depend on what else the step runs): two where
    /// blocks of 32 rows would not give every multiprocessor one and a row has at least two
    /// warps' worth of blocks.
    fn dec_kw(&self, cols: usize, total: usize) -> usize {
        let narrow = total.div_ceil(32) < self.dev.num_sms && cols / 32 >= 2 * 32;
        self.tune
            .dec_kw
            .unwrap_or(if narrow { DEC_KW_MAX } else { 1 })
            .min(DEC_KW_MAX)
    }

    /// Rows per warp group (nr) and warps per row group (kw) of a matvec launch: rows split
    /// over k when a row has many blocks, and rows grouped while that still leaves enough
    /// warps to keep every multiprocessor's loads in flight. KILN_CUDA_NR / KILN_CUDA_KW
    /// override (for tuning).
    pub(crate) fn matvec_shape(&self, mats: &Mats, cols: usize, total: usize) -> (usize, usize) {
        let nb = cols / 32;
        let kw = self.tune.kw.unwrap_or(match nb {
            0..128 => 1,
            128..256 => 2,
            _ => 4,
        });
        let divides = |nr: usize| {
            mats.row0[..=mats.n_mats as usize]
                .iter()
                .chain(std::iter::once(&(total as i32)))
                .all(|&r| r as usize % nr == 0)
        };
        // Measured on an H200 (Qwen3-0.6B/4B shapes): two rows per warp pay only where a lane
        // has a single block of each row and rows are plentiful; four never did.
        let want = self.dev.num_sms * 8;
        let nr = match self.tune.nr {
            Some(n) if divides(n) => n,
            _ if nb <= 32 && divides(2) && total / 2 * kw >= want => 2,
            _ => 1,
        };
        (nr, kw)
    }

    /// Whether kiln's own block-product kernel (kernels/gemm.cu) takes `mats`' products: f16
    /// operands (f32 weights keep cuBLAS's f32 arithmetic), 8-column steps, sm_80 and up.
    fn own_gemm_fits(&self, mats: &Mats, cols: usize, mode: i32) -> bool {
        let used = if gate_up(mode) {
            2
        } else {
            mats.n_mats as usize
        };
        self.dev.major >= 8
            && cols % 8 == 0
            && mats.m[..used]
                .iter()
                .all(|m| !(m.fmt == FMT_F32 && m.widened == 0))
    }

    /// The products of `mats` for n tokens on the tensor cores: each matrix widened to f16
    /// (the activations too, after the fused RMSNorm), f32 sums; through cuBLAS where it is
    /// loaded, else kiln's own kernel (kernels/gemm.cu gemm_f16_*).
    pub(crate) fn gemm(
        &self,
        mats: &Mats,
        x: (u64, usize),
        cols: usize,
        n: usize,
        norm: Option<(&CudaTensor, f32)>,
        mode: i32,
    ) {
        let max_rows = mats.m[..mats.n_mats as usize]
            .iter()
            .map(|m| m.rows as usize)
            .max()
            .unwrap_or(0);
        // f32 weights (Kokoro's) keep f32 arithmetic, as the CPU's: an f16 product would
        // round both operands. (Formats widened to f32 at load, BF16 or Q5_1 say, stay on the
        // tensor cores.)
        let f32w = mats.m[..mats.n_mats as usize]
            .iter()
            .all(|m| m.fmt == FMT_F32 && m.widened == 0);
        let own = self.tune.own_gemm && self.own_gemm_fits(mats, cols, mode);
        let h = match self.blas.get() {
            Some(b) if f32w || !own => Some(b.0),
            _ => None,
        };
        assert!(h.is_some() || !f32w, "f32 block products need cuBLAS");
        let (w16, x16, tmp) = {
            let mut sc = self.scratch.borrow_mut();
            let xb = if f32w { 4 } else { 2 };
            (
                if f32w {
                    0
                } else {
                    ensure(&mut sc.w16, max_rows * cols * 2)
                },
                ensure(&mut sc.x16, n * cols * xb),
                ensure(&mut sc.tmp, n * max_rows * 4),
            )
        };
        assert_eq!(x.1, cols, "gemm: activations of {} columns for {cols}", x.1);
        let norm_w = norm.map_or(0u64, |(w, _)| w.buf.ptr);
        let eps = norm.map_or(0f32, |(_, e)| e);
        // The activations (RMS-normalised first, with a norm): f16 for the tensor cores, or
        // f32 as they are.
        let xp = match (f32w, norm) {
            (true, None) => x.0,
            (true, Some(_)) => {
                self.rms_norm_rows(x.0, norm_w, eps, cols, n, x16);
                x16
            }
            (false, _) => {
                let mut a = Args::default()
                    .a(x.0)
                    .a(cols as i32)
                    .a(norm_w)
                    .a(eps)
                    .a(x16);
                self.launch_rows("rows_f16", n, &mut a);
                x16
            }
        };
        for (i, m) in mats.m[..mats.n_mats as usize].iter().enumerate() {
            let rows = m.rows as usize;
            let gate_up_second = gate_up(mode) && i == 1;
            let (out, ld) = match gate_up_second {
                true => (tmp, rows),
                false => (m.out, m.ld_out as usize),
            };
            let beta = if mode == MODE_ADD { 1f32 } else { 0f32 };
            if f32w {
                // Column-major out^T (rows x n) = W^T x^T, both f32.
                self.sgemm(
                    (true, false),
                    (rows, n, cols),
                    (m.q, cols),
                    (xp, cols),
                    beta,
                    (out, ld),
                );
                self.gemm_bias(m, out, rows, ld, n);
                continue;
            }
            let wp = if m.fmt == FMT_F16 {
                m.q
            } else {
                let mut a = Args::default().a(*m).a(rows as i32).a(cols as i32).a(w16);
                // A thread per 32-value block of the quantized formats (kernels/*.cu).
                let per_block = m.fmt != FMT_F32 && cols % 32 == 0;
                let threads = if per_block {
                    rows * cols / 32
                } else {
                    rows * cols
                };
                self.elementwise_n_args("dequant_f16", &mut a, threads);
                w16
            };
            let Some(h) = h else {
                self.gemm_own((x16, wp, m.bias), (n, rows, cols), beta != 0.0, (out, ld));
                continue;
            };
            // SAFETY: the handle is the backend's; the buffers hold these shapes.
            unsafe { blas_gemm_f16(h, (rows, n, cols), wp, x16, beta, (out, ld)) }
                .unwrap_or_else(|e| panic!("cuBLAS GEMM failed: {e:?}"));
            self.gemm_bias(m, out, rows, ld, n);
        }
        if gate_up(mode) {
            // out = act(gate) * up, both (n, rows) with the output's row stride = rows.
            let m = &mats.m[0];
            assert_eq!(m.ld_out, m.rows, "gate/up output rows are the FFN width");
            let a = Args::default().a(m.out).a(tmp);
            let op = match mode {
                MODE_GATE_UP_GELU => "gelu_tanh_mul",
                _ => "silu_mul",
            };
            self.elementwise(op, a, n * m.rows as usize);
        }
    }

    /// out (n x rows, ld apart) = x16 (n x cols) w16^T [+ out] [+ bias] on kiln's own
    /// tensor-core kernel: blocks of 128 x 128 where they fill the multiprocessors, else of
    /// 64 x 64.
    fn gemm_own(
        &self,
        (x16, w16, bias): (u64, u64, u64),
        (n, rows, cols): (usize, usize, usize),
        add: bool,
        (out, ld): (u64, usize),
    ) {
        let big = n.div_ceil(128) * rows.div_ceil(128) >= self.dev.num_sms;
        // (name, block side, threads, shared bytes: kernels/gemm.cu GM_SMEM)
        let (name, tile, threads, smem) = match big {
            true => ("gemm_f16_128", 128, 256, crate::device::BIG_SMEM[0].1),
            false => ("gemm_f16_64", 64, 128, 4 * 128 * 40 * 2),
        };
        let mut a = Args::default()
            .a(x16)
            .a(w16)
            .a(bias)
            .a(n as i32)
            .a(rows as i32)
            .a(cols as i32)
            .a(add as i32)
            .a(out)
            .a(ld as i32);
        self.dev.launch(
            self.dev.func(name),
            (rows.div_ceil(tile) as u32, n.div_ceil(tile) as u32, 1),
            (threads, 1, 1),
            smem,
            &mut a.ptrs(),
        );
    }

    /// A gemm output's bias, added to its n rows (rows values, ld apart).
    fn gemm_bias(&self, m: &Mat, out: u64, rows: usize, ld: usize, n: usize) {
        if m.bias != 0 {
            let mut a = Args::default()
                .a(out)
                .a(m.bias)
                .a(rows as i32)
                .a(ld as i32)
                .a(n as i32);
            self.elementwise_n_args("add_bias", &mut a, rows * n);
        }
    }

    /// Quantizes n rows of x (cols values; RMS-normalised with norm_w first, when not 0)
    /// into the activation buffer xq (kernels/*.cu quant_act).
    /// The activation buffer (`sc.xq`) with room for `bytes`, for an op that writes rows
    /// quantized for the next product; a recorded step must find it grown already.
    pub(crate) fn xq_scratch(&self, bytes: usize) -> u64 {
        let mut sc = self.scratch.borrow_mut();
        assert!(
            !self.recording.get() || sc.xq.as_ref().is_some_and(|b| b.bytes >= bytes),
            "activation buffer grown inside a recorded step"
        );
        ensure(&mut sc.xq, bytes)
    }

    pub(crate) fn quant_act(&self, x: u64, cols: usize, n: usize, norm_w: u64, eps: f32, xq: u64) {
        let mut a = Args::default()
            .a(x)
            .a(cols as i32)
            .a(n as i32)
            .a(norm_w)
            .a(eps)
            .a(xq);
        self.dev.launch(
            self.dev.func("quant_act"),
            (n as u32, 1, 1),
            (1024, 1, 1),
            0,
            &mut a.ptrs(),
        );
    }
}
