// out[t] = row IDS[ids_off + t] of the table W, dequantized, for the ids in row0..row0 + rows
// (W: those rows; a table held in parts runs once a part). grid (column tiles, tokens).
// params: 0 rows, 1 cols, 2 fmt, 3 rw, 4 ids_off, 5 out_off, 6 row0

@group(0) @binding(1) var<storage, read_write> W: array<u32>;
@group(0) @binding(2) var<storage, read_write> IDS: array<u32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;

@compute @workgroup_size(256)
fn embed(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = wg.y;
    let c = wg.x * WG + li;
    let cols = P(1u);
    if (c >= cols) { return; }
    let g = IDS[P(4u) + t];
    if (g < P(6u) || g - P(6u) >= P(0u)) { return; }
    OUT[P(5u) + t * cols + c] = wval(P(2u), g - P(6u), c, cols, P(3u));
}
