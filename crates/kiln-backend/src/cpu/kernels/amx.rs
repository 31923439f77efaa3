//! Intel AMX tile products in bf16 for prefill-sized matrix products (encoders, convolution
//! stems, attention over many positions): C (m, n) f32 = A (m, k) bf16 · B (k, n) bf16, f32
//! accumulation. One `tdpbf16ps` multiplies a 16 x 32 tile of A by a 32 x 16 tile of B
//! (16384 flops), 50x an AVX-512 FMA.
//!
//! Layouts: A is row-major bf16 with rows padded to a multiple of [`MB`] and `k` padded to a
//! multiple of [`TK`] (zeros); B is packed ([`PackedB`]) in 16-column blocks, each a column
//! of 1 KiB tiles along k, a tile row holding 16 (even k, odd k) pairs, as `tdpbf16ps` reads
//! them. Each call of [`gemm`] produces 32 x 32 blocks of C and hands them to the caller's
//! epilogue (bias, residual add, softmax: whatever the op needs), so C never goes to memory
//! in between.
//!
//! Detection: CPUID (AMX-TILE, AMX-BF16), the OS's XSAVE state (XCR0 bits 17-18) and, on
//! Linux, permission for the tile data (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, asked once).
//! `KILN_NO_AMX=1` (or `KILN_NO_SIMD=1`) turns it off.
//!
//! Without tiles, a CPU with AVX-512 BF16 (AMD Zen 4 and later, Intel Cooper Lake and later)
//! runs the same block products with `vdpbf16ps` ([`gemm`] and [`gemm_cols`] choose; the
//! layouts are the same: a B tile row is one 16-lane vector of (even k, odd k) pairs), so
//! every caller of [`bf16_products`] keeps its packed weights and epilogues. Without either
//! (`KILN_NO_AVX512=1`, AVX2 machines) the callers keep their f32 paths. On aarch64 CPUs with
//! bf16 (Apple M2 and later, Neoverse V1/N2 and later) NEON's `bfdot` runs them on the same
//! layouts: a B tile row is four vectors of (even k, odd k) pairs, each row's pair taken by
//! element from a load of four pairs (`KILN_NO_BF16=1` turns it off).

#[cfg(target_arch = "x86_64")]
use std::arch::asm;
use std::sync::OnceLock;

/// Rows of A (and C) per block: two tiles.
pub const MB: usize = 32;
/// Columns of B (and C) per block: two tiles.
pub const NB: usize = 32;
/// k values per tile row (64 bytes of bf16).
pub const TK: usize = 32;
/// Columns of one B tile.
const TN: usize = 16;
/// bf16 values per B tile (16 rows x 64 bytes).
const TILE: usize = 16 * TK;

/// Whether AMX bf16 tiles may run in this process (detected and enabled once).
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let off = crate::options::get().no_amx;
        !off && !super::simd_disabled() && detect()
    })
}

/// Whether the bf16 block products ([`gemm`], [`gemm_cols`]) run in this process: on AMX
/// tiles, else on AVX-512 BF16 vectors, or NEON bf16 on aarch64.
pub fn bf16_products() -> bool {
    available() || dp_available() || neon_bf16_available()
}

/// The kernel set behind [`bf16_products`]: "amx", "avx512-bf16" or "neon-bf16".
pub fn bf16_products_name() -> Option<&'static str> {
    match (available(), dp_available(), neon_bf16_available()) {
        (true, _, _) => Some("amx"),
        (false, true, _) => Some("avx512-bf16"),
        (false, false, true) => Some("neon-bf16"),
        _ => None,
    }
}

/// NEON bf16 `bfdot` on aarch64 (unless `KILN_NO_SIMD` or `KILN_NO_BF16`): the block
/// products' kernel there.
pub fn neon_bf16_available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(target_arch = "aarch64")]
        return !super::simd_disabled()
            && !crate::options::get().no_bf16
            && std::arch::is_aarch64_feature_detected!("bf16");
        #[allow(unreachable_code)]
        false
    })
}

