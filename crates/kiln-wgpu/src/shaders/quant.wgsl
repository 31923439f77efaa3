// Activations quantized to int8 blocks of 32 as the CPU backend's (d = max|v| / 127,
// q = round(v / d), ties to even), for the modules that prepend this file (prep, and
// matvec's fused prologue): 8 consecutive invocations hold a block's 8 words.

var<workgroup> tmp_a: array<f32, 256>;
var<workgroup> tmp_s: array<i32, 256>;

// A word of 4 int8 values, its block's scale, and (valid on the block's first invocation)
// the block's two half sums as i16 in one word.
struct QWord { word: u32, d: f32, sums: u32 }

// Invocation li's 4 values v (`live` false past the row: they take no part). Every
// invocation calls it (barriers).
fn quant_word(li: u32, v: vec4<f32>, live: bool) -> QWord {
    var am = 0.0;
    if (live) { am = max(max(abs(v.x), abs(v.y)), max(abs(v.z), abs(v.w))); }
    tmp_a[li] = am;
    workgroupBarrier();
    let g0 = li & ~7u;
    var amax = 0.0;
    for (var k = 0u; k < 8u; k++) { amax = max(amax, tmp_a[g0 + k]); }
    let d = amax / 127.0;
    var id = 0.0;
    if (d > 0.0) { id = 1.0 / d; }
    var word = 0u;
    var s = 0;
    if (live) {
        for (var k = 0u; k < 4u; k++) {
            let q = i32(clamp(round(v[k] * id), -127.0, 127.0));
            word = word | ((bitcast<u32>(q) & 0xffu) << (8u * k));
            s += q;
        }
    }
    tmp_s[li] = s;
    workgroupBarrier();
    var sums = 0u;
    if ((li & 7u) == 0u) {
        let s0 = tmp_s[li] + tmp_s[li + 1u] + tmp_s[li + 2u] + tmp_s[li + 3u];
        let s1 = tmp_s[li + 4u] + tmp_s[li + 5u] + tmp_s[li + 6u] + tmp_s[li + 7u];
        sums = (bitcast<u32>(s0) & 0xffffu) | (bitcast<u32>(s1) << 16u);
    }
    workgroupBarrier();
    return QWord(word, d, sums);
}
