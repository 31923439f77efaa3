//! Convolutions on integers through AMX int8 tiles, or AVX-512 VNNI where the CPU has no
//! tiles (AMD, most Intel parts), as ONNX's `ConvInteger` after
//! `DynamicQuantizeLinear` computes them: x (c_in, len) rounded to its per-tensor uint8 grid
//! (xq, scale sx, zero point zx), the weight held as uint8 (wq, scale sw[o], zero point zw[o]):
//!
//! ```text
//! out[o][t] = bias[o] + sx sw[o] Σ_{i,j} (xq[i][t + j dil - pad] - zx) (wq[o][i][j] - zw[o])
//!           = bias[o] + sx sw[o] (C[o][t] - zw[o] Sx[t] - zx Sw[o] + K zx zw[o])
//! ```
//!
//! with C = Σ xq wq (exact, `tdpbuud`), Sx[t] the sum of xq over t's receptive field (padding
//! holds zx, the grid's zero), Sw[o] the sum of wq over o's row and K = c_in k. No im2col: the
//! quantized input is laid out once in groups of 4 channels per time step, so the B tile of
//! tap j is the same buffer shifted by j dil steps; the weight is packed per tap at load.
//!
//! The input may first go through a per-channel affine map and Snake ([`Pre`]: the AdaIN and
//! Snake ahead of the vocoder's convolutions), applied as it is rounded, and the result may be
//! added to `out` (the residual sum after it): neither is a pass over memory of its own.
//!
//! VNNI multiplies u8 by s8 only: its weight is packed as wq - 128 (bytes XOR 0x80), so its
//! sum C' = C - 128 Sx, and the epilogue's term zw Sx becomes (zw - 128) Sx: the same exact
//! integers. NEON dotprod and i8mm take the same weight bytes (i8mm's in row pairs).

use super::vmath;
use crate::cpu::kernels::amx::{self, BlockI32, MB, NB};
use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::CpuTensor;
use crate::Conv1dShape;

/// Input channels per tile row (64 bytes).
const KC: usize = 64;
/// Output positions per thread-local chunk (its B rows stay in L2 for every output block).
const CHUNK: usize = 256;

/// The integer kernel a packed weight is laid out for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    Amx,
    /// AVX-512 VNNI (`vpdpbusd`): the weight's bytes are wq - 128.
    Vnni,
    /// AVX-VNNI (`vpdpbusd` on 256-bit vectors, client CPUs without AVX-512): as `Vnni`.
    AvxVnni,
    /// AVX2 (`vpmaddwd` on 16-bit values): the weight is wq - 128 as i16, two bytes a value.
    Avx2,
    /// NEON dotprod (`sdot`, signed by signed): the weight as `Vnni`'s, the input bytes
    /// taken as x - 128 and 128 Σ a' added back, so the sums are `Vnni`'s.
    Dotprod,
    /// NEON i8mm (`usmmla`, unsigned by signed as `vpdpbusd`): the weight as `Vnni`'s in
    /// row pairs (each 8 values of rows 2i, 2i + 1 in turn), the sums `Vnni`'s.
    I8mm,
}

impl Isa {
    /// Bytes a packed weight value takes.
    fn weight_bytes(self) -> usize {
        match self {
            Isa::Avx2 => 2,
            _ => 1,
        }
    }
}

/// The integer kernel this CPU runs: the first of [`isas`].
fn isa() -> Option<Isa> {
    isas().first().copied()
}

/// The integer kernels this CPU has, best first: AMX tiles, AVX-512 VNNI, AVX-VNNI, AVX2;
/// on ARM NEON i8mm, then dotprod.
fn isas() -> Vec<Isa> {
    [
        (Isa::Amx, amx::available()),
        (Isa::Vnni, vnni::available()),
        (Isa::AvxVnni, vex::available()),
        (Isa::I8mm, i8mm::available()),
        (Isa::Dotprod, dotprod::available()),
        (Isa::Avx2, wide::available()),
    ]
    .into_iter()
    .filter_map(|(i, ok)| ok.then_some(i))
    .collect()
}

impl Isa {
    /// The kernel set's name (what `KILN_REQUIRE_KERNELS` asks for).
    fn name(self) -> &'static str {
        match self {
            Isa::Amx => "amx",
            Isa::Vnni => "avx512-vnni-conv",
            Isa::AvxVnni => "avx-vnni-conv",
            Isa::Avx2 => "avx2-conv",
            Isa::Dotprod => "neon-dotprod-conv",
            Isa::I8mm => "neon-i8mm-conv",
        }
    }
}

/// The integer convolution kernel this CPU runs, by name ("amx", "avx512-vnni-conv",
/// "avx-vnni-conv", "avx2-conv", "neon-i8mm-conv", "neon-dotprod-conv"), or None (Kokoro's
/// int8 convolutions then run in f32 on the rounded input).
pub fn kernel_name() -> Option<&'static str> {
    isa().map(Isa::name)
}

/// Every integer convolution kernel set this CPU has, the one it runs first (the tests
/// check each of them against the same integer sums).
pub fn kernel_names() -> Vec<&'static str> {
    isas().into_iter().map(Isa::name).collect()
}

/// An integer convolution weight in tile order.
#[derive(Debug)]
pub struct PackedConvQ8 {
    pub c_in: usize,
    pub c_out: usize,
    pub k: usize,
    isa: Isa,
    /// A per tap: [tap][op rows][cp values], zero-padded, `isa.weight_bytes()` a value.
    a: Vec<u8>,
    op: usize,
    cp: usize,
    w_scale: Vec<f32>,
    w_zero: Vec<i32>,
    /// Σ_{i,j} wq[o][i][j]
    w_sum: Vec<i32>,
}

impl PackedConvQ8 {
    pub fn bytes(&self) -> usize {
        self.a.len() + 12 * self.c_out
    }
}

/// Whether a layer of shape `s` runs here.
pub fn applies(s: &Conv1dShape) -> bool {
    s.stride >= 1
        && (s.stride == 1 || s.dilation == 1)
        && s.groups == 1
        && s.k >= 1
        && isa().is_some()
}