/// AVX-512 BF16 `vdpbf16ps` (with AVX-512F), allowed by the AVX-512 switch: the block
/// products' kernel where tiles are absent (tested on machines with tiles too).
pub fn avx512_bf16_available() -> bool {
    dp_available()
}

fn dp_available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        return super::avx512_allowed()
            && !crate::options::get().no_bf16
            && std::is_x86_feature_detected!("avx512bf16");
        #[allow(unreachable_code)]
        false
    })
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    let (l1, l7) = (__cpuid(1), __cpuid_count(7, 0));
    let amx_bf16 = l7.edx & (1 << 22) != 0;
    let amx_tile = l7.edx & (1 << 24) != 0;
    let osxsave = l1.ecx & (1 << 27) != 0;
    if !(amx_bf16 && amx_tile && osxsave) {
        return false;
    }
    let (lo, _hi): (u32, u32);
    // SAFETY: OSXSAVE is set, so xgetbv is enabled.
    unsafe { asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") _hi) };
    if lo & (0b11 << 17) != 0b11 << 17 {
        return false;
    }
    // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): process-wide permission for the
    // 8 KiB tile data state (Linux 5.16+); without it the first tile load faults.
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: a plain system call; it only changes this process's permitted XSAVE features.
    unsafe {
        asm!("syscall", inlateout("rax") SYS_ARCH_PRCTL => ret,
             in("rdi") ARCH_REQ_XCOMP_PERM, in("rsi") XFEATURE_XTILEDATA,
             lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect() -> bool {
    false
}

/// f32 -> bf16, rounding to nearest even (finite inputs).
#[inline(always)]
pub fn bf16(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

pub fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}

/// Rows `x[i * ldx ..][..k]` for i < m as bf16 into `out` (`round_up(m, MB)` rows of `kp`),
/// zero-padded in both directions.
pub fn to_bf16_rows(x: &[f32], ldx: usize, m: usize, k: usize, kp: usize, out: &mut Vec<u16>) {
    let mp = round_up(m.max(1), MB);
    out.resize(mp * kp, 0);
    for i in 0..mp {
        let dst = &mut out[i * kp..(i + 1) * kp];
        if i < m {
            for (d, &v) in dst[..k].iter_mut().zip(&x[i * ldx..i * ldx + k]) {
                *d = bf16(v);
            }
            dst[k..].fill(0);
        } else {
            dst.fill(0);
        }
    }
}

/// B (k, n) in tile order: `n` padded to a multiple of [`NB`], `k` to a multiple of [`TK`].
#[derive(Debug, Clone, Default)]
pub struct PackedB {
    pub data: Vec<u16>,
    pub k: usize,
    pub n: usize,
    pub kp: usize,
    pub np: usize,
}

impl PackedB {
    /// Packs B[kk][j] = get(j, kk) (j < n, kk < k), reusing this allocation.
    #[inline(always)]
    pub fn pack(&mut self, k: usize, n: usize, get: impl Fn(usize, usize) -> f32) {
        let (kp, np) = (round_up(k.max(1), TK), round_up(n.max(1), NB));
        let nkb = kp / TK;
        self.data.resize(np * kp, 0);
        (self.k, self.n, self.kp, self.np) = (k, n, kp, np);
        for nb in 0..np / TN {
            for kb in 0..nkb {
                let tile = &mut self.data[(nb * nkb + kb) * TILE..][..TILE];
                for k2 in 0..TK / 2 {
                    for j in 0..TN {
                        let col = nb * TN + j;
                        for e in 0..2 {
                            let kk = kb * TK + 2 * k2 + e;
                            tile[k2 * 2 * TN + 2 * j + e] = if col < n && kk < k {
                                bf16(get(col, kk))
                            } else {
                                0
                            };
                        }
                    }
                }
            }
        }
    }

    /// Packs B from its rows: `row(r)` holds B[r][..n] (r < k), reusing this allocation.
    pub fn pack_k_rows<'x>(&mut self, k: usize, n: usize, row: impl Fn(usize) -> &'x [f32]) {
        let (kp, np) = (round_up(k.max(1), TK), round_up(n.max(1), NB));
        let nkb = kp / TK;
        self.data.clear();
        self.data.resize(np * kp, 0);
        (self.k, self.n, self.kp, self.np) = (k, n, kp, np);
        for r in 0..k {
            let src = &row(r)[..n];
            let (kb, k2, e) = (r / TK, (r % TK) / 2, r % 2);
            for (nb, chunk) in src.chunks(TN).enumerate() {
                let base = ((nb * nkb + kb) * 16 + k2) * 2 * TN + e;
                let dst = &mut self.data[base..base + 2 * TN - e];
                for (jj, &v) in chunk.iter().enumerate() {
                    dst[2 * jj] = bf16(v);
                }
            }
        }
    }

    /// A weight W (n rows of k) as B = Wᵀ, its rows given by `row(j, buf)`.
    pub fn from_rows(n: usize, k: usize, mut row: impl FnMut(usize, &mut [f32])) -> Self {
        let mut w = vec![0f32; n * k];
        for (j, r) in w.chunks_exact_mut(k.max(1)).enumerate() {
            row(j, r);
        }
        let mut p = PackedB::default();
        p.pack(k, n, |j, kk| w[j * k + kk]);
        p
    }

    pub fn bytes(&self) -> usize {
        self.data.len() * 2
    }
}

/// One thread's tile configuration: 8 tiles of 16 rows x 64 bytes (C: 0-3, A: 4-5, B: 6-7).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1; // palette 1
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64; // bytes per row
        c[48 + t] = 16; // rows
        t += 1;
    }
    TileConfig(c)
};

