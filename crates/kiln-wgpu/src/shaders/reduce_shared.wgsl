// Row groups are 32 invocations; sums go through workgroup memory (every invocation calls).
struct Lanes { lane: u32, group: u32, groups: u32, width: u32 }
fn lanes(li: u32) -> Lanes { return Lanes(li & 31u, li >> 5u, WG / 32u, 32u); }
fn gsum(v: f32, li: u32) -> f32 {
    workgroupBarrier();
    red[li] = v;
    for (var s = 16u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if ((li & 31u) < s) { red[li] = red[li] + red[li + s]; }
    }
    workgroupBarrier();
    let r = red[li & ~31u];
    workgroupBarrier();
    return r;
}
