//! The paged KV cache: a sequence's keys and values live in blocks of [`KV_BLOCK`] positions
//! (every layer's K and V of those positions, f16), handed to it as it grows from a pool the
//! backend's caches share, and given back when it is dropped. A cache of `n_ctx` positions
//! reserves nothing up front but its block table (a device array of block addresses, which
//! the kernels read: kernels/common.cu `kv_row`), so `--parallel 64 -c 8192` holds the
//! positions its sequences have filled, not 64 full contexts.
//!
//! [`LlmOps::kv_copy`] shares the source's blocks instead of copying them (a beam fork, a
//! prefix another sequence already holds); a block is copied only when a cache that shares it
//! is about to write into it ([`LlmOps::kv_reserve`], copy on write).
//!
//! A sliding-window cache ([`LlmOps::kv_cache_window`]) holds the blocks of the positions a
//! step's window reads and a step's worth before them (so a sequence may go back one step):
//! each reservation gives back the blocks outside them, whose table entries go to 0. The
//! kernels read no position before a token's window.

use std::sync::{Arc, Mutex};

use super::*;

/// Positions a block holds (kernels/common.cu KV_BLOCK).
pub(crate) const KV_BLOCK: usize = 64;

/// Blocks by address: their memory and how many caches hold each; free blocks by size.
/// What a handed-out block holds: zeros; in a `dev-switches` build `KILN_CUDA_KV_POISON=1`
/// fills it with f16 65504 instead (`nan`: f16 NaN), so that any kernel whose result depends
/// on cache bytes past a sequence's length shows it in the tests.
fn fill() -> u32 {
    static FILL: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *FILL.get_or_init(
        || match kiln_backend::options::dev_value("KILN_CUDA_KV_POISON").as_deref() {
            None | Some("") | Some("0") => 0,
            Some("nan") => 0x7e00_7e00,
            Some(_) => 0x7bff_7bff,
        },
    )
}

#[derive(Default)]
pub(crate) struct BlockPool {
    held: HashMap<u64, (DevBuf, u32)>,
    free: HashMap<usize, Vec<DevBuf>>,
    /// Blocks shared so far: a cache whose last reservation saw another count may have had
    /// its blocks shared since.
    shares: u64,
    /// At most this many blocks are allocated ([`CudaBackend::set_kv_block_limit`]).
    pub(crate) limit: Option<usize>,
}

impl BlockPool {
    /// A block of `bytes` for one holder: a free one, else new device memory (zeroed).
    fn take(&mut self, dev: &Device, bytes: usize) -> Result<u64, BackendError> {
        let buf = match self.free.get_mut(&bytes).and_then(Vec::pop) {
            // Zeroed as a new block is: a cache starts from the same bytes either way.
            Some(b) => {
                dev.memset_u32(b.ptr, fill(), bytes / 4);
                b
            }
            None => {
                let allocated = self.held.len() + self.free.values().map(Vec::len).sum::<usize>();
                if self.limit.is_some_and(|l| allocated >= l) {
                    return Err(BackendError::KvMemory {
                        what: format!(
                            "all {allocated} blocks of {KV_BLOCK} positions the limit allows are in use"
                        ),
                    });
                }
                let b = DevBuf::try_alloc(bytes).map_err(|e| BackendError::KvMemory {
                    what: format!(
                        "no device memory for another block of {} positions ({} MiB, {} MiB held by caches): {e:?}",
                        KV_BLOCK,
                        bytes >> 20,
                        self.held_bytes() >> 20
                    ),
                })?;
                dev.memset_u32(b.ptr, fill(), bytes / 4);
                b
            }
        };
        let ptr = buf.ptr;
        self.held.insert(ptr, (buf, 1));
        Ok(ptr)
    }

    fn share(&mut self, ptr: u64) {
        self.held.get_mut(&ptr).expect("a held block").1 += 1;
        self.shares += 1;
    }

    fn holders(&self, ptr: u64) -> u32 {
        self.held.get(&ptr).map_or(0, |h| h.1)
    }

