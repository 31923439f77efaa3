// matvec's variant over prep.wgsl's activations in X: int8 words of token t from
// t * cols / 4, block scales from d_off, half sums from s_off, f32 rows from f_off.

fn xblock(t: u32, b: u32) -> array<u32, 8> {
    let o = t * (P(1u) >> 2u) + b * 8u;
    return array<u32, 8>(X[o], X[o + 1u], X[o + 2u], X[o + 3u],
                         X[o + 4u], X[o + 5u], X[o + 6u], X[o + 7u]);
}
// Words w and 4 + w of block b's activations (values 4w.. and 16 + 4w..).
fn xpair(t: u32, b: u32, w: u32) -> vec2<u32> {
    let o = t * (P(1u) >> 2u) + b * 8u + w;
    return vec2<u32>(X[o], X[o + 4u]);
}
fn xd(t: u32, b: u32) -> f32 { return bitcast<f32>(X[P(8u) + t * (P(1u) >> 5u) + b]); }
fn xs(t: u32, b: u32) -> u32 { return X[P(9u) + t * (P(1u) >> 5u) + b]; }
fn xf(t: u32, c: u32) -> f32 { return bitcast<f32>(X[P(10u) + t * P(1u) + c]); }
fn prologue(li: u32, t: u32) {}
