//! The WGSL modules, assembled from the files under `shaders/`: every module gets
//! common.wgsl and one of the two row-group reductions (subgroups or workgroup memory);
//! those that read weights get weights.wgsl.

const COMMON: &str = include_str!("shaders/common.wgsl");
const REDUCE_SUBGROUP: &str = include_str!("shaders/reduce_subgroup.wgsl");
const REDUCE_SHARED: &str = include_str!("shaders/reduce_shared.wgsl");
const WEIGHTS: &str = include_str!("shaders/weights.wgsl");

/// Every module: (name, its own file, whether it reads weights).
pub const MODULES: [(&str, &str, bool); 7] = [
    ("matvec", include_str!("shaders/matvec.wgsl"), true),
    ("gemm", include_str!("shaders/gemm.wgsl"), true),
    ("embed", include_str!("shaders/embed.wgsl"), true),
    ("prep", include_str!("shaders/prep.wgsl"), false),
    ("heads", include_str!("shaders/heads.wgsl"), false),
    ("attention", include_str!("shaders/attention.wgsl"), false),
    ("misc", include_str!("shaders/misc.wgsl"), false),
];

/// The full source of `module`, for adapters with (`subgroups`) or without subgroup
/// operations.
pub fn source(module: &str, subgroups: bool) -> String {
    let (_, body, weights) = MODULES
        .iter()
        .find(|m| m.0 == module)
        .unwrap_or_else(|| panic!("no WGSL module '{module}'"));
    let mut s = String::new();
    // (No `enable subgroups;`: naga takes the subgroup builtins from the device's
    // capabilities and rejects the directive.)
    s.push_str(COMMON);
    s.push_str(if subgroups {
        REDUCE_SUBGROUP
    } else {
        REDUCE_SHARED
    });
    if *weights {
        s.push_str(WEIGHTS);
    }
    let (args, call) = if subgroups {
        (
            ", @builtin(subgroup_invocation_id) sg_lane: u32, @builtin(subgroup_size) sg_size: u32, \
             @builtin(subgroup_id) sg_id: u32, @builtin(num_subgroups) sg_n: u32",
            "lanes(li, sg_lane, sg_size, sg_id, sg_n)",
        )
    } else {
        ("", "lanes(li)")
    };
    s.push_str(&body.replace("SG_ARGS", args).replace("LANES_CALL", call));
    s
}
