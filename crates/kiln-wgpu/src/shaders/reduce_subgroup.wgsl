// Row groups are subgroups.
struct Lanes { lane: u32, group: u32, groups: u32, width: u32 }
fn lanes(li: u32, sg_lane: u32, sg_size: u32, sg_id: u32, sg_n: u32) -> Lanes {
    return Lanes(sg_lane, sg_id, sg_n, sg_size);
}
fn gsum(v: f32, li: u32) -> f32 { return subgroupAdd(v); }