/// C (m, b.n) = A · B for A's rows `0..m` (`a` holds `round_up(m, MB)` rows of `b.kp` bf16),
/// by 32 x 32 blocks: `emit(i0, j0, block)` gets rows i0..i0+32, columns j0..j0+32 of C in
/// `block` (row-major, 32 wide), including padding rows and columns (zeros times anything).
///
/// # Safety
/// [`bf16_products`] returned true.
#[cfg(target_arch = "x86_64")]
pub unsafe fn gemm(a: &[u16], m: usize, b: &PackedB, emit: impl FnMut(usize, usize, &[f32])) {
    // SAFETY: as the caller promises.
    unsafe { gemm_cols(a, m, b, 0, b.np, emit) }
}

/// [`gemm`] over columns `j0..j1` of C only (multiples of [`NB`], `j1 <= b.np`).
///
/// # Safety
/// [`bf16_products`] returned true.
#[cfg(target_arch = "x86_64")]
pub unsafe fn gemm_cols(
    a: &[u16],
    m: usize,
    b: &PackedB,
    j0: usize,
    j1: usize,
    mut emit: impl FnMut(usize, usize, &[f32]),
) {
    assert!(
        j0 % NB == 0 && j1 % NB == 0 && j1 <= b.np,
        "gemm_cols column range"
    );
    let (kp, nkb) = (b.kp, b.kp / TK);
    let mp = round_up(m.max(1), MB);
    assert!(a.len() >= mp * kp && b.data.len() >= b.np * kp);
    let mut c = Block([0f32; MB * NB]);
    if !available() {
        // SAFETY: bf16_products() without tiles means AVX-512F and BF16 (caller); the
        // operands were bounded above.
        return unsafe { dp::gemm_cols(a, m, b, j0, j1, &mut c, emit) };
    }
    let lda = (kp * 2) as isize;
    // SAFETY: AMX is enabled (caller); every tile load reads 16 rows of 64 bytes inside `a`
    // (rows i0..i0+32 < mp, bytes kb*64.. < kp*2) or inside one packed tile of `b`.
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack));
        for i0 in (0..mp).step_by(MB) {
            let a0 = a.as_ptr().add(i0 * kp);
            let a1 = a0.add(16 * kp);
            for nb in (j0 / TN..j1 / TN).step_by(2) {
                let b0 = b.data.as_ptr().add(nb * nkb * TILE);
                let b1 = b0.add(nkb * TILE);
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    "2:",
                    "tileloadd tmm4, [{a0} + {lda}]",
                    "tileloadd tmm6, [{b0} + {s64}]",
                    "tileloadd tmm5, [{a1} + {lda}]",
                    "tileloadd tmm7, [{b1} + {s64}]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    "add {a0}, 64",
                    "add {a1}, 64",
                    "add {b0}, 1024",
                    "add {b1}, 1024",
                    "dec {n}",
                    "jnz 2b",
                    // C's four tiles at (0, 0), (0, 16), (16, 0), (16, 16) of the 32-wide block.
                    "tilestored [{c} + {s128}], tmm0",
                    "tilestored [{c} + {s128} + 64], tmm1",
                    "tilestored [{c} + {s128} + 2048], tmm2",
                    "tilestored [{c} + {s128} + 2112], tmm3",
                    a0 = inout(reg) a0 => _,
                    a1 = inout(reg) a1 => _,
                    b0 = inout(reg) b0 => _,
                    b1 = inout(reg) b1 => _,
                    n = inout(reg) nkb => _,
                    lda = in(reg) lda,
                    s64 = in(reg) 64isize,
                    s128 = in(reg) 128isize,
                    c = in(reg) c.0.as_mut_ptr(),
                    options(nostack),
                );
                emit(i0, nb * TN, &c.0);
            }
        }
        asm!("tilerelease", options(nostack));
    }
}