    /// One holder lets go; the last one's block goes back to the free list.
    fn release(&mut self, ptr: u64) {
        let Some(h) = self.held.get_mut(&ptr) else {
            return;
        };
        h.1 -= 1;
        if h.1 == 0 {
            let (buf, _) = self.held.remove(&ptr).expect("held");
            self.free.entry(buf.bytes).or_default().push(buf);
        }
    }

    fn held_bytes(&self) -> usize {
        self.held.values().map(|(b, _)| b.bytes).sum()
    }
}

/// Keys and values as f16 in blocks of [`KV_BLOCK`] positions, each laid out (layer, K then
/// V, kv head, position in the block, head_dim); or, `q8`, as GGML's Q8_0 blocks of 32
/// values split into their parts: for each (layer, K then V, kv head) the block's rows of
/// int8 values, then their f16 scales (kernels/common.cu kvq_row), 17/32 of the f16 bytes.
pub struct CudaKvCache {
    /// Block addresses by position / KV_BLOCK (0: none yet); `table` mirrors them.
    blocks: Vec<u64>,
    table: DevBuf,
    pool: Arc<Mutex<BlockPool>>,
    /// The last reservation: positions `writable.0..writable.1` are this cache's alone
    /// (whole blocks) and every block before them is present, while the pool's share count
    /// is still `shares_seen`.
    writable: (usize, usize),
    shares_seen: u64,
    pub(crate) n_layers: usize,
    pub(crate) n_ctx: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) q8: bool,
    /// A sliding-window cache's window and most positions a step (else None).
    pub(crate) window: Option<KvWindow>,
}

impl CudaKvCache {
    pub(crate) fn new(
        dev: &Device,
        pool: Arc<Mutex<BlockPool>>,
        n_layers: usize,
        n_ctx: usize,
        kv_heads: usize,
        head_dim: usize,
        q8: bool,
    ) -> Self {
        assert!(
            !q8 || head_dim % 32 == 0,
            "a q8_0 cache of head size {head_dim}"
        );
        let n = n_ctx.div_ceil(KV_BLOCK).max(1);
        let blocks = vec![0u64; n];
        let table = DevBuf::alloc(8 * n);
        dev.htod(table.ptr, &blocks);
        CudaKvCache {
            blocks,
            table,
            pool,
            writable: (0, 0),
            shares_seen: 0,
            n_layers,
            n_ctx,
            kv_heads,
            head_dim,
            q8,
            window: None,
        }
    }

    /// Bytes of one layer's K (or V) planes in a block.
    fn plane_bytes(&self) -> usize {
        let values = self.kv_heads * KV_BLOCK * self.head_dim;
        match self.q8 {
            true => values + values / 16,
            false => 2 * values,
        }
    }

    /// Bytes of one block.
    pub(crate) fn block_bytes(&self) -> usize {
        self.n_layers * 2 * self.plane_bytes()
    }

    /// The device block table the kernels read.
    pub(crate) fn table(&self) -> u64 {
        self.table.ptr
    }

    /// Offsets of layer `layer`'s K and V planes within a block, in elements of the cache's
    /// type (f16 values, or bytes of a q8_0 cache).
    pub(crate) fn offsets(&self, layer: usize) -> (i64, i64) {
        let plane = match self.q8 {
            true => self.plane_bytes(),
            false => self.plane_bytes() / 2,
        } as i64;
        let k = 2 * layer as i64 * plane;
        (k, k + plane)
    }

    /// The kernels' `q8` argument.
    pub(crate) fn q8_arg(&self) -> i32 {
        self.q8 as i32
    }

    /// Bytes of the blocks this cache holds.
    pub(crate) fn held_bytes(&self) -> usize {
        self.blocks.iter().filter(|&&b| b != 0).count() * self.block_bytes()
    }

    /// Whether positions `pos0..pos0 + n` are writable and every position before them
    /// readable, with no block to take or copy.
    pub(crate) fn ready(&self, pos0: usize, n: usize) -> bool {
        pos0 >= self.writable.0
            && pos0 + n <= self.writable.1
            && self.pool.lock().unwrap().shares == self.shares_seen
    }