/// Packs wq (c_out, c_in, k) with per-tensor (1 value) or per-output-channel zero points and
/// scales; None when the sizes do not fit.
pub fn pack(q: &[u8], zero: &[i32], scale: &[f32], s: &Conv1dShape) -> Option<PackedConvQ8> {
    pack_for(isa()?, q, zero, scale, s)
}

/// [`pack`] for the kernel `isa` (one of [`isas`]).
fn pack_for(
    isa: Isa,
    q: &[u8],
    zero: &[i32],
    scale: &[f32],
    s: &Conv1dShape,
) -> Option<PackedConvQ8> {
    let (c_in, c_out, k) = (s.c_in, s.c_out, s.k);
    let per = |n: usize| n == 1 || n == c_out;
    if q.len() != c_out * c_in * k || !per(zero.len()) || !per(scale.len()) {
        return None;
    }
    let (op, cp) = (amx::round_up(c_out, MB), amx::round_up(c_in, KC));
    let eb = isa.weight_bytes();
    let mut a = vec![0u8; k * op * cp * eb];
    let mut w_sum = vec![0i32; c_out];
    for o in 0..c_out {
        for i in 0..c_in {
            for j in 0..k {
                let v = q[(o * c_in + i) * k + j];
                let at = ((j * op + o) * cp + i) * eb;
                match isa {
                    Isa::Amx => a[at] = v,
                    Isa::Vnni | Isa::AvxVnni | Isa::Dotprod => a[at] = v ^ 0x80,
                    // Rows o - o % 2 and o - o % 2 + 1 share 2 cp bytes: per 8 values,
                    // the first row's 8 bytes, then the second's.
                    Isa::I8mm => {
                        let pair = (j * op + o - o % 2) * cp;
                        a[pair + (i / 8) * 16 + (o % 2) * 8 + i % 8] = v ^ 0x80;
                    }
                    Isa::Avx2 => {
                        a[at..at + 2].copy_from_slice(&(v as i16 - 128).to_le_bytes());
                    }
                }
                w_sum[o] += v as i32;
            }
        }
    }
    let pick = |v: &[i32], o: usize| if v.len() == 1 { v[0] } else { v[o] };
    let pickf = |v: &[f32], o: usize| if v.len() == 1 { v[0] } else { v[o] };
    Some(PackedConvQ8 {
        c_in,
        c_out,
        k,
        isa,
        a,
        op,
        cp,
        w_scale: (0..c_out).map(|o| pickf(scale, o)).collect(),
        w_zero: (0..c_out).map(|o| pick(zero, o)).collect(),
        w_sum,
    })
}

/// What each input value goes through before it is rounded (the AdaIN and Snake ahead of the
/// generator's convolutions): x' = scale[i] x + shift[i] per input channel i, then with
/// `alpha` Snake: x' + sin(alpha[i] x')^2 / alpha[i].
#[derive(Debug, Clone, Copy)]
pub struct Pre<'a> {
    /// [scale, shift, min, max] per input channel, min and max those of x's row: both maps
    /// are monotonic (Snake's slope is 1 + sin(2 alpha x') >= 0), so the mapped row's range
    /// is that of its ends and needs no pass over x.
    pub map: &'a [f32],
    pub alpha: Option<&'a [f32]>,
}

/// One channel's [`Pre`]: (scale, shift) and Snake's alpha and 1 / alpha.
#[derive(Debug, Clone, Copy)]
struct Map {
    sc: f32,
    sh: f32,
    a: f32,
    inv: f32,
}

impl Map {
    fn of(pre: Option<&Pre>, ch: usize) -> Map {
        match pre {
            None => Map {
                sc: 1.0,
                sh: 0.0,
                a: 0.0,
                inv: 0.0,
            },
            Some(p) => {
                let a = p.alpha.map_or(0.0, |a| a[ch]);
                Map {
                    sc: p.map[4 * ch],
                    sh: p.map[4 * ch + 1],
                    a,
                    inv: 1.0 / a,
                }
            }
        }
    }

    /// As `ada_in_row` then `snake_row` compute it, value by value.
    #[inline(always)]
    fn apply<const SNAKE: bool>(self, v: f32) -> f32 {
        let y = v * self.sc + self.sh;
        if SNAKE {
            let s = vmath::sin(self.a * y);
            y + self.inv * s * s
        } else {
            y
        }
    }
}

/// (min, max) of the mapped row, 0 included (DynamicQuantizeLinear's range).
#[inline(always)]
fn range_body<const SNAKE: bool>(r: &[f32], m: Map) -> (f32, f32) {
    let mut lo = [0f32; 16];
    let mut hi = [0f32; 16];
    let mut it = r.chunks_exact(16);
    for c in &mut it {
        for l in 0..16 {
            let v = m.apply::<SNAKE>(c[l]);
            lo[l] = lo[l].min(v);
            hi[l] = hi[l].max(v);
        }
    }
    let (mut l, mut h) = (0f32, 0f32);
    for &v in it.remainder() {
        let v = m.apply::<SNAKE>(v);
        l = l.min(v);
        h = h.max(v);
    }
    for i in 0..16 {
        l = l.min(lo[i]);
        h = h.max(hi[i]);
    }
    (l, h)
}

/// d[t] = the 4 bytes of the mapped x0[t], x1[t], x2[t], x3[t] rounded to the grid (scale,
/// zero point) as `fake_quant_u8` rounds: round half to even of x / scale, plus zp, clamped
/// to 0..=255.
#[inline(always)]
fn quantize_body<const SNAKE: bool>(
    d: &mut [u32],
    x: [&[f32]; 4],
    m: [Map; 4],
    scale: f32,
    zp: f32,
) {
    let n = d
        .len()
        .min(x[0].len())
        .min(x[1].len())
        .min(x[2].len())
        .min(x[3].len());
    let (a, b, c, e) = (&x[0][..n], &x[1][..n], &x[2][..n], &x[3][..n]);
    for (t, d) in d[..n].iter_mut().enumerate() {
        *d = q8(m[0].apply::<SNAKE>(a[t]), scale, zp)
            | (q8(m[1].apply::<SNAKE>(b[t]), scale, zp) << 8)
            | (q8(m[2].apply::<SNAKE>(c[t]), scale, zp) << 16)
            | (q8(m[3].apply::<SNAKE>(e[t]), scale, zp) << 24);
    }
}