/// [`gemm`] on NEON bf16.
///
/// # Safety
/// [`bf16_products`] returned true.
#[cfg(target_arch = "aarch64")]
pub unsafe fn gemm(a: &[u16], m: usize, b: &PackedB, emit: impl FnMut(usize, usize, &[f32])) {
    // SAFETY: as the caller promises.
    unsafe { gemm_cols(a, m, b, 0, b.np, emit) }
}

/// [`gemm`] over columns `j0..j1` of C only (multiples of [`NB`], `j1 <= b.np`), on NEON
/// bf16.
///
/// # Safety
/// [`bf16_products`] returned true.
#[cfg(target_arch = "aarch64")]
pub unsafe fn gemm_cols(
    a: &[u16],
    m: usize,
    b: &PackedB,
    j0: usize,
    j1: usize,
    emit: impl FnMut(usize, usize, &[f32]),
) {
    assert!(
        j0.is_multiple_of(NB) && j1.is_multiple_of(NB) && j1 <= b.np,
        "gemm_cols column range"
    );
    let mp = round_up(m.max(1), MB);
    assert!(a.len() >= mp * b.kp && b.data.len() >= b.np * b.kp);
    let mut c = Block([0f32; MB * NB]);
    // SAFETY: bf16_products() on aarch64 means NEON bf16 (caller); the operands were
    // bounded above.
    unsafe { neon_bf16::gemm_cols(a, m, b, j0, j1, &mut c, emit) }
}

/// Without x86_64 or aarch64 there are no bf16 block products ([`bf16_products`] is false,
/// so this is never called).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub unsafe fn gemm(_: &[u16], _: usize, _: &PackedB, _: impl FnMut(usize, usize, &[f32])) {
    unreachable!("no bf16 block products on this architecture")
}

/// Without x86_64 or aarch64 there are no bf16 block products ([`bf16_products`] is false,
/// so this is never called).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub unsafe fn gemm_cols(
    _: &[u16],
    _: usize,
    _: &PackedB,
    _: usize,
    _: usize,
    _: impl FnMut(usize, usize, &[f32]),
) {
    unreachable!("no bf16 block products on this architecture")
}

/// A 32 x 32 block of C (row-major, 32 wide), 64-byte aligned.
#[repr(C, align(64))]
pub struct Block(pub [f32; MB * NB]);

impl Default for Block {
    fn default() -> Self {
        Block([0.0; MB * NB])
    }
}

/// Rows of C a vector strip fills ([`strips`]).
pub const STRIP: usize = 8;

