//! Attention: the per-head work (q/k norm, RoPE, KV store) and split-K attention over the
//! f16 cache, for prompts and for one decode token (kernels/attention.cu).

use super::*;

/// Keys per attention warp and warps per block (kernels/*.cu ATT_WCHUNK, ATT_WARPS).
pub(crate) const ATT_WCHUNK: usize = 32;

pub(crate) const ATT_WARPS: usize = 4;

/// Keys a decode attention split takes at least: a shorter sequence uses fewer of its splits
/// (kernels/attention.cu DEC_SPLIT_KEYS).
pub(crate) const DEC_SPLIT_KEYS: usize = 64;

/// Keys a decode token takes in one split where it sees no more (kernels/attention.cu
/// DecHeads::one_split): a lone sequence's block then writes the attention's rows itself, so
/// a short cache's step has no attn_combine launch (its graph is recorded apart:
/// [`CudaBackend::one_split_step`]). H100, tg128 Q4_0 (BENCHMARKS.md, thirty-seventh
/// session): from an empty cache (1-128 keys) 0.6B +10.6%, 4B +3.1%, 3B +4.5% against the
/// splits and their combine; over 129-256 keys, one split for all of them was 3-5% slower,
/// over 385-512 10-24%.
pub(crate) const DEC_ONE_SPLIT: usize = 128;

/// Warps of a decode attention block for `group` query heads a KV head (kernels/attention.cu
/// DEC_W): eight where the group is at most 2, else four.
pub(crate) fn dec_warps(group: usize) -> usize {
    match group.next_power_of_two() {
        1 | 2 => 8,
        _ => 4,
    }
}

/// Decode attention blocks a multiprocessor, for caches of fewer than [`DEC_LONG_KEYS`]
/// positions (one more from there). On the H200 (Qwen3-0.6B shape, tg128, BENCHMARKS.md's
/// sixteenth session): at depth 4096 3 is the fastest (2: -2%, 4: -5%); at 16384 and 32768
/// 4 is (3: -5% and -9%; 5 and 6, more than one wave holds: -19% and -22%).
pub(crate) const DEC_BLOCKS_PER_SM: usize = 3;
/// From this many keys a decode attention takes a block a multiprocessor more (at 8192 the
/// two counts are within 1% of each other).
pub(crate) const DEC_LONG_KEYS: usize = 12288;
/// Thread groups of a decode step's attn_combine block where it has more splits than this,
/// each summing every COMBINE_GROUPS-th split (1, 2, 4 or 8: kernels/attention.cu
/// attn_combine_<P>). H100, tg128 Q4_0 against one group (BENCHMARKS.md, thirty-second
/// session): 8-11% faster at depths 4096 and 16384; where the cache is short, one group
/// is up to 5% faster.
pub(crate) const COMBINE_GROUPS: usize = 8;

// A prompt chunk's attention runs in one pass over the cache in the second form
// (kernels/flash.cu attn_flash2_<HD>) at any length where it applies. Measured on an H100
// (pp512 tok/s, cuBLAS products over gathered keys / the second form; the first form was
// slower than either below 8192 keys): Qwen3-0.6B shape d0 104,668 / 109,654, d1024 80,433
// / 93,025, d4096 45,836 / 57,716, d16384 (first form) 8,384 / 23,765; Qwen3-4B d0 26,804 /
// 29,299, d4096 9,161 / 18,418, d16384 5,600 / 9,256; Llama-3.2-3B d0 37,115 / 39,321,
// d4096 18,577 / 24,933 (BENCHMARKS.md, twenty-ninth session).

/// Keys a split of the one-pass prompt attention's second form takes at least.
const FLASH_SPLIT_KEYS: usize = 1024;

/// Blocks a multiprocessor holds of the decode kernel for `group` query heads a KV head
/// (kernels/attention.cu DEC_MIN_BLOCKS, the register budget it is compiled for): a grid of
/// more blocks a multiprocessor than this runs in two waves. Where the group is at most 2
/// this caps [`DEC_BLOCKS_PER_SM`] at every depth: two blocks of eight warps, as many warps as
/// the four of four that the measurements above took (eight-warp blocks, BENCHMARKS.md's
/// thirty-fourth session: 3-6% faster at depths 0 to 16384 on the Qwen3-0.6B shape).
pub(crate) fn dec_min_blocks(group: usize) -> usize {
    match group.next_power_of_two() {
        1 | 2 => 2,
        4 => 3,
        _ => 2,
    }
}

/// RoPE tables kept at once ([`CudaBackend::rope_table`]).
const MAX_ROPE_TABLES: usize = 16;

/// kernels/attention.cu's attn_split_<EPL>, by EPL - 1.
const ATTN_SPLIT: [&str; 8] = [
    "attn_split_1",
    "attn_split_2",
    "attn_split_3",
    "attn_split_4",
    "attn_split_5",
    "attn_split_6",
    "attn_split_7",
    "attn_split_8",
];

/// One row of a decode kernel table: the names `<prefix><LPR>_<G>` for G = 1, 2, 4, 8.
macro_rules! dec_row {
    ($p:literal, $l:literal) => {
        [
            concat!($p, $l, "_1"),
            concat!($p, $l, "_2"),
            concat!($p, $l, "_4"),
            concat!($p, $l, "_8"),
        ]
    };
}

/// A decode kernel table by LPR (4, 8, 16, 32), then G.
macro_rules! dec_table {
    ($p:literal) => {
        [
            dec_row!($p, "4"),
            dec_row!($p, "8"),
            dec_row!($p, "16"),
            dec_row!($p, "32"),
        ]
    };
}

