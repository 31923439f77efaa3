// Prepended to every kiln WGSL module (shaders.rs `source`). Every dispatch gets 32 u32
// parameters at a dynamic offset of one uniform buffer (binding 0); storage buffers follow
// from binding 1, all `read_write` (a buffer may be bound twice in one dispatch).
//
// (32 parameter words: `P(i)`.)
//
// Two reductions: `gsum` sums over a row group. With subgroups (the SUBGROUP variant of this
// file) a row group is one subgroup of any size; without, a group is 32 invocations and the
// sum goes through workgroup memory. `wsum`/`wmax` reduce over the whole workgroup (256).

const WG: u32 = 256u;
const NEG_INF: f32 = -3.402823466e38;

const FMT_F32: u32 = 0u;
const FMT_F16: u32 = 1u;
const FMT_Q4_0: u32 = 2u;
const FMT_Q4_1: u32 = 3u;
const FMT_Q8_0: u32 = 4u;
const FMT_Q4_K: u32 = 5u;
const FMT_Q6_K: u32 = 6u;

struct Params { v: array<vec4<u32>, 8> }
@group(0) @binding(0) var<uniform> prm: Params;

fn P(i: u32) -> u32 { return prm.v[i >> 2u][i & 3u]; }
fn PF(i: u32) -> f32 { return bitcast<f32>(P(i)); }

var<workgroup> red: array<f32, 256>;

// Sum (max) of v over the 256 invocations; every invocation must call it.
fn wsum(v: f32, li: u32) -> f32 {
    workgroupBarrier();
    red[li] = v;
    for (var s = 128u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if (li < s) { red[li] = red[li] + red[li + s]; }
    }
    workgroupBarrier();
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn wmax(v: f32, li: u32) -> f32 {
    workgroupBarrier();
    red[li] = v;
    for (var s = 128u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if (li < s) { red[li] = max(red[li], red[li + s]); }
    }
    workgroupBarrier();
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn silu(x: f32) -> f32 { return x / (1.0 + exp(-x)); }

fn f16lo(w: u32) -> f32 { return unpack2x16float(w).x; }
fn f16hi(w: u32) -> f32 { return unpack2x16float(w).y; }
// Sign-extended low / high 16 bits.
fn i16lo(w: u32) -> f32 { return f32(bitcast<i32>(w << 16u) >> 16u); }
fn i16hi(w: u32) -> f32 { return f32(bitcast<i32>(w) >> 16u); }
// Byte k of a little-endian word, as signed.
fn i8at(w: u32, k: u32) -> f32 { return f32(bitcast<i32>(w << (24u - 8u * k)) >> 24u); }
// Bytes of a (each below 128: 4- and 6-bit values) dotted with signed bytes of b; signed
// bytes of a dotted with those of b. One dp4a-class instruction where the adapter has
// integer dot products (naga emits OpSDot), a polyfill elsewhere.
fn udot(a: u32, b: u32) -> i32 { return dot4I8Packed(a, b); }
fn sdot(a: u32, b: u32) -> i32 { return dot4I8Packed(a, b); }

// Spreads 4 two-bit fields (bits 0..7 of t) into bits 4..5 of 4 bytes.
fn spread2(t: u32) -> u32 {
    let b = (t & 0x03u) | ((t & 0x0cu) << 6u) | ((t & 0x30u) << 12u) | ((t & 0xc0u) << 18u);
    return b << 4u;
}