/// The block loop of the vector block products (bf16, int8 and f32): for each 32-row block of
/// A (`i0`) and each pair of 16-column blocks in `j0..j1` (`nb`, `nb + 1`),
/// `strip(row0, nb, rows)` fills rows `row0 - i0 ..` (8 of them, 32 wide) of `c` for every
/// strip holding a row below m (the rest of `c` is zeros), then `emit(i0, 16 nb, c)`.
pub fn strips(
    m: usize,
    j0: usize,
    j1: usize,
    c: &mut Block,
    mut strip: impl FnMut(usize, usize, &mut [f32]),
    mut emit: impl FnMut(usize, usize, &[f32]),
) {
    let mp = round_up(m.max(1), MB);
    for i0 in (0..mp).step_by(MB) {
        // Strips wholly past the last row are padding: zeros, left uncomputed.
        let n = (m - i0.min(m)).min(MB).div_ceil(STRIP);
        c.0[n * STRIP * NB..].fill(0.0);
        for nb in (j0 / TN..j1 / TN).step_by(2) {
            for (s, rows) in c.0.chunks_exact_mut(STRIP * NB).take(n).enumerate() {
                strip(i0 + s * STRIP, nb, rows);
            }
            emit(i0, nb * TN, &c.0);
        }
    }
}

/// The block products on AVX-512 BF16 vectors: each 32 x 32 block of C as four 8-row strips,
/// 16 accumulators a strip (8 rows x two 16-column vectors); per k pair one load of each
/// column tile's row and one broadcast (A's pair as a 32-bit lane) per row.
#[cfg(target_arch = "x86_64")]
mod dp {
    use super::{Block, PackedB, TILE, TK};

    /// # Safety
    /// AVX-512F and AVX-512 BF16 are present; `a` holds `round_up(m, MB)` rows of `b.kp`,
    /// `b` is packed whole and `j0..j1` is a range of whole blocks inside it.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn gemm_cols(
        a: &[u16],
        m: usize,
        b: &PackedB,
        j0: usize,
        j1: usize,
        c: &mut Block,
        emit: impl FnMut(usize, usize, &[f32]),
    ) {
        let (kp, nkb) = (b.kp, b.kp / TK);
        let strip_of = |row0: usize, nb: usize, rows: &mut [f32]| {
            // SAFETY: rows row0..row0+8 of `a` and the two column blocks' tiles lie inside
            // the operands (caller); `rows` holds the strip's 8 x 32 values.
            unsafe {
                let b0 = b.data.as_ptr().add(nb * nkb * TILE);
                let b1 = b0.add(nkb * TILE);
                strip(
                    a.as_ptr().add(row0 * kp),
                    kp,
                    b0,
                    b1,
                    kp / 2,
                    rows.as_mut_ptr(),
                )
            }
        };
        super::strips(m, j0, j1, c, strip_of, emit)
    }

    /// C rows 0..8 (32 wide, at `c`) = A rows (`lda` values apart) · the two column tiles'
    /// pairs: accumulators zmm0-7 (columns 0-15) and zmm8-15 (16-31), the k pair's two tile
    /// rows in zmm16-17, each row's pair broadcast once.
    #[inline]
    unsafe fn strip(
        a: *const u16,
        lda: usize,
        b0: *const u16,
        b1: *const u16,
        pairs: usize,
        c: *mut f32,
    ) {
        debug_assert!(pairs > 0);
        let lda = (lda * 2) as isize;
        // SAFETY: the caller bounds every read (pairs = kp / 2 per row and per tile column)
        // and the 8 x 32 values written; AVX-512F and BF16 are present (caller).
        unsafe {
            super::super::strip_8x32!("vdpbf16ps", a, lda, b0, b1, pairs, c);
        }
    }
}

/// The block products on NEON bf16: each 32 x 32 block of C as four 8-row strips, each strip
/// as four pieces of 4 rows x 16 columns (one column tile): 16 accumulators (row r, columns
/// 4v..4v+4 in acc[r][v]); per four k pairs one 16-byte load of each row of A, then per pair
/// the tile row's four vectors and `bfdot` by element (lane L of the row's load: its pair).
#[cfg(target_arch = "aarch64")]
mod neon_bf16 {
    use super::{Block, PackedB, NB, TILE, TK, TN};
    use std::arch::aarch64::*;