/// kernels/attention.cu's attn_dec_<LPR>_<G> (f16 caches) and attn_dec_q8_<LPR>_<G> (q8_0),
/// by [`dec_kernel`]'s indices.
const ATTN_DEC: [[[&str; 4]; 4]; 2] = [dec_table!("attn_dec_"), dec_table!("attn_dec_q8_")];

/// kernels/attention.cu's attn_dec_seqs_<LPR>_<G> and attn_dec_seqs_q8_<LPR>_<G>, as
/// [`ATTN_DEC`].
const ATTN_DEC_SEQS: [[[&str; 4]; 4]; 2] = [
    dec_table!("attn_dec_seqs_"),
    dec_table!("attn_dec_seqs_q8_"),
];

/// Warps of a tensor-core decode attention block, stages a warp and keys a stage
/// (kernels/decode_mma.cu DECM_WARPS, DECM_ST, DECM_KEYS).
const DECM_WARPS: usize = 8;
const DECM_ST: usize = 3;
const DECM_KEYS: usize = 16;
/// Blocks a multiprocessor the tensor-core decode kernels are sized for (`__launch_bounds__`;
/// their shared memory).
const DECM_BLOCKS: usize = 1;
/// Static shared memory of a tensor-core decode block at most (ptxas: 9584 bytes at head
/// size 128 and G = 8), with room.
const DECM_STATIC: usize = 10 << 10;

/// Dynamic shared memory of a tensor-core decode block for heads of `hd` (DECM_SMEM): each
/// warp's stages of keys and values, f16.
pub(crate) fn decm_smem(hd: usize) -> u32 {
    (DECM_WARPS * DECM_ST * 2 * DECM_KEYS * hd * 2) as u32
}

/// kernels/decode_mma.cu's attn_decm_<HD>_<G> and attn_decm_seqs_<HD>_<G>: one token and
/// one token of each of several sequences, by head size (64, 128), then G.
const ATTN_DECM: [[[&str; 4]; 2]; 2] = [
    [dec_row!("attn_decm_", "64"), dec_row!("attn_decm_", "128")],
    [
        dec_row!("attn_decm_seqs_", "64"),
        dec_row!("attn_decm_seqs_", "128"),
    ],
];

/// The dynamic shared memory of `name` where it is a tensor-core decode kernel.
pub(crate) fn decm_smem_of(name: &str) -> Option<u32> {
    let i = ATTN_DECM
        .iter()
        .flatten()
        .position(|row| row.contains(&name))?;
    Some(decm_smem(64 << (i % 2)))
}

/// Every name of [`ATTN_DEC`], [`ATTN_DEC_SEQS`] and [`ATTN_DECM`] (device.rs kernel_names).
pub(crate) fn dec_kernel_names() -> impl Iterator<Item = &'static str> {
    ATTN_DEC
        .iter()
        .chain(&ATTN_DEC_SEQS)
        .flatten()
        .flatten()
        .chain(ATTN_DECM.iter().flatten().flatten())
        .copied()
}

/// A decode attention launch: its kernel, threads a block, dynamic shared memory, and the
/// blocks a multiprocessor its splits are sized for.
struct DecKernel {
    name: &'static str,
    threads: u32,
    smem: u32,
    per_sm: usize,
}

