// matvec's prologue variant: X holds the f32 rows x (x_ld apart); every workgroup
// normalises its token's row (flag 2) and quantizes it (flag 4) into workgroup memory,
// as prep.wgsl does (d = max|v| / 127, q = round(v / d)), 4 values per invocation a pass.

const MAXC: u32 = 8192u;

var<workgroup> XQ: array<vec4<u32>, 512>;   // MAXC / 16
var<workgroup> XD: array<f32, 256>;    // MAXC / 32
var<workgroup> XS: array<u32, 256>;
var<workgroup> inv_rms: f32;

fn xraw(t: u32, c: u32) -> f32 { return bitcast<f32>(X[t * P(14u) + c]); }
fn xnorm(t: u32, c: u32, inv: f32) -> f32 {
    if ((P(5u) & 2u) != 0u) { return xraw(t, c) * inv * NW[c]; }
    return xraw(t, c);
}
fn xf(t: u32, c: u32) -> f32 { return xnorm(t, c, inv_rms); }
fn xblock(t: u32, b: u32) -> array<u32, 8> {
    let lo = XQ[2u * b];
    let hi = XQ[2u * b + 1u];
    return array<u32, 8>(lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
}
// Words w and 4 + w of block b's activations (values 4w.. and 16 + 4w..).
fn xpair(t: u32, b: u32, w: u32) -> vec2<u32> {
    return vec2<u32>(XQ[2u * b][w], XQ[2u * b + 1u][w]);
}
fn xd(t: u32, b: u32) -> f32 { return XD[b]; }
fn xs(t: u32, b: u32) -> u32 { return XS[b]; }

fn prologue(li: u32, t: u32) {
    let cols = P(1u);
    var inv = 1.0;
    if ((P(5u) & 2u) != 0u) {
        var ss = 0.0;
        for (var c = li; c < cols; c += WG) { let x = xraw(t, c); ss += x * x; }
        ss = wsum(ss, li);
        inv = 1.0 / sqrt(ss / f32(cols) + PF(15u));
    }
    if (li == 0u) { inv_rms = inv; }
    if ((P(5u) & 4u) != 0u) {
        let words = cols >> 2u;
        for (var w0 = 0u; w0 < words; w0 += WG) {
            let w = w0 + li;
            var v: vec4<f32>;
            if (w < words) {
                for (var k = 0u; k < 4u; k++) { v[k] = xnorm(t, w * 4u + k, inv); }
            }
            let q = quant_word(li, v, w < words);
            if (w < words) {
                XQ[w >> 2u][w & 3u] = q.word;
                if ((li & 7u) == 0u) {
                    XD[w >> 3u] = q.d;
                    XS[w >> 3u] = q.sums;
                }
            }
        }
    }
    workgroupBarrier();
}