    /// # Safety
    /// NEON bf16 is present; `a` holds `round_up(m, MB)` rows of `b.kp`, `b` is packed whole
    /// and `j0..j1` is a range of whole blocks inside it.
    pub unsafe fn gemm_cols(
        a: &[u16],
        m: usize,
        b: &PackedB,
        j0: usize,
        j1: usize,
        c: &mut Block,
        emit: impl FnMut(usize, usize, &[f32]),
    ) {
        let (kp, nkb) = (b.kp, b.kp / TK);
        let strip_of = |row0: usize, nb: usize, rows: &mut [f32]| {
            // SAFETY: rows row0..row0+8 of `a` and the two column blocks' tiles lie inside
            // the operands (caller); `rows` holds the strip's 8 x 32 values; bf16 is present
            // (caller).
            unsafe {
                let b0 = b.data.as_ptr().add(nb * nkb * TILE);
                let ap = a.as_ptr().add(row0 * kp);
                for (half, bt) in [b0, b0.add(nkb * TILE)].into_iter().enumerate() {
                    for r in [0, 4] {
                        let cp = rows.as_mut_ptr().add(r * NB + half * TN);
                        piece(ap.add(r * kp), kp, bt, cp);
                    }
                }
            }
        };
        super::strips(m, j0, j1, c, strip_of, emit)
    }

    /// C (4 rows of 16 at `c`, `NB` apart) = 4 rows of A (`kp` bf16 each, a multiple of 8,
    /// rows `kp` apart) · one column block's tiles at `b` (kp / 2 rows of 16 pairs).
    #[target_feature(enable = "neon,bf16")]
    unsafe fn piece(a: *const u16, kp: usize, b: *const u16, c: *mut f32) {
        // SAFETY: the caller bounds every read (kp values of 4 rows, kp / 2 tile rows of
        // 2 TN values) and the 4 x 16 values written.
        unsafe {
            let mut acc = [[vdupq_n_f32(0.0); 4]; 4];
            for p in (0..kp).step_by(8) {
                let x = [0, 1, 2, 3].map(|r| vld1q_u16(a.add(r * kp + p)));
                // Pair p / 2's tile row: 2 TN values from p TN.
                let bp = b.add(p * TN);
                step::<0>(&mut acc, &x, bp);
                step::<1>(&mut acc, &x, bp.add(2 * TN));
                step::<2>(&mut acc, &x, bp.add(4 * TN));
                step::<3>(&mut acc, &x, bp.add(6 * TN));
            }
            for (r, acc) in acc.iter().enumerate() {
                for (v, &s) in acc.iter().enumerate() {
                    vst1q_f32(c.add(r * NB + 4 * v), s);
                }
            }
        }
    }

    /// One k pair of the column tile (its 16 pairs at `b`) into the accumulators, each
    /// row's pair being lane L (of 4 pairs) of its load.
    #[inline(always)]
    unsafe fn step<const L: i32>(
        acc: &mut [[float32x4_t; 4]; 4],
        x: &[uint16x8_t; 4],
        b: *const u16,
    ) {
        // SAFETY: 2 TN values at `b` (caller).
        unsafe {
            let w = vld1q_u16_x4(b);
            let w = [w.0, w.1, w.2, w.3];
            for (acc, &xr) in acc.iter_mut().zip(x) {
                for (s, &wv) in acc.iter_mut().zip(&w) {
                    *s = bfdot::<L>(*s, wv, xr);
                }
            }
        }
    }