/// v rounded to the grid, as a byte value.
#[inline(always)]
fn q8(v: f32, scale: f32, zp: f32) -> u32 {
    const MAGIC: f32 = 12_582_912.0;
    // The clamped value is an integer in 0..=255: adding MAGIC leaves it in the low mantissa
    // bits (no float-to-int conversion, which does not vectorize with Rust's NaN rule).
    let r = ((v / scale + MAGIC) - MAGIC + zp).max(0.0).min(255.0);
    (r + MAGIC).to_bits() & 0xff
}

/// acc[v] += the sum of the 4 bytes of row[v].
#[inline(always)]
fn byte_sums_body(acc: &mut [i32], row: &[u32]) {
    for (c, &v) in acc.iter_mut().zip(row) {
        *c += ((v & 0xff) + ((v >> 8) & 0xff) + ((v >> 16) & 0xff) + (v >> 24)) as i32;
    }
}

/// dst (+)= ao (c - zw sx + co) + b: one output row of a block, from its exact sums.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn finish_body<const ACC: bool>(
    dst: &mut [f32],
    c: &[i32],
    sx: &[i32],
    ao: f32,
    co: i32,
    zw: i32,
    b: f32,
) {
    for ((d, &cv), &sv) in dst.iter_mut().zip(c).zip(sx) {
        let v = ao * (cv - zw * sv + co) as f32 + b;
        if ACC {
            *d += v;
        } else {
            *d = v;
        }
    }
}

/// The passes above compiled for a vector extension (the same arithmetic: no contraction
/// into FMA, so every instantiation rounds alike).
macro_rules! vector_bodies {
    ($module:ident, $features:literal) => {
        #[cfg(target_arch = "x86_64")]
        mod $module {
            use super::Map;

            #[target_feature(enable = $features)]
            pub unsafe fn range<const SNAKE: bool>(r: &[f32], m: Map) -> (f32, f32) {
                super::range_body::<SNAKE>(r, m)
            }
            #[target_feature(enable = $features)]
            pub unsafe fn quantize<const SNAKE: bool>(
                d: &mut [u32],
                x: [&[f32]; 4],
                m: [Map; 4],
                scale: f32,
                zp: f32,
            ) {
                super::quantize_body::<SNAKE>(d, x, m, scale, zp)
            }
            #[target_feature(enable = $features)]
            pub unsafe fn byte_sums(acc: &mut [i32], row: &[u32]) {
                super::byte_sums_body(acc, row)
            }
            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn finish<const ACC: bool>(
                dst: &mut [f32],
                c: &[i32],
                sx: &[i32],
                ao: f32,
                co: i32,
                zw: i32,
                b: f32,
            ) {
                super::finish_body::<ACC>(dst, c, sx, ao, co, zw, b)
            }
        }
    };
}
vector_bodies!(avx512, "avx512f,avx512bw");
vector_bodies!(avx2, "avx2");