/// The decode kernel of a shape over a cache (`q8`: q8_0, else f16) in `table`: LPR, the
/// lanes a key row takes (eight values each), is the head size / 8 rounded up to a power of
/// two from 4; G, the query heads a KV head, rounded up to a power of two.
fn dec_kernel(table: &[[[&'static str; 4]; 4]; 2], s: AttnShape, q8: bool) -> &'static str {
    let lpr = (s.head_dim / 8).next_power_of_two().max(4);
    let g = (s.n_heads / s.n_kv_heads).next_power_of_two();
    table[q8 as usize][lpr.trailing_zeros() as usize - 2][g.trailing_zeros() as usize]
}

/// kernels/*.cu SeqDesc: one sequence of a batched decode step.
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq)]
pub(crate) struct SeqDesc {
    /// The cache's block table.
    pub(crate) tbl: u64,
    pub(crate) len: i32,
    pub(crate) splits: i32,
    /// Sliding window (0: none).
    pub(crate) window: i32,
    pub(crate) pad: i32,
}

/// From this many tokens a prompt's attention runs as two cuBLAS products per chunk of
/// queries (attention_gemm), below as the split kernel.
pub(crate) const PROMPT_GEMM_MIN_TOKENS: usize = 16;

/// Bytes of f32 scores and f16 probabilities one query chunk of attention_gemm takes at most
/// (a long prompt over a long cache runs as several chunks).
pub(crate) const PROMPT_ATTN_BYTES: usize = 256 << 20;

/// Warps of a flash prompt-attention block, and the query rows it takes
/// (kernels/flash.cu FA_WARPS, FA_ROWS).
const FA_WARPS: usize = 4;
const FA_ROWS: usize = 16 * FA_WARPS;

/// Query heads per KV head the attention kernel holds (kernels/*.cu MAX_GROUP).
pub(crate) const MAX_GROUP: usize = 8;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct HeadGroup {
    pub(crate) x: u64,
    pub(crate) norm_w: u64,
    /// The cache's block table (0: no store), and the layer's K or V planes in a block.
    pub(crate) tbl: u64,
    pub(crate) off: i64,
    pub(crate) heads: i32,
    pub(crate) rope: i32,
    /// 1: the cache is q8_0 (kernels/common.cu kvq_row).
    pub(crate) q8: i32,
    pub(crate) pad: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct HeadGroups {
    pub(crate) g: [HeadGroup; 3],
    pub(crate) n: i32,
    pub(crate) row0: [i32; 4],
}

/// kernels/*.cu DecHeads: the decode attention's own q/k norm, RoPE and cache store.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct DecHeads {
    pub(crate) k: u64,
    pub(crate) v: u64,
    pub(crate) q_norm: u64,
    pub(crate) k_norm: u64,
    pub(crate) eps: f32,
    pub(crate) inv_freq: u64,
    pub(crate) rope_dims: i32,
    pub(crate) neox: i32,
    pub(crate) one_split: i32,
    /// Where the attention's rows go when the grid has one split (and their quantized copy),
    /// else 0: the partials go to attn_combine.
    pub(crate) out: u64,
    pub(crate) xq: u64,
}

/// Whether the attention kernels run this shape (kernels/*.cu: at most MAX_GROUP query heads a
/// KV head; head sizes a multiple of 8, at most 256).
pub fn attention_supported(heads: usize, kv_heads: usize, head_dim: usize) -> Result<(), String> {
    if kv_heads == 0 || heads % kv_heads != 0 || heads / kv_heads > MAX_GROUP {
        return Err(format!(
            "{heads} query heads over {kv_heads} KV heads (at most {MAX_GROUP} a KV head)"
        ));
    }
    if head_dim == 0 || head_dim % 8 != 0 || head_dim > 256 {
        return Err(format!(
            "head size {head_dim} (a multiple of 8, at most 256)"
        ));
    }
    Ok(())
}

impl CudaBackend {
    /// [`LlmOps::qk_norm_rope_attention`] of one sequence: one decode token has its heads'
    /// work fused into the attention kernel (kernels/*.cu attn_dec_<LPR>_<G>).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn qk_norm_rope_attention_one(
        &self,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        v: &CudaTensor,
        qk_norm: Option<(&CudaTensor, &CudaTensor, f32)>,
        rope: &RopeConfig,
        cache: &mut CudaKvCache,
        layer: usize,
        s: AttnShape,
        out: &mut CudaTensor,
    ) {
        let fused = s.n_tokens == 1
            && s.n_heads % s.n_kv_heads == 0
            && s.n_heads / s.n_kv_heads <= MAX_GROUP
            && cache.head_dim % 8 == 0
            && cache.head_dim <= 256;
        if !fused {
            self.qk_norm_rope_store(
                q,
                k,
                v,
                qk_norm,
                rope,
                s.n_heads,
                s.n_kv_heads,
                cache,
                layer,
                s.pos0,
                s.n_tokens,
            );
            return self.attention(q, cache, layer, s, out);
        }
        // One token: the attention kernel normalises and rotates q and the new key itself
        // and stores the new key and value (kernels/*.cu attn_dec_<LPR>_<G>).
        self.kv_ready(cache, s.pos0, 1);
        let dh = self.dec_heads(k, v, qk_norm, rope);
        let quant = s.head_dim % 32 == 0 && out.cols == s.n_heads * s.head_dim;
        self.attention_at(q.buf.ptr, cache, layer, s, out.buf.ptr, quant, Some(dh));
    }

    /// The attention side of one token of each of `seqs` (rows stacked in order), each over
    /// its own cache, in one launch (kernels/*.cu attn_dec_seqs_<LPR>_<G>) and one combine
    /// (none where every sequence sees at most `Tune::one_split` keys), which also writes the
    /// rows quantized for the output projection where `quant` (as the one-sequence path's:
    /// no quant_act before that product).
    pub(crate) fn attention_seqs(
        &self,
        q_ptr: u64,
        seqs: &[SeqKv<'_, CudaKvCache>],
        layer: usize,
        out_ptr: u64,
        quant: bool,
        mut dh: DecHeads,
    ) {
        self.xq_src.set(None);
        let s = seqs[0].shape;
        let n = seqs.len();
        let q8 = seqs[0].cache.q8;
        assert!(
            seqs.iter().all(|x| x.cache.q8 == q8),
            "one decode step over caches of two types"
        );
        let k = self.dec_kernel_for(s, q8, true);
        // The sequences' table, sent when it changed (once a step: every layer reads it).
        // Each sequence is split as it is alone (so its sums are the same whatever else the
        // step holds); the grid has the most splits any of them has.
        let (table, splits) = {
            let mut sc = self.scratch.borrow_mut();
            let before = sc.seq_table.as_ref().map(|b| b.ptr);
            let buf = ensure(&mut sc.seq_table, n * std::mem::size_of::<SeqDesc>());
            let host = &mut sc.seq_table_host;
            let mut changed = before != Some(buf) || host.len() != n;
            host.resize(n, SeqDesc::default());
            for (d, x) in host.iter_mut().zip(seqs) {
                let new = SeqDesc {
                    tbl: x.cache.table(),
                    len: (x.shape.pos0 + 1) as i32,
                    splits: self.dec_splits(x.cache.n_ctx, x.shape.window, s.n_kv_heads, k.per_sm)
                        as i32,
                    window: x.shape.window as i32,
                    pad: 0,
                };
                changed |= *d != new;
                *d = new;
            }
            if changed {
                self.dev.htod(buf, host);
            }
            let splits = host.iter().map(|d| d.splits as usize).max().unwrap_or(1);
            (buf, splits)
        };
        let slots = n * s.n_heads * splits;
        let (acc, ml) = {
            let mut sc = self.scratch.borrow_mut();
            (
                ensure(&mut sc.attn_acc, slots * s.head_dim * 4),
                ensure(&mut sc.attn_ml, slots * 2 * 4),
            )
        };
        let xq = match quant {
            true => self.xq_scratch(pack::xq_bytes(
                s.n_heads * s.head_dim,
                DEC_MAX_TOK.max(MAX_TOK),
            )),
            false => 0u64,
        };
        // Every sequence short enough for one split (as each takes alone: its block writes
        // the rows itself, bit for bit the combine's): one split a sequence, no combine.
        let direct = seqs.iter().all(|x| self.one_split_step(x.shape.pos0, 1));
        if direct {
            dh.out = out_ptr;
            dh.xq = xq;
        }
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        let mut a = Args::default()
            .a(q_ptr)
            .a(table)
            .a(layer as i32)
            .a(s.n_heads as i32)
            .a(s.n_kv_heads as i32)
            .a(s.head_dim as i32)
            .a(scale)
            .a(acc)
            .a(ml)
            .a(dh);
        let grid_splits = if direct { 1 } else { splits };
        self.dev.launch(
            self.dev.func(k.name),
            (s.n_kv_heads as u32, grid_splits as u32, n as u32),
            (k.threads, 1, 1),
            k.smem,
            &mut a.ptrs(),
        );
        if !direct {
            self.attn_combine(acc, ml, splits, s.head_dim, out_ptr, xq, n, s.n_heads, true);
        }
        if xq != 0 {
            self.xq_src.set(Some(XqSrc {
                x: out_ptr,
                n,
                norm: 0,
                ss: 0,
                xq,
                inv: true,
            }));
        }
    }

    /// What the decode attention kernels do first for their tokens (rows of k and v, the
    /// q/k norms, RoPE).
    pub(crate) fn dec_heads(
        &self,
        k: &CudaTensor,
        v: &CudaTensor,
        qk_norm: Option<(&CudaTensor, &CudaTensor, f32)>,
        rope: &RopeConfig,
    ) -> DecHeads {
        let (qn, kn, eps) = qk_norm.map_or((0, 0, 0.0), |(a, b, e)| (a.buf.ptr, b.buf.ptr, e));
        DecHeads {
            k: k.buf.ptr,
            v: v.buf.ptr,
            q_norm: qn,
            k_norm: kn,
            eps,
            inv_freq: self.rope_table(rope),
            rope_dims: rope.dims as i32,
            neox: (rope.style == RopeStyle::Neox) as i32,
            one_split: self.tune.one_split as i32,
            out: 0,
            xq: 0,
        }
    }

    /// Whether one decode token's attention over an f16 cache of this shape runs on the
    /// tensor cores (kernels/decode_mma.cu): sm_80 and later, heads of 64 or 128, groups of
    /// more than two query heads a KV head, where a multiprocessor holds two of its blocks.
    /// (H100, tg128 against the CUDA-core kernels: Qwen3-4B's and Llama-3.2-3B's groups of 4
    /// 1-5% faster at depths 0 to 16384; Qwen3-0.6B's of 2 3% slower at depths 0 and 4096.)
    fn decm(&self, s: AttnShape, q8: bool) -> bool {
        self.tune.dec_mma
            && (s.n_heads / s.n_kv_heads).next_power_of_two() >= 4
            && !q8
            && self.dev.major >= 8
            && matches!(s.head_dim, 64 | 128)
            && DECM_BLOCKS * (decm_smem(s.head_dim) as usize + DECM_STATIC) <= self.dev.smem_per_sm
    }

    /// The decode attention kernel for one token (`seqs`: of each of several sequences) of
    /// this shape over a cache (`q8`: q8_0, else f16).
    fn dec_kernel_for(&self, s: AttnShape, q8: bool, seqs: bool) -> DecKernel {
        let group = s.n_heads / s.n_kv_heads;
        if self.decm(s, q8) {
            let g = group.next_power_of_two().trailing_zeros() as usize;
            return DecKernel {
                name: ATTN_DECM[seqs as usize][(s.head_dim == 128) as usize][g],
                threads: (32 * DECM_WARPS) as u32,
                smem: decm_smem(s.head_dim),
                per_sm: DECM_BLOCKS,
            };
        }
        let table = if seqs { &ATTN_DEC_SEQS } else { &ATTN_DEC };
        DecKernel {
            name: dec_kernel(table, s, q8),
            threads: (32 * dec_warps(group)) as u32,
            smem: 0,
            per_sm: dec_min_blocks(group),
        }
    }

    /// Splits of one decode token's attention over a cache of `n_ctx` positions (the last
    /// `window` of them where the layer has a sliding window, 0: none): a grid fixed by the
    /// cache's size and the layer (one recording serves every position), each split its
    /// share of the keys the step sees, [`DEC_BLOCKS_PER_SM`] blocks a multiprocessor (one
    /// more from [`DEC_LONG_KEYS`] keys), at most as many as one wave holds (`held`: the
    /// kernel's blocks a multiprocessor, [`DecKernel::per_sm`]). The shape alone decides, so a
    /// sequence splits the same alone and in a batch.
    pub(crate) fn dec_splits(
        &self,
        n_ctx: usize,
        window: usize,
        kv_heads: usize,
        held: usize,
    ) -> usize {
        let keys = match window {
            0 => n_ctx,
            w => n_ctx.min(w),
        };
        // A long cache takes one more block a multiprocessor (the most one wave holds): 5%
        // faster at 16384 keys, 10% at 32768; at 4096 it would be 5% slower.
        let long = keys >= DEC_LONG_KEYS;
        let per_sm = self
            .tune
            .dec_blocks_per_sm
            .unwrap_or((DEC_BLOCKS_PER_SM + long as usize).min(held));
        keys.div_ceil(DEC_SPLIT_KEYS)
            .min((per_sm * self.dev.num_sms / kv_heads).max(1))
    }

    /// Whether a lone sequence's decode step of `n_tokens` from `pos0` takes its keys in one
    /// split that writes the rows itself (one token that sees at most `Tune::one_split`
    /// keys). `TensorOps::step` keys its recordings by it, so a graph recorded one way is
    /// never replayed the other.
    pub(crate) fn one_split_step(&self, pos0: usize, n_tokens: usize) -> bool {
        n_tokens == 1 && pos0 < self.tune.one_split
    }

    /// The attn_combine kernel and its block's threads for `n_ws` splits of heads of
    /// `head_dim`: a decode step's in [`COMBINE_GROUPS`] groups of head_dim threads rounded
    /// up to a warp (fewer where 1024 threads would not hold them; KILN_CUDA_COMBINE_GROUPS
    /// sets the count) where it has more splits than groups, any other in one. Where a
    /// sequence has at most as many splits as there are groups, each group holds at most one
    /// of them and the groups' sums are added in split order: the same sums as one group's,
    /// so a sequence combined in one group alone gives the same values in a step with
    /// longer caches.
    fn combine_kernel(&self, n_ws: usize, head_dim: usize, decode: bool) -> (&'static str, u32) {
        let hdr = head_dim.next_multiple_of(32);
        let fit = |g: usize| {
            (1..=g)
                .rev()
                .find(|g| g.is_power_of_two() && g * hdr <= 1024)
                .unwrap_or(1)
        };
        let groups = match (decode, self.tune.combine_groups) {
            (true, Some(g)) => fit(g),
            (true, None) if n_ws > fit(COMBINE_GROUPS) => fit(COMBINE_GROUPS),
            _ => 1,
        };
        let name = [
            "attn_combine_1",
            "attn_combine_2",
            "attn_combine_4",
            "attn_combine_8",
        ][groups.trailing_zeros() as usize];
        (name, (groups * hdr) as u32)
    }

    /// kernels/*.cu attn_combine_<P>: the splits' partial softmax sums of `ntok * heads` rows
    /// into out (and, with xq, quantized for the next product); `decode`: a decode step's.
    #[allow(clippy::too_many_arguments)]
    fn attn_combine(
        &self,
        acc: u64,
        ml: u64,
        n_ws: usize,
        head_dim: usize,
        out_ptr: u64,
        xq: u64,
        ntok: usize,
        heads: usize,
        decode: bool,
    ) {
        let (name, threads) = self.combine_kernel(n_ws, head_dim, decode);
        let mut a = Args::default()
            .a(acc)
            .a(ml)
            .a(n_ws as i32)
            .a(head_dim as i32)
            .a(out_ptr)
            .a(xq)
            .a(ntok as i32)
            .a(heads as i32);
        self.dev.launch(
            self.dev.func(name),
            ((ntok * heads) as u32, 1, 1),
            (threads, 1, 1),
            0,
            &mut a.ptrs(),
        );
    }

    /// The device table of `rope`'s inverse frequencies. Tables stay once made: a model whose
    /// layers use two (Gemma 3's local and global RoPE) would otherwise replace one with the
    /// other at every layer, moving a buffer each step, so no step could be replayed.
    pub(crate) fn rope_table(&self, rope: &RopeConfig) -> u64 {
        let mut tables = self.rope.borrow_mut();
        if let Some((_, buf)) = tables.iter().find(|(c, _)| c == rope) {
            return buf.ptr;
        }
        assert!(
            !self.recording.get(),
            "RoPE table made inside a recorded step"
        );
        if tables.len() >= MAX_ROPE_TABLES {
            // Only a process that loads many models gets here: the old tables go, and with
            // them every recording that holds their addresses.
            tables.clear();
            scratch_moved();
        }
        let f = rope.inv_freqs();
        let buf = DevBuf::alloc(4 * f.len());
        self.dev.htod(buf.ptr, &f);
        tables.push((rope.clone(), buf));
        tables.last().unwrap().1.ptr
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn heads_launch(
        &self,
        groups: &[HeadGroup],
        head_dim: usize,
        eps: f32,
        rope: Option<&RopeConfig>,
        pos0: usize,
        n: usize,
    ) {
        assert!(head_dim <= 256, "head size {head_dim} > 256");
        self.set_params(pos0, None);
        let mut hg = HeadGroups {
            n: groups.len() as i32,
            ..Default::default()
        };
        let mut r = 0;
        for (i, g) in groups.iter().enumerate() {
            hg.g[i] = *g;
            hg.row0[i] = r;
            r += g.heads;
        }
        hg.row0[groups.len()] = r;
        let (table, dims, neox) = match rope {
            Some(c) => (
                self.rope_table(c),
                c.dims as i32,
                (c.style == RopeStyle::Neox) as i32,
            ),
            None => (0u64, 0, 0),
        };
        let mut a = Args::default()
            .a(hg)
            .a(head_dim as i32)
            .a(eps)
            .a(table)
            .a(dims)
            .a(neox)
            .a(self.params.ptr);
        self.dev.launch(
            self.dev.func("heads"),
            ((r as usize).div_ceil(WARPS) as u32, n as u32, 1),
            (32 * WARPS as u32, 1, 1),
            0,
            &mut a.ptrs(),
        );
    }

    /// Attention of the rows at `q_ptr` over `cache` (positions from the step parameters),
    /// into the rows at `out_ptr`.
    pub(crate) fn attention_at(
        &self,
        q_ptr: u64,
        cache: &CudaKvCache,
        layer: usize,
        s: AttnShape,
        out_ptr: u64,
        quant: bool,
        dec: Option<DecHeads>,
    ) {
        self.xq_src.set(None);
        let prompt = dec.is_none()
            && !quant
            && s.n_tokens >= PROMPT_GEMM_MIN_TOKENS
            && !self.recording.get();
        // KILN_CUDA_FLASH_PROMPT (dev-switches) 0: never in one pass, 1: the first form.
        let flash = self.tune.flash_prompt.is_none_or(|f| f >= 1);
        // (The one pass runs on the tensor cores of sm_80 and later: kernels/flash.cu.)
        if prompt && flash && matches!(s.head_dim, 64 | 128) && self.dev.major >= 8 {
            let v2 = self.tune.flash_prompt.is_none_or(|f| f == 2);
            return self.attention_flash(q_ptr, cache, layer, s, out_ptr, v2);
        }
        if prompt && self.tune.prompt_gemm && self.blas.is_some() {
            return self.attention_gemm(q_ptr, cache, layer, s, out_ptr);
        }
        let g = s.n_heads / s.n_kv_heads;
        assert!(
            g <= MAX_GROUP && s.n_heads % s.n_kv_heads == 0,
            "{} query heads per KV head: at most {MAX_GROUP}",
            g
        );
        assert!(
            s.head_dim % 8 == 0 && s.head_dim <= 256,
            "CUDA attention: head size {} (a multiple of 8, at most 256)",
            s.head_dim
        );
        // kernels/*.cu's attn_split_<EPL> (EPL = head_dim / 32 rounded up), or the decode
        // kernel (attn_dec_<LPR>_<G> or attn_decm_<HD>_<G>).
        let k = match dec {
            Some(_) => self.dec_kernel_for(s, cache.q8, false),
            None => DecKernel {
                name: ATTN_SPLIT[s.head_dim.div_ceil(32) - 1],
                threads: 32 * ATT_WARPS as u32,
                smem: 0,
                per_sm: 0,
            },
        };
        self.set_params(s.pos0, None);
        // A grid fixed by the cache's size, so one recording serves every position. The
        // split kernel: ATT_WARPS warps of ATT_WCHUNK keys a block over the whole cache. The
        // decode kernel: each split takes its share of the keys the step sees
        // (kernels/*.cu attn_dec_impl).
        let direct = dec.is_some() && self.one_split_step(s.pos0, s.n_tokens);
        let (splits, n_ws) = match dec {
            None => {
                let splits = cache.n_ctx.div_ceil(ATT_WCHUNK * ATT_WARPS);
                (splits, splits * ATT_WARPS)
            }
            // One split that writes the rows itself: no combine.
            Some(_) if direct => (1, 1),
            Some(_) => {
                let splits = self.dec_splits(cache.n_ctx, s.window, s.n_kv_heads, k.per_sm);
                (splits, splits)
            }
        };
        let slots = s.n_tokens * s.n_heads * n_ws;
        let (acc, ml) = {
            let mut sc = self.scratch.borrow_mut();
            (
                ensure(&mut sc.attn_acc, slots * s.head_dim * 4),
                ensure(&mut sc.attn_ml, slots * 2 * 4),
            )
        };
        let (k_off, v_off) = cache.offsets(layer);
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        let mut a = Args::default()
            .a(q_ptr)
            .a(cache.table())
            .a(k_off)
            .a(v_off)
            .a(s.n_heads as i32)
            .a(s.n_kv_heads as i32)
            .a(s.head_dim as i32)
            .a(scale)
            .a(self.params.ptr)
            .a(acc)
            .a(ml)
            .a(s.window as i32);
        if dec.is_none() {
            a = a.a(cache.q8_arg());
        }
        let xq = match quant {
            true => self.xq_scratch(pack::xq_bytes(s.n_heads * s.head_dim, MAX_TOK)),
            false => 0u64,
        };
        if let Some(mut dh) = dec {
            if direct {
                dh.out = out_ptr;
                dh.xq = xq;
            }
            a = a.a(dh);
        }
        self.dev.launch(
            self.dev.func(k.name),
            (s.n_kv_heads as u32, splits as u32, s.n_tokens as u32),
            (k.threads, 1, 1),
            k.smem,
            &mut a.ptrs(),
        );
        if !direct {
            self.attn_combine(
                acc,
                ml,
                n_ws,
                s.head_dim,
                out_ptr,
                xq,
                s.n_tokens,
                s.n_heads,
                dec.is_some(),
            );
        }
        if xq != 0 {
            self.xq_src.set(Some(XqSrc {
                x: out_ptr,
                n: s.n_tokens,
                norm: 0,
                ss: 0,
                xq,
                inv: true,
            }));
        }
    }
}

impl CudaBackend {
    /// A prompt's attention in one pass over the cache (kernels/flash.cu attn_flash_<HD>):
    /// a block a KV head and FA_ROWS query rows, its keys and values read from the cache's
    /// blocks where they lie. `v2` (attn_flash2_<HD>, the default): values read untransposed,
    /// and the keys split over enough blocks to fill the multiprocessors four times over
    /// (KILN_CUDA_FLASH_SPLITS sets the count), the splits' partials combined by attn_combine.
    fn attention_flash(
        &self,
        q_ptr: u64,
        cache: &CudaKvCache,
        layer: usize,
        s: AttnShape,
        out_ptr: u64,
        v2: bool,
    ) {
        let g = s.n_heads / s.n_kv_heads;
        assert!(
            s.n_heads % s.n_kv_heads == 0 && g <= FA_ROWS / 8,
            "prompt attention: {} heads over {}",
            s.n_heads,
            s.n_kv_heads
        );
        self.set_params(s.pos0, None);
        let (k_off, v_off) = cache.offsets(layer);
        let mut a = Args::default()
            .a(q_ptr)
            .a(cache.table())
            .a(k_off)
            .a(v_off)
            .a(s.n_heads as i32)
            .a(s.n_kv_heads as i32)
            .a(1.0 / (s.head_dim as f32).sqrt())
            .a(self.params.ptr)
            .a(s.n_tokens as i32)
            .a(s.window as i32)
            .a(out_ptr);
        let row_blocks = s.n_tokens.div_ceil(FA_ROWS / g);
        // Splits: enough blocks for four a multiprocessor, each split at least
        // FLASH_SPLIT_KEYS of the keys the last query sees.
        let keys = s.pos0 + s.n_tokens;
        let splits = match (v2, self.tune.flash_splits) {
            (false, _) => 1,
            (true, Some(n)) => n,
            (true, None) => (4 * self.dev.num_sms)
                .div_ceil(row_blocks * s.n_kv_heads)
                .min(keys.div_ceil(FLASH_SPLIT_KEYS))
                .max(1),
        };
        let part = (splits > 1).then(|| {
            let slots = s.n_tokens * s.n_heads * splits;
            let mut sc = self.scratch.borrow_mut();
            (
                ensure(&mut sc.attn_acc, slots * s.head_dim * 4),
                ensure(&mut sc.attn_ml, slots * 2 * 4),
            )
        });
        let name = match (v2, s.head_dim) {
            (false, 64) => "attn_flash_64",
            (false, _) => "attn_flash_128",
            (true, 64) => "attn_flash2_64",
            (true, _) => "attn_flash2_128",
        };
        if v2 {
            let (acc, ml) = part.unwrap_or((0, 0));
            a = a.a(acc).a(ml);
        }
        a = a.a(cache.q8_arg());
        self.dev.launch(
            self.dev.func(name),
            (row_blocks as u32, s.n_kv_heads as u32, splits as u32),
            (32 * FA_WARPS as u32, 1, 1),
            0,
            &mut a.ptrs(),
        );
        if let Some((acc, ml)) = part {
            let (name, threads) = self.combine_kernel(splits, s.head_dim, false);
            let mut c = Args::default()
                .a(acc)
                .a(ml)
                .a(splits as i32)
                .a(s.head_dim as i32)
                .a(out_ptr)
                .a(0u64)
                .a(s.n_tokens as i32)
                .a(s.n_heads as i32);
            self.dev.launch(
                self.dev.func(name),
                ((s.n_tokens * s.n_heads) as u32, 1, 1),
                (threads, 1, 1),
                0,
                &mut c.ptrs(),
            );
        }
    }

    /// A prompt's attention on the tensor cores, per chunk of queries: scores = q k^T for each
    /// KV head's query heads at once (one strided batched product over the KV heads), the
    /// causal softmax into f16 probabilities, then out = p v (one batched product per query
    /// head of a group, written into the output rows in place).
    fn attention_gemm(
        &self,
        q_ptr: u64,
        cache: &CudaKvCache,
        layer: usize,
        s: AttnShape,
        out_ptr: u64,
    ) {
        use cudarc::cublas::sys as cb;
        let h = self.blas.get().unwrap().0;
        // A sliding window: positions from the first token's first on (a window cache holds
        // no others), which the products and the softmax see as positions from 0.
        let g0 = match s.window {
            0 => 0,
            w => (s.pos0 + 1).saturating_sub(w),
        };
        let s = AttnShape {
            pos0: s.pos0 - g0,
            ..s
        };
        let (heads, kvh, hd) = (s.n_heads, s.n_kv_heads, s.head_dim);
        let g = heads / kvh;
        assert!(
            heads % kvh == 0 && hd % 8 == 0,
            "prompt attention: {heads} heads over {kvh}, head size {hd}"
        );
        // Rows of scores and probabilities padded to 8 values (16-byte aligned f16 rows).
        let ld_all = (s.pos0 + s.n_tokens).next_multiple_of(8);
        let chunk = (self.prompt_attn_bytes.get() / (heads * ld_all * 6)).clamp(1, s.n_tokens);
        let (q16, sc, pr) = {
            let mut b = self.scratch.borrow_mut();
            (
                ensure(&mut b.x16, chunk * heads * hd * 2),
                ensure(&mut b.attn_acc, chunk * heads * ld_all * 4),
                ensure(&mut b.attn_ml, chunk * heads * ld_all * 2),
            )
        };
        // The cache's blocks of this layer gathered into contiguous (kv head, position,
        // head_dim) planes for the products.
        let len_all = s.pos0 + s.n_tokens;
        let plane = kvh * len_all * hd * 2;
        let kp = ensure(&mut self.scratch.borrow_mut().kv_gather, 2 * plane);
        let vp = kp + plane as u64;
        let (k_off, v_off) = cache.offsets(layer);
        let mut a = Args::default()
            .a(cache.table())
            .a(k_off)
            .a(v_off)
            .a(kvh as i32)
            .a(hd as i32)
            .a(g0 as i32)
            .a(len_all as i32)
            .a(kp)
            .a(vp)
            .a(cache.q8_arg());
        self.elementwise_n_args("kv_gather", &mut a, 2 * kvh * len_all * hd / 8);
        let kv_stride = (len_all * hd) as i64;
        let scale = 1.0 / (hd as f32).sqrt();
        let (one, zero) = (1f32, 0f32);
        let (f16, f32t) = (
            cb::cudaDataType_t::CUDA_R_16F,
            cb::cudaDataType_t::CUDA_R_32F,
        );
        for t0 in (0..s.n_tokens).step_by(chunk) {
            let nc = (s.n_tokens - t0).min(chunk);
            let len = s.pos0 + t0 + nc;
            let ld = len.next_multiple_of(8);
            let mut a = Args::default()
                .a(q_ptr + (t0 * heads * hd * 4) as u64)
                .a(heads as i32)
                .a(hd as i32)
                .a(nc as i32)
                .a(scale)
                .a(q16);
            self.elementwise_n_args("attn_q16", &mut a, nc * heads * hd);
            // Column-major: scores^T (len x g*nc) of KV head b = K_b (len x hd) q16_b^T.
            unsafe {
                cudarc::cublas::result::gemm_strided_batched_ex(
                    h,
                    cb::cublasOperation_t::CUBLAS_OP_T,
                    cb::cublasOperation_t::CUBLAS_OP_N,
                    len as i32,
                    (g * nc) as i32,
                    hd as i32,
                    &one as *const f32 as *const c_void,
                    kp as *const c_void,
                    f16,
                    hd as i32,
                    kv_stride,
                    q16 as *const c_void,
                    f16,
                    hd as i32,
                    (g * nc * hd) as i64,
                    &zero as *const f32 as *const c_void,
                    sc as *mut c_void,
                    f32t,
                    ld as i32,
                    (g * nc * ld) as i64,
                    kvh as i32,
                    cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .unwrap_or_else(|e| panic!("cuBLAS attention scores failed: {e:?}"));
            let mut a = Args::default()
                .a(sc)
                .a(len as i32)
                .a(ld as i32)
                .a((s.pos0 + t0) as i32)
                .a(nc as i32)
                .a(pr)
                .a(s.window as i32);
            self.dev.launch(
                self.dev.func("attn_softmax_causal"),
                (nc as u32, heads as u32, 1),
                (256, 1, 1),
                0,
                &mut a.ptrs(),
            );
            // Column-major: out^T (hd x nc) of query head b*g + j = V_b (hd x len) p^T, into
            // the output rows (heads * hd apart) at the head's columns.
            for j in 0..g {
                unsafe {
                    cudarc::cublas::result::gemm_strided_batched_ex(
                        h,
                        cb::cublasOperation_t::CUBLAS_OP_N,
                        cb::cublasOperation_t::CUBLAS_OP_N,
                        hd as i32,
                        nc as i32,
                        len as i32,
                        &one as *const f32 as *const c_void,
                        vp as *const c_void,
                        f16,
                        hd as i32,
                        kv_stride,
                        (pr + (j * nc * ld * 2) as u64) as *const c_void,
                        f16,
                        ld as i32,
                        (g * nc * ld) as i64,
                        &zero as *const f32 as *const c_void,
                        (out_ptr + ((t0 * heads + j) * hd * 4) as u64) as *mut c_void,
                        f32t,
                        (heads * hd) as i32,
                        (g * hd) as i64,
                        kvh as i32,
                        cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                }
                .unwrap_or_else(|e| panic!("cuBLAS attention values failed: {e:?}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        attention_supported, dec_min_blocks, ATTN_DEC, ATTN_DECM, ATTN_DEC_SEQS, ATTN_SPLIT,
    };

    /// The launch tables name kernels the module loads, each once.
    #[test]
    fn attention_kernel_tables_name_loaded_kernels() {
        for n in ATTN_SPLIT {
            assert!(crate::device::KERNELS.contains(&n), "{n}");
        }
        let names: Vec<_> = crate::device::kernel_names().collect();
        let unique: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "a kernel named twice");
        assert_eq!(super::dec_kernel_names().count(), 80);
    }

    /// Every decode attention kernel fits the blocks a multiprocessor that its splits are
    /// sized for (kernels/attention.cu DEC_MIN_BLOCKS against dec_min_blocks; the
    /// tensor-core kernels DECM_BLOCKS, where the GPU's shared memory holds them), on this GPU.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn decode_attention_kernels_hold_their_blocks() {
        let b = crate::CudaBackend::new().expect("this test needs a CUDA GPU");
        for table in [&ATTN_DEC, &ATTN_DEC_SEQS] {
            for row in table.iter().flatten() {
                for (gi, name) in row.iter().enumerate() {
                    let f = b.dev.func(name);
                    let threads = (32 * super::dec_warps(1 << gi)) as i32;
                    // SAFETY: `f` is a loaded kernel of the module.
                    let held = unsafe {
                        cudarc::driver::result::occupancy::max_active_block_per_multiprocessor(
                            f, threads, 0,
                        )
                    }
                    .expect("occupancy query");
                    let want = dec_min_blocks(1 << gi);
                    eprintln!("{name}: {held} blocks a multiprocessor (sized for {want})");
                    assert!(held as usize >= want, "{name}: {held} < {want}");
                }
            }
        }
        for (hi, row) in ATTN_DECM.iter().flatten().enumerate() {
            let hd = 64 << (hi % 2);
            for name in row {
                let f = b.dev.func(name);
                let smem = super::decm_smem(hd);
                // SAFETY: as above.
                let held = unsafe {
                    cudarc::driver::result::occupancy::max_active_block_per_multiprocessor(
                        f,
                        (32 * super::DECM_WARPS) as i32,
                        smem as usize,
                    )
                }
                .expect("occupancy query");
                eprintln!(
                    "{name}: {held} blocks a multiprocessor of {smem} bytes of shared memory"
                );
                let fits =
                    super::DECM_BLOCKS * (smem as usize + super::DECM_STATIC) <= b.dev.smem_per_sm;
                assert!(
                    !fits || held as usize >= super::DECM_BLOCKS,
                    "{name}: {held} < {}",
                    super::DECM_BLOCKS
                );
            }
        }
    }

    #[test]
    fn attention_shapes_the_kernels_run() {
        for (h, kv, hd) in [
            (16, 8, 128),
            (32, 8, 128),
            (24, 8, 128),
            (9, 3, 64),
            (8, 8, 80),
        ] {
            assert!(attention_supported(h, kv, hd).is_ok(), "{h}/{kv}/{hd}");
        }
        for (h, kv, hd, says) in [
            (32, 2, 128, "at most 8"),
            (12, 5, 64, "12 query heads over 5"),
            (8, 8, 100, "head size 100"),
            (8, 8, 512, "head size 512"),
        ] {
            let e = attention_supported(h, kv, hd).unwrap_err();
            assert!(e.contains(says), "{h}/{kv}/{hd}: {e}");
        }
    }
}