    /// `bfdot acc.4s, w.8h, x.2h[L]`: lane i += w[2i] x[2L] + w[2i + 1] x[2L + 1] (bf16
    /// products, f32 sums).
    #[inline(always)]
    unsafe fn bfdot<const L: i32>(acc: float32x4_t, w: uint16x8_t, x: uint16x8_t) -> float32x4_t {
        let mut acc = acc;
        // SAFETY: registers only; callers enable "bf16".
        unsafe {
            std::arch::asm!(
                "bfdot {0:v}.4s, {1:v}.8h, {2:v}.2h[{l}]",
                inout(vreg) acc,
                in(vreg) w,
                in(vreg) x,
                l = const L,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        acc
    }
}

/// Configures this thread's tiles for [`conv_block_u8`].
///
/// # Safety
/// [`available`] returned true.
pub unsafe fn tiles_on() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AMX is enabled (caller); the configuration is a valid palette-1 layout.
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack))
    };
}

/// Releases this thread's tiles.
///
/// # Safety
/// [`available`] returned true.
pub unsafe fn tiles_off() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AMX is enabled (caller).
    unsafe {
        asm!("tilerelease", options(nostack))
    };
}

/// For the block products' checks: uniform values in [-1, 1) from a fixed seed.
#[doc(hidden)]
pub fn check_values(seed: u32) -> impl FnMut() -> f32 {
    let mut seed = seed;
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        (seed as f32 / u32::MAX as f32) * 2.0 - 1.0
    }
}

/// For the block products' checks: C (m x n) gathered from `run(j_lo, emit)` over all the
/// columns, then over the upper half of the blocks alone (`gemm_cols`' range); `np` is the
/// packed width.
#[doc(hidden)]
pub fn check_gather(
    m: usize,
    n: usize,
    np: usize,
    mut run: impl FnMut(usize, &mut dyn FnMut(usize, usize, &[f32])),
) -> Vec<f32> {
    let mut c = vec![f32::NAN; m * n];
    for j_lo in [0, np / NB / 2 * NB] {
        run(j_lo, &mut |i0, j0, blk| {
            for i in i0..(i0 + MB).min(m) {
                for j in j0..(j0 + NB).min(n) {
                    c[i * n + j] = blk[(i - i0) * NB + j - j0];
                }
            }
        });
    }
    c
}

/// A 32 x 32 block of i32 sums for [`conv_block_u8`], as the tiles store it (row-major).
#[repr(C, align(64))]
pub struct BlockI32(pub [i32; MB * NB]);

impl Default for BlockI32 {
    fn default() -> Self {
        BlockI32([0; MB * NB])
    }
}

/// One 32 x 32 block of a u8 x u8 product summed over `taps` shifted operands:
/// C = Σ_{j < taps} Σ_{kb < nkb} A(j, kb) · B(j, kb), where A(j, kb) is the 32 x 64 byte block
/// at `a + j * a_tap + kb * 64` (rows `lda` bytes apart) and B(j, kb) the 64 x 32 block in
/// groups of 4 bytes at `b + b_off[j] + kb * 16 * ldb` (16 rows of 32 groups, `ldb` bytes
/// apart), taps = `b_off.len()`: `tdpbuud`, exact i32 sums.
///
/// # Safety
/// [`available`] returned true, [`tiles_on`] ran on this thread (and no [`tiles_off`] since);
/// every block read lies inside the caller's buffers.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn conv_block_u8(
    a: *const u8,
    lda: usize,
    a_tap: usize,
    b: *const u8,
    ldb: usize,
    b_off: &[usize],
    nkb: usize,
    c: &mut BlockI32,
) {
    if b_off.is_empty() || nkb == 0 {
        c.0.fill(0);
        return;
    }
    // SAFETY: AMX is enabled, the tiles configured and the operands in bounds (caller).
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack)
        );
        for (j, &bo) in b_off.iter().enumerate() {
            let a0 = a.add(j * a_tap);
            let a1 = a0.add(16 * lda);
            let b0 = b.add(bo);
            asm!(
                "2:",
                "tileloadd tmm4, [{a0} + {lda}]",
                "tileloadd tmm6, [{b0} + {ldb}]",
                "tileloadd tmm5, [{a1} + {lda}]",
                "tileloadd tmm7, [{b0} + {ldb} + 64]",
                "tdpbuud tmm0, tmm4, tmm6",
                "tdpbuud tmm1, tmm4, tmm7",
                "tdpbuud tmm2, tmm5, tmm6",
                "tdpbuud tmm3, tmm5, tmm7",
                "add {a0}, 64",
                "add {a1}, 64",
                "add {b0}, {b16}",
                "dec {n}",
                "jnz 2b",
                a0 = inout(reg) a0 => _,
                a1 = inout(reg) a1 => _,
                b0 = inout(reg) b0 => _,
                n = inout(reg) nkb => _,
                lda = in(reg) lda as isize,
                ldb = in(reg) ldb as isize,
                b16 = in(reg) (16 * ldb) as isize,
                options(nostack),
            );
        }
        asm!(
            "tilestored [{c} + {s128}], tmm0",
            "tilestored [{c} + {s128} + 64], tmm1",
            "tilestored [{c} + {s128} + 2048], tmm2",
            "tilestored [{c} + {s128} + 2112], tmm3",
            c = in(reg) c.0.as_mut_ptr(),
            s128 = in(reg) 128isize,
            options(nostack),
        );
    }
}