/// The widest vector extension of this CPU the passes run on: 2 (AVX-512F/BW), 1 (AVX2) or 0.
fn vector_level() -> u8 {
    #[cfg(target_arch = "x86_64")]
    {
        static LEVEL: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
        *LEVEL.get_or_init(|| {
            let simd = !crate::cpu::kernels::simd_disabled();
            if simd && !crate::options::get().no_avx512 && is_x86_feature_detected!("avx512bw") {
                2
            } else if simd && is_x86_feature_detected!("avx2") {
                1
            } else {
                0
            }
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// Returns `$module::$call` from the calling function for the CPU's vector level, if any.
macro_rules! vector_call {
    ($($call:tt)*) => {
        #[cfg(target_arch = "x86_64")]
        match vector_level() {
            // SAFETY: the CPU has the extension (checked by vector_level).
            2 => return unsafe { avx512::$($call)* },
            1 => return unsafe { avx2::$($call)* },
            _ => {}
        }
    };
}

fn range_of(r: &[f32], m: Map, snake: bool) -> (f32, f32) {
    if snake {
        vector_call!(range::<true>(r, m));
        range_body::<true>(r, m)
    } else {
        vector_call!(range::<false>(r, m));
        range_body::<false>(r, m)
    }
}

fn quantize_into(d: &mut [u32], x: [&[f32]; 4], m: [Map; 4], snake: bool, scale: f32, zp: f32) {
    if snake {
        vector_call!(quantize::<true>(d, x, m, scale, zp));
        quantize_body::<true>(d, x, m, scale, zp)
    } else {
        vector_call!(quantize::<false>(d, x, m, scale, zp));
        quantize_body::<false>(d, x, m, scale, zp)
    }
}

fn byte_sums(acc: &mut [i32], row: &[u32]) {
    vector_call!(byte_sums(acc, row));
    byte_sums_body(acc, row)
}

#[allow(clippy::too_many_arguments)]
fn finish(dst: &mut [f32], c: &[i32], sx: &[i32], ao: f32, co: i32, zw: i32, b: f32, acc: bool) {
    if acc {
        vector_call!(finish::<true>(dst, c, sx, ao, co, zw, b));
        finish_body::<true>(dst, c, sx, ao, co, zw, b)
    } else {
        vector_call!(finish::<false>(dst, c, sx, ao, co, zw, b));
        finish_body::<false>(dst, c, sx, ao, co, zw, b)
    }
}

/// The block of [`amx::conv_block_u8`] on AVX-512 VNNI: 16 time steps a vector (a B row's
/// 16 groups of 4 channel bytes, as laid out), 8 output rows' weights broadcast in turn.
mod vnni;

/// The block of [`amx::conv_block_u8`] on AVX-VNNI: as the AVX-512 one with 8 time steps a
/// vector (2 rows x 32 time steps of accumulators in 16 registers).
mod vex;

/// The block of [`amx::conv_block_u8`] on AVX2: the input bytes widened to 16 bits (a
/// 32-bit lane holds two channels of one time step), the weight packed as 16-bit wq - 128,
/// `vpmaddwd` summing each pair exactly in i32; the lanes of a time step's two pairs are
/// added at the end. `vpmaddubsw` would take twice the values an instruction but saturates
/// at u8 x i8 pair sums past 32767, which 8-bit inputs and weights reach.
mod wide;

/// The block of [`amx::conv_block_u8`] on NEON dotprod: 2 output rows x 32 time steps in 16
/// accumulators (4 time steps a vector), the input's 4-channel groups flipped to signed
/// (x - 128) as loaded, each row's 4 weight bytes broadcast; 128 Σ a' added back per row, so
/// the sums are the VNNI block's.
mod dotprod;

/// The block of [`amx::conv_block_u8`] on NEON i8mm: `usmmla` multiplies a 2 x 8 block of
/// unsigned input bytes (2 time steps x 8 channels) by an 8 x 2 block of signed weight bytes
/// (8 channels x 2 output rows) into 2 x 2 exact sums, unsigned by signed as `vpdpbusd`: the
/// VNNI block's sums, the input taken as it is laid out. Pieces of 8 rows x 8 time steps (16
/// accumulators); per 8 channels, one load of 4 time steps from each of the two channel
/// groups, zipped into time-step pairs, and one 16-byte load per row pair of the weight
/// (packed so). The pairs are unzipped into rows at the end.
mod i8mm;

/// A vector block's operands but its rows (`vnni::conv_block`'s contract), for the kernels
/// that compute a block's rows in steps.
#[cfg(target_arch = "x86_64")]
struct Operands<'a> {
    a: *const u8,
    lda: usize,
    a_tap: usize,
    b: *const u8,
    ldb: usize,
    b_off: &'a [usize],
    nq: usize,
}

/// A block's live rows (the first `rows` rounded up to 2) in steps that `step` takes from
/// the first row of each and the rows left (it computes some of them and says how many);
/// the rows past them zeroed.
#[cfg(target_arch = "x86_64")]
fn row_steps(
    rows: usize,
    c: &mut BlockI32,
    mut step: impl FnMut(usize, usize, &mut BlockI32) -> usize,
) {
    let live = rows.next_multiple_of(2).min(MB);
    let mut r0 = 0;
    while r0 < live {
        r0 += step(r0, live - r0, c);
    }
    c.0[live * NB..MB * NB].fill(0);
}

/// A vector kernel's block: `vnni::conv_block`'s contract.
type BlockFn =
    unsafe fn(*const u8, usize, usize, *const u8, usize, &[usize], usize, usize, &mut BlockI32);

/// The vector block kernel a weight was packed for.
fn vector_block(isa: Isa) -> BlockFn {
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Vnni => return vnni::conv_block,
        Isa::AvxVnni => return vex::conv_block,
        Isa::Avx2 => return wide::conv_block,
        Isa::Amx | Isa::Dotprod | Isa::I8mm => {}
    }
    #[cfg(target_arch = "aarch64")]
    match isa {
        Isa::Dotprod => return dotprod::conv_block,
        Isa::I8mm => return i8mm::conv_block,
        Isa::Amx | Isa::Vnni | Isa::AvxVnni | Isa::Avx2 => {}
    }
    unreachable!("no vector block for {isa:?}")
}

thread_local! {
    /// The quantized input in groups of 4 channels per time step (kept between calls).
    static XQ: std::cell::RefCell<Vec<u32>> = Default::default();
}

/// out (c_out, len_out) = conv1d(x mapped by `pre` and rounded to its uint8 grid, w) + bias,
/// or with `acc`, out += that. Each output is written once: out need not be zeroed.
#[allow(clippy::too_many_arguments)]
pub fn conv1d(
    pool: &Pool,
    x: &CpuTensor,
    w: &PackedConvQ8,
    bias: Option<&CpuTensor>,
    s: Conv1dShape,
    pre: Option<Pre>,
    acc: bool,
    out: &mut CpuTensor,
) {
    let (c_in, c_out, k, len, dil) = (s.c_in, s.c_out, s.k, s.len_in, s.dilation);
    assert!(
        w.c_in == c_in && w.c_out == c_out && w.k == k,
        "conv1d_q8: weight shape"
    );
    let lo = s.len_out();
    assert!(x.data.len() >= c_in * len, "conv1d_q8 input too small");
    assert!(out.data.len() >= c_out * lo, "conv1d_q8 output too small");
    if let Some(p) = &pre {
        assert!(
            p.map.len() >= 4 * c_in && p.alpha.is_none_or(|a| a.len() >= c_in),
            "conv1d_q8: a map per input channel"
        );
    }
    let snake = pre.is_some_and(|p| p.alpha.is_some());
    let maps: Vec<Map> = (0..c_in).map(|ch| Map::of(pre.as_ref(), ch)).collect();
    let bias_of = |o: usize| bias.map_or(0.0, |b| b.data[o]);
    // DynamicQuantizeLinear's grid for the mapped x: its range (with 0) per channel, from
    // the ends with `pre`, else in a pass over x in parallel.
    let mut ranges = vec![0f32; 2 * c_in];
    let rp = SharedMut(ranges.as_mut_ptr());
    pool.run(if pre.is_some() { 0 } else { c_in }, |a, b| {
        let rp = rp;
        for ch in a..b {
            let (l, h) = range_of(&x.data[ch * len..(ch + 1) * len], maps[ch], snake);
            // SAFETY: entries 2 ch, 2 ch + 1 are this thread's alone; they lie in ranges.
            unsafe {
                rp.write(2 * ch, l);
                rp.write(2 * ch + 1, h);
            }
        }
    });
    if let Some(p) = &pre {
        for (ch, r) in ranges.chunks_exact_mut(2).enumerate() {
            let m = maps[ch];
            let ends = [p.map[4 * ch + 2], p.map[4 * ch + 3]].map(|v| {
                if snake {
                    m.apply::<true>(v)
                } else {
                    m.apply::<false>(v)
                }
            });
            (r[0], r[1]) = (ends[0].min(ends[1]), ends[0].max(ends[1]));
        }
    }
    let (mut l, mut h) = (0f32, 0f32);
    for r in ranges.chunks_exact(2) {
        l = l.min(r[0]);
        h = h.max(r[1]);
    }
    let sx = (h - l) / 255.0;
    let zx = if sx == 0.0 {
        0.0
    } else {
        (-l / sx).round_ties_even().clamp(0.0, 255.0)
    };
    if sx == 0.0 {
        // The mapped x is all zeros: only the bias remains.
        for o in 0..c_out {
            let row = &mut out.data[o * lo..(o + 1) * lo];
            if acc {
                row.iter_mut().for_each(|v| *v += bias_of(o));
            } else {
                row.fill(bias_of(o));
            }
        }
        return;
    }
    let zq = zx as u8;
    let (cp, op) = (w.cp, w.op);
    let nq = cp / 4;
    // Strided layers read `st` phases of the padded input, x_r[m] = x[m st + r - pad], each
    // laid out like a stride-1 input: tap j reads phase j % st shifted by j / st.
    let st = s.stride;
    let xs = if st == 1 {
        amx::round_up(lo.max(1), NB) + (k - 1) * dil
    } else {
        amx::round_up(lo.max(1), NB) + (k - 1) / st + 1
    };
    let pad_word = |p: usize| -> u32 {
        (0..4)
            .filter(|e| 4 * p + e < c_in)
            .fold(0, |w, e| w | (zq as u32) << (8 * e))
    };
    XQ.with(|cell| {
        let xq = &mut *cell.borrow_mut();
        // Every word of the first st nq xs is written below (no zeroing first).
        if xq.len() < st * nq * xs {
            xq.resize(st * nq * xs, 0);
        }
        if st > 1 {
            for r in 0..st {
                for p in c_in.div_ceil(4)..nq {
                    xq[(r * nq + p) * xs..(r * nq + p + 1) * xs].fill(0);
                }
            }
            let q1 = |ch: usize, v: f32| -> u32 {
                let m = maps[ch];
                let v = if snake {
                    m.apply::<true>(v)
                } else {
                    m.apply::<false>(v)
                };
                q8(v, sx, zx)
            };
            for r in 0..st {
                for p in 0..nq.min(c_in.div_ceil(4)) {
                    let row = &mut xq[(r * nq + p) * xs..(r * nq + p + 1) * xs];
                    for (m, d) in row.iter_mut().enumerate() {
                        let t = (m * st + r) as isize - s.pad as isize;
                        *d = if t >= 0 && (t as usize) < len {
                            let t = t as usize;
                            (0..4).filter(|e| 4 * p + e < c_in).fold(0, |w, e| {
                                let ch = 4 * p + e;
                                w | q1(ch, x.data[ch * len + t]) << (8 * e)
                            })
                        } else {
                            pad_word(p)
                        };
                    }
                }
            }
        }
        // Quantize and lay out: xq[p][u] = bytes of channels 4p..4p+4 at time u - pad.
        let dst = SharedMut(xq.as_mut_ptr() as *mut f32);
        pool.run(if st == 1 { nq } else { 0 }, |p0, p1| {
            let dst = dst;
            for p in p0..p1 {
                // SAFETY: row p of xq belongs to this thread alone; it lies inside xq.
                let row =
                    unsafe { std::slice::from_raw_parts_mut((dst.0 as *mut u32).add(p * xs), xs) };
                let t_end = len.min(xs.saturating_sub(s.pad));
                let pw = pad_word(p);
                row[..s.pad.min(xs)].fill(pw);
                row[s.pad + t_end..].fill(pw);
                let d = &mut row[s.pad..s.pad + t_end];
                if 4 * p >= c_in {
                    // Padding channels: zeros throughout.
                    d.fill(0);
                } else if 4 * p + 4 <= c_in {
                    let src = |e: usize| &x.data[(4 * p + e) * len..(4 * p + e) * len + t_end];
                    let m = [0, 1, 2, 3].map(|e| maps[4 * p + e]);
                    quantize_into(d, [src(0), src(1), src(2), src(3)], m, snake, sx, zx);
                } else {
                    // The last, partial group: channels past c_in stay 0.
                    let zeros = vec![0f32; t_end];
                    let src = |e: usize| {
                        let ch = 4 * p + e;
                        if ch < c_in {
                            &x.data[ch * len..ch * len + t_end]
                        } else {
                            &zeros[..]
                        }
                    };
                    let m = [0, 1, 2, 3].map(|e| maps[(4 * p + e).min(c_in - 1)]);
                    quantize_into(d, [src(0), src(1), src(2), src(3)], m, snake, sx, zx);
                    let keep = (1u64 << (8 * (c_in - 4 * p))) - 1;
                    for v in d.iter_mut() {
                        *v &= keep as u32;
                    }
                }
            }
        });
        let b_off: Vec<usize> = (0..k)
            .map(|j| {
                if st == 1 {
                    j * dil * 4
                } else {
                    ((j % st) * nq * xs + j / st) * 4
                }
            })
            .collect();
        let kk = (c_in * k) as i32;
        let zxi = zx as i32;
        // Per output channel: scale a[o] and the constant part of the sum.
        let a_o: Vec<f32> = w.w_scale.iter().map(|&v| v * sx).collect();
        let c_o: Vec<i32> = (0..c_out)
            .map(|o| kk * zxi * w.w_zero[o] - zxi * w.w_sum[o])
            .collect();
        let out_p = SharedMut(out.data.as_mut_ptr());
        let xq = &*xq;
        pool.run_aligned(lo, NB, |t0, t1| {
            let out_p = out_p;
            // Sx[t] = Σ_j colsum[t st + j dil] for this thread's t0..t1, colsum[v] = Σ_i
            // xq[i][v] over padded positions v in v0..v1.
            let (v0, v1) = (t0 * st, (t1 - 1) * st + (k - 1) * dil + 1);
            let mut colsum = vec![0i32; v1 - v0];
            if st == 1 {
                for p in 0..nq {
                    byte_sums(&mut colsum, &xq[p * xs + v0..p * xs + v1]);
                }
            } else {
                let mut phase = Vec::new();
                for r in 0..st {
                    // Positions v = m st + r in v0..v1.
                    let (m0, m1) = ((v0 + st - 1 - r) / st, (v1 + st - 1 - r) / st);
                    if m1 <= m0 {
                        continue;
                    }
                    phase.clear();
                    phase.resize(m1 - m0, 0);
                    for p in 0..nq {
                        let at = (r * nq + p) * xs;
                        byte_sums(&mut phase, &xq[at + m0..at + m1]);
                    }
                    for (m, &c) in (m0..m1).zip(&phase) {
                        colsum[m * st + r - v0] = c;
                    }
                }
            }
            let sxt: Vec<i32> = (t0..t1)
                .map(|t| (0..k).map(|j| colsum[t * st + j * dil - v0]).sum())
                .collect();
            let mut blk = BlockI32::default();
            let amx_tiles = w.isa == Isa::Amx;
            // The vector kernels' sums are 128 Sx short (their weight is wq - 128).
            let zw_of = |o: usize| w.w_zero[o] - if amx_tiles { 0 } else { 128 };
            let eb = w.isa.weight_bytes();
            if amx_tiles {
                // SAFETY: AMX checked by isa() (the weight was packed for it only then).
                unsafe { amx::tiles_on() };
            }
            for c0 in (t0..t1).step_by(CHUNK) {
                let c1 = (c0 + CHUNK).min(t1);
                for ob in 0..op / MB {
                    for tb in (c0..c1).step_by(NB) {
                        // Groups past c_in are zeros: the vector kernels leave them out.
                        let rows = (c_out - ob * MB).min(MB);
                        let nq = c_in.div_ceil(4);
                        // SAFETY: A rows ob*32..+32 of every tap lie in w.a (op rows of cp
                        // values per tap); B rows 0..nq, columns tb..tb+32+(k-1)dil lie in
                        // xq (xs >= round_up(lo, 32) + (k-1) dil); the kernel is the one the
                        // weight was packed for, whose features isa() checked.
                        unsafe {
                            let a = w.a.as_ptr().add(ob * MB * cp * eb);
                            let b = (xq.as_ptr() as *const u8).add(tb * 4);
                            let (lda, a_tap, ldb) = (cp * eb, op * cp * eb, xs * 4);
                            match w.isa {
                                Isa::Amx => amx::conv_block_u8(
                                    a,
                                    lda,
                                    a_tap,
                                    b,
                                    ldb,
                                    &b_off,
                                    cp / KC,
                                    &mut blk,
                                ),
                                isa => vector_block(isa)(
                                    a, lda, a_tap, b, ldb, &b_off, nq, rows, &mut blk,
                                ),
                            }
                        };
                        let nt = (c1 - tb).min(NB);
                        for r in 0..MB {
                            let o = ob * MB + r;
                            if o >= c_out {
                                break;
                            }
                            // SAFETY: columns tb..tb+nt of row o are this thread's (its range
                            // of output positions) and lie inside out (checked above).
                            let dst = unsafe {
                                std::slice::from_raw_parts_mut(out_p.0.add(o * lo + tb), nt)
                            };
                            finish(
                                dst,
                                &blk.0[r * NB..r * NB + nt],
                                &sxt[tb - t0..tb - t0 + nt],
                                a_o[o],
                                c_o[o],
                                zw_of(o),
                                bias_of(o),
                                acc,
                            );
                        }
                    }
                }
            }
            if amx_tiles {
                // SAFETY: as above.
                unsafe { amx::tiles_off() };
            }
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift32 values from `seed`.
    fn rng(mut seed: u32) -> impl FnMut() -> u32 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        }
    }

    /// A random integer convolution: uint8 weights with their zero points and scales (one, or
    /// one per output channel) and an f32 input around zero.
    struct Case {
        s: Conv1dShape,
        q: Vec<u8>,
        zero: Vec<i32>,
        scale: Vec<f32>,
        nz: usize,
        xv: Vec<f32>,
    }

    impl Case {
        /// (c_in, c_out, len_in, k, stride, pad, dilation, per-channel grids)
        #[allow(clippy::type_complexity)]
        fn random(
            rnd: &mut impl FnMut() -> u32,
            (c_in, c_out, len_in, k, stride, pad, dilation, per_channel): (
                usize,
                usize,
                usize,
                usize,
                usize,
                usize,
                usize,
                bool,
            ),
        ) -> Case {
            let s = Conv1dShape {
                c_in,
                c_out,
                len_in,
                k,
                stride,
                pad,
                dilation,
                groups: 1,
                output_pad: 0,
            };
            let q: Vec<u8> = (0..c_out * c_in * k).map(|_| rnd() as u8).collect();
            let nz = if per_channel { c_out } else { 1 };
            let zero: Vec<i32> = (0..nz).map(|_| (rnd() % 256) as i32).collect();
            let scale: Vec<f32> = (0..nz)
                .map(|_| 1e-3 + (rnd() % 100) as f32 * 1e-4)
                .collect();
            let xv: Vec<f32> = (0..c_in * len_in)
                .map(|_| (rnd() % 2001) as f32 / 1000.0 - 0.7)
                .collect();
            Case {
                s,
                q,
                zero,
                scale,
                nz,
                xv,
            }
        }
    }

    /// Against the direct f32 form on the dequantized weight and the rounded input, with
    /// padding, dilation, tails of both tile dimensions and per-channel weight grids.
    #[test]
    fn matches_direct_on_the_rounded_input() {
        if isa().is_none() {
            eprintln!("no integer convolution kernel (AMX, AVX-512 VNNI, AVX2) here: skipped");
            return;
        }
        let pool = Pool::new(2);
        let mut rnd = rng(0x1234_5678);
        for case in [
            (22, 40, 100, 3, 1, 1, 1, false),
            (70, 33, 75, 7, 1, 9, 3, true),
            (128, 64, 64, 11, 1, 25, 5, false),
            (5, 32, 40, 1, 1, 0, 1, true),
            (22, 64, 250, 12, 6, 3, 1, false),
            (9, 40, 101, 3, 2, 1, 1, true),
        ] {
            let Case {
                s,
                q,
                zero,
                scale,
                nz,
                xv,
            } = Case::random(&mut rnd, case);
            let Conv1dShape {
                c_in,
                c_out,
                len_in,
                k,
                ..
            } = s;
            let w = pack(&q, &zero, &scale, &s).unwrap();
            let wf: Vec<f32> = (0..q.len())
                .map(|i| {
                    let o = i / (c_in * k);
                    let (z, sc) = (zero[o % nz], scale[o % nz]);
                    (q[i] as i32 - z) as f32 * sc
                })
                .collect();
            let mut xr = CpuTensor {
                data: xv.clone(),
                cols: len_in,
            };
            super::super::signal::fake_quant_u8(&mut xr, c_in * len_in);
            let b = CpuTensor {
                data: (0..c_out).map(|o| o as f32 * 0.01).collect(),
                cols: c_out,
            };
            let lo = s.len_out();
            let wt = CpuTensor { data: wf, cols: k };
            let mut want = CpuTensor {
                data: vec![0.0; c_out * lo],
                cols: lo,
            };
            super::super::conv1d_nc::conv1d_direct(&pool, &xr, &wt, Some(&b), s, &mut want);
            let mut got = CpuTensor {
                data: vec![f32::NAN; c_out * lo],
                cols: lo,
            };
            let x = CpuTensor {
                data: xv,
                cols: len_in,
            };
            conv1d(&pool, &x, &w, Some(&b), s, None, false, &mut got);
            for (i, (&u, &v)) in got.data.iter().zip(&want.data).enumerate() {
                assert!(
                    (u - v).abs() <= 1e-4 * (1.0 + v.abs()),
                    "{s:?} at {i}: {u} vs {v}"
                );
            }
        }
    }

    /// The vector blocks against plain integer sums, wherever each runs (on AMX machines
    /// too, where `conv1d` takes the tiles): signed weight bytes, unsigned input bytes, two
    /// taps at different offsets, 13, 16 or 1 groups of 4 channels, 19, 32 or 3 live rows
    /// of 32 (the rest zeroed).
    #[test]
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn vector_blocks_equal_integer_sums() {
        type Block = BlockFn;
        // (name, present here, kernel, bytes a weight value, rows computed in steps of,
        // weight in row pairs)
        #[cfg(target_arch = "x86_64")]
        let kernels: [(&str, bool, Block, usize, usize, bool); 3] = [
            (
                "avx512-vnni",
                vnni::available(),
                vnni::conv_block,
                1,
                8,
                false,
            ),
            ("avx-vnni", vex::available(), vex::conv_block, 1, 2, false),
            ("avx2", wide::available(), wide::conv_block, 2, 2, false),
        ];
        #[cfg(target_arch = "aarch64")]
        let kernels: [(&str, bool, Block, usize, usize, bool); 2] = [
            (
                "neon-dotprod",
                dotprod::available(),
                dotprod::conv_block,
                1,
                2,
                false,
            ),
            ("neon-i8mm", i8mm::available(), i8mm::conv_block, 1, 8, true),
        ];
        #[cfg(target_arch = "x86_64")]
        assert!(
            !std::is_x86_feature_detected!("avx2") || wide::available(),
            "AVX2 machine without the AVX2 block"
        );
        for (name, present, kernel, eb, step, pairs) in kernels {
            if !present {
                eprintln!("{name} not available here: not tested");
                continue;
            }
            let mut seed = 0x9e37_79b9u32;
            let mut rnd = move || {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                seed
            };
            for (nq, rows) in [(13usize, 19usize), (16, 32), (1, 3)] {
                let lda = 64 * eb;
                let a_tap = MB * lda;
                let ldb = 4 * 80; // 80 words a channel group
                let b_off = [0usize, 4 * 7];
                // Weights -128..=127 (as VNNI's bytes and AVX2's i16 values hold them).
                let w: Vec<i8> = (0..b_off.len() * MB * 64).map(|_| rnd() as i8).collect();
                let a: Vec<u8> = match (eb, pairs) {
                    (1, false) => w.iter().map(|&v| v as u8).collect(),
                    (1, true) => {
                        // Row pairs: per 8 values, row 2i's 8 bytes, then row 2i + 1's.
                        let mut a = vec![0u8; w.len()];
                        for (at, &v) in w.iter().enumerate() {
                            let (row, e) = (at / 64, at % 64);
                            let pair = (row - row % 2) * 64;
                            a[pair + (e / 8) * 16 + (row % 2) * 8 + e % 8] = v as u8;
                        }
                        a
                    }
                    _ => w.iter().flat_map(|&v| (v as i16).to_le_bytes()).collect(),
                };
                let b: Vec<u8> = (0..nq * ldb).map(|_| rnd() as u8).collect();
                let mut blk = BlockI32::default();
                blk.0.fill(i32::MIN);
                // SAFETY: the kernel is available; the rows read lie in a (32 rows of 64 values
                // a tap) and b (13 rows of 80 words, 32 words from offsets 0 and 7).
                unsafe {
                    kernel(
                        a.as_ptr(),
                        lda,
                        a_tap,
                        b.as_ptr(),
                        ldb,
                        &b_off,
                        nq,
                        rows,
                        &mut blk,
                    )
                };
                for r in 0..MB {
                    for t in 0..NB {
                        let want: i32 = if r >= rows.next_multiple_of(step) {
                            0
                        } else {
                            let mut acc = 0i32;
                            for (j, &bo) in b_off.iter().enumerate() {
                                for p in 0..nq {
                                    for e in 0..4 {
                                        let w = w[(j * MB + r) * 64 + 4 * p + e] as i32;
                                        let x = b[bo + p * ldb + 4 * t + e] as i32;
                                        acc += w * x;
                                    }
                                }
                            }
                            acc
                        };
                        assert_eq!(
                            blk.0[r * NB + t],
                            want,
                            "{name}: {nq} groups, {rows} rows: row {r} column {t}"
                        );
                    }
                }
            }
        }
    }

    /// Every integer kernel this CPU has, through the whole `conv1d`, against the scalar
    /// integer form of the same arithmetic, bit for bit: sums Σ (xq - zx)(wq - zw) exact in
    /// i32 (padding holds zx), scaled as the epilogue does (sx sw[o] · sum + bias in f32, no
    /// FMA). Channels and rows off every kernel's multiples (odd channel groups for i8mm's
    /// pairs), k = 1, strides with and without taps past the stride, dilation, lengths past
    /// a block and a thread's chunk, per-tensor and per-channel weight grids.
    #[test]
    fn every_kernel_equals_the_integer_sums() {
        let here = isas();
        if here.is_empty() {
            eprintln!("no integer convolution kernel here: skipped");
            return;
        }
        eprintln!("integer convolution kernels: {:?}", kernel_names());
        let pool = Pool::new(3);
        let mut rnd = rng(0x0bad_5eed);
        for case in [
            (3, 5, 37, 3, 1, 1, 1, false),
            (13, 33, 70, 1, 1, 0, 1, true),
            (37, 9, 300, 5, 1, 6, 3, false),
            (70, 40, 101, 3, 2, 1, 1, true),
            (22, 17, 250, 12, 6, 3, 1, true),
            (4, 64, 45, 7, 3, 2, 1, false),
            (65, 31, 700, 2, 1, 0, 1, true),
            (8, 2, 9, 4, 1, 3, 2, false),
        ] {
            let Case {
                s,
                q,
                zero,
                scale,
                nz,
                xv,
            } = Case::random(&mut rnd, case);
            let Conv1dShape {
                c_in,
                c_out,
                len_in,
                k,
                stride,
                pad,
                dilation,
                ..
            } = s;
            let bias: Vec<f32> = (0..c_out).map(|o| o as f32 * 0.01 - 0.1).collect();
            // The input's grid as `conv1d` takes it (DynamicQuantizeLinear).
            let (l, h) = xv
                .iter()
                .fold((0f32, 0f32), |(l, h), &v| (l.min(v), h.max(v)));
            let sx = (h - l) / 255.0;
            let zx = (-l / sx).round_ties_even().clamp(0.0, 255.0);
            let xq: Vec<i32> = xv.iter().map(|&v| q8(v, sx, zx) as i32).collect();
            let lo = s.len_out();
            let mut want = vec![0f32; c_out * lo];
            for o in 0..c_out {
                let (zw, sw) = (zero[o % nz], scale[o % nz]);
                for t in 0..lo {
                    let mut sum = 0i32;
                    for i in 0..c_in {
                        for j in 0..k {
                            let u = (t * stride + j * dilation) as isize - pad as isize;
                            let xd = if u >= 0 && (u as usize) < len_in {
                                xq[i * len_in + u as usize] - zx as i32
                            } else {
                                0
                            };
                            sum += xd * (q[(o * c_in + i) * k + j] as i32 - zw);
                        }
                    }
                    want[o * lo + t] = sw * sx * sum as f32 + bias[o];
                }
            }
            let x = CpuTensor {
                data: xv,
                cols: len_in,
            };
            let b = CpuTensor {
                data: bias,
                cols: c_out,
            };
            for &isa in &here {
                let w = pack_for(isa, &q, &zero, &scale, &s).unwrap();
                let mut got = CpuTensor {
                    data: vec![f32::NAN; c_out * lo],
                    cols: lo,
                };
                conv1d(&pool, &x, &w, Some(&b), s, None, false, &mut got);
                for (i, (&u, &v)) in got.data.iter().zip(&want).enumerate() {
                    assert_eq!(
                        u.to_bits(),
                        v.to_bits(),
                        "{} {s:?} at ({}, {}): {u} vs {v}",
                        isa.name(),
                        i / lo,
                        i % lo
                    );
                }
            }
        }
    }

    /// With AdaIN and Snake folded in and the result added to out: against the ops one by
    /// one (ada_in_row, snake_row, rounding, the direct form, a sum).
    #[test]
    fn folded_ada_in_snake_matches_the_ops() {
        if isa().is_none() {
            eprintln!("no integer convolution kernel (AMX, AVX-512 VNNI, AVX2) here: skipped");
            return;
        }
        let pool = Pool::new(2);
        let mut seed = 0x2468_ace1u32;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        let (c_in, c_out, len, k, dil) = (36, 40, 300, 7, 3);
        let s = Conv1dShape {
            c_in,
            c_out,
            len_in: len,
            k,
            stride: 1,
            pad: 9,
            dilation: dil,
            groups: 1,
            output_pad: 0,
        };
        let q: Vec<u8> = (0..c_out * c_in * k).map(|_| rnd() as u8).collect();
        let (zero, scale) = ([131], [2e-3]);
        let w = pack(&q, &zero, &scale, &s).unwrap();
        let wf: Vec<f32> = q.iter().map(|&v| (v as i32 - 131) as f32 * 2e-3).collect();
        let xv: Vec<f32> = (0..c_in * len)
            .map(|i| (rnd() % 2001) as f32 / 400.0 - 2.0 + (i / len) as f32 * 0.1)
            .collect();
        let gb: Vec<f32> = (0..2 * c_in)
            .map(|_| (rnd() % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let alpha: Vec<f32> = (0..c_in)
            .map(|_| 0.2 + (rnd() % 100) as f32 * 0.02)
            .collect();
        let mut map = Vec::new();
        let mut xr = xv.clone();
        for ch in 0..c_in {
            let (g, b) = (1.0 + gb[ch], gb[c_in + ch]);
            let r = &mut xr[ch * len..(ch + 1) * len];
            map.extend(vmath::ada_in_map(r, g, b, 1e-5));
            vmath::ada_in_row(r, g, b, 1e-5);
            vmath::snake_row(r, alpha[ch]);
        }
        let mut xr = CpuTensor {
            data: xr,
            cols: len,
        };
        super::super::signal::fake_quant_u8(&mut xr, c_in * len);
        let lo = s.len_out();
        let base: Vec<f32> = (0..c_out * lo).map(|i| (i % 7) as f32 * 0.25).collect();
        let mut want = CpuTensor {
            data: vec![0.0; c_out * lo],
            cols: lo,
        };
        let wt = CpuTensor { data: wf, cols: k };
        super::super::conv1d_nc::conv1d_direct(&pool, &xr, &wt, None, s, &mut want);
        for (v, b) in want.data.iter_mut().zip(&base) {
            *v += b;
        }
        let mut got = CpuTensor {
            data: base,
            cols: lo,
        };
        let x = CpuTensor {
            data: xv,
            cols: len,
        };
        let pre = Pre {
            map: &map,
            alpha: Some(&alpha),
        };
        conv1d(&pool, &x, &w, None, s, Some(pre), true, &mut got);
        for (i, (&u, &v)) in got.data.iter().zip(&want.data).enumerate() {
            assert!(
                (u - v).abs() <= 1e-4 * (1.0 + v.abs()),
                "at {i}: {u} vs {v}"
            );
        }
    }
}