    /// The first position held (0 but in a window cache): the start of the first block.
    pub(crate) fn kept_from(&self) -> usize {
        match self.window {
            None => 0,
            Some(_) => self.blocks.iter().position(|&b| b != 0).unwrap_or(0) * KV_BLOCK,
        }
    }

    /// Takes the blocks positions `..pos0 + n` lack (a window cache: from a step's worth
    /// before the step's window on, giving back the blocks outside that), and copies each
    /// block holding positions `pos0..pos0 + n` that another cache shares; the table follows.
    pub(crate) fn reserve(
        &mut self,
        dev: &Device,
        pos0: usize,
        n: usize,
    ) -> Result<(), BackendError> {
        let end = pos0 + n;
        assert!(end <= self.n_ctx, "positions past the cache");
        if self.ready(pos0, n) {
            return Ok(());
        }
        let bytes = self.block_bytes();
        let mut changed = false;
        let mut pool = self.pool.lock().unwrap();
        let mut res = Ok(());
        let first = match self.window {
            None => 0,
            Some(w) => {
                let keep = (pos0 + 1).saturating_sub(w.window + w.chunk) / KV_BLOCK;
                let ahead = end.div_ceil(KV_BLOCK);
                for (i, b) in self.blocks.iter_mut().enumerate() {
                    if *b != 0 && (i < keep || i >= ahead) {
                        pool.release(*b);
                        *b = 0;
                        changed = true;
                    }
                }
                keep
            }
        };
        for i in first..end.div_ceil(KV_BLOCK) {
            let b = self.blocks[i];
            let shared = b != 0 && (i + 1) * KV_BLOCK > pos0 && pool.holders(b) > 1;
            if b != 0 && !shared {
                continue;
            }
            let own = match pool.take(dev, bytes) {
                Ok(own) => own,
                Err(e) => {
                    res = Err(e);
                    break;
                }
            };
            if shared {
                dev.dtod(own, b, bytes);
                pool.release(b);
            }
            self.blocks[i] = own;
            changed = true;
        }
        if res.is_ok() {
            self.writable = (
                pos0 / KV_BLOCK * KV_BLOCK,
                end.div_ceil(KV_BLOCK) * KV_BLOCK,
            );
            self.shares_seen = pool.shares;
        }
        drop(pool);
        // (Blocks taken before a failure are kept, and the table holds them.)
        if changed {
            dev.htod(self.table.ptr, &self.blocks);
        }
        res
    }

    /// This cache's first `n` positions become `src`'s: its blocks shared, not copied.
    pub(crate) fn share_from(&mut self, dev: &Device, src: &CudaKvCache, n: usize) {
        assert!(
            src.n_layers == self.n_layers
                && src.kv_heads == self.kv_heads
                && src.head_dim == self.head_dim
                && src.q8 == self.q8
                && src.window == self.window
                && n <= src.n_ctx
                && n <= self.n_ctx,
            "kv_copy between caches of different shapes"
        );
        assert!(
            Arc::ptr_eq(&src.pool, &self.pool),
            "kv_copy between caches of different backends"
        );
        let mut pool = self.pool.lock().unwrap();
        for i in 0..n.div_ceil(KV_BLOCK) {
            let (old, new) = (self.blocks[i], src.blocks[i]);
            if old == new {
                continue;
            }
            if new != 0 {
                pool.share(new);
            }
            if old != 0 {
                pool.release(old);
            }
            self.blocks[i] = new;
        }
        self.writable = (0, 0);
        drop(pool);
        dev.htod(self.table.ptr, &self.blocks);
    }
}

impl CudaKvCache {
    /// Every block given back; the table empty.
    pub(crate) fn release(&mut self, dev: &Device) {
        let mut pool = self.pool.lock().unwrap();
        for b in self.blocks.iter_mut().filter(|b| **b != 0) {
            pool.release(*b);
            *b = 0;
        }
        self.writable = (0, 0);
        drop(pool);
        dev.htod(self.table.ptr, &self.blocks);
    }
}

impl Drop for CudaKvCache {
    fn drop(&mut self) {
        let Ok(mut pool) = self.pool.lock() else {
            return;
        };
        for &b in self.blocks.iter().filter(|&&b| b != 0) {
            pool.release(b);
        }
    }
}