/// Without x86_64 there are no tiles ([`available`] is false, so this is never called).
#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
pub unsafe fn conv_block_u8(
    _: *const u8,
    _: usize,
    _: usize,
    _: *const u8,
    _: usize,
    _: &[usize],
    _: usize,
    _: &mut BlockI32,
) {
    unreachable!("AMX is x86_64 only")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
        assert_eq!(bf16(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(bf16(1.0 + 3.0 / 512.0), 0x3f81);
        assert_eq!(bf16(-2.0), 0xc000);
    }

    #[test]
    fn gemm_matches_f32_products_of_the_rounded_inputs() {
        // Tiles where present, else vdpbf16ps; the vector kernel on its own below.
        if !bf16_products() {
            eprintln!("no bf16 block products here: skipped");
            return;
        }
        check_gemm(|a, m, b, j0, j1, emit| unsafe { gemm_cols(a, m, b, j0, j1, emit) });
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn vector_gemm_matches_f32_products_of_the_rounded_inputs() {
        if !dp_available() {
            eprintln!("AVX-512 BF16 not available here: skipped");
            return;
        }
        check_gemm(|a, m, b, j0, j1, emit| {
            let mut c = Block([0f32; MB * NB]);
            // SAFETY: dp_available() was checked; the operands are built whole below.
            unsafe { dp::gemm_cols(a, m, b, j0, j1, &mut c, emit) }
        });
    }

    type GemmCols<'e> =
        dyn Fn(&[u16], usize, &PackedB, usize, usize, &mut dyn FnMut(usize, usize, &[f32])) + 'e;

    fn check_gemm(
        run: impl Fn(&[u16], usize, &PackedB, usize, usize, &mut dyn FnMut(usize, usize, &[f32])),
    ) {
        let run: &GemmCols = &run;
        let f = |x: u16| f32::from_bits((x as u32) << 16);
        let mut rnd = check_values(0x9e37_79b9);
        for (m, n, k) in [
            (1, 1, 1),
            (33, 17, 40),
            (64, 64, 64),
            (70, 100, 250),
            (5, 48, 33),
        ] {
            let x: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
            let w: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
            let b = PackedB::from_rows(n, k, |j, r| r.copy_from_slice(&w[j * k..(j + 1) * k]));
            let mut a = Vec::new();
            to_bf16_rows(&x, k, m, k, b.kp, &mut a);
            let c = check_gather(m, n, b.np, |j_lo, emit| run(&a, m, &b, j_lo, b.np, emit));
            for i in 0..m {
                for j in 0..n {
                    let want: f32 = (0..k)
                        .map(|p| f(bf16(x[i * k + p])) * f(bf16(w[j * k + p])))
                        .sum();
                    let got = c[i * n + j];
                    assert!(
                        (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{m}x{n}x{k} at ({i},{j}): {got} vs {want}"
                    );
                }
            }
        }
    }
}
