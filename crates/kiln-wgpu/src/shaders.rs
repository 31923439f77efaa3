//! The WGSL modules, assembled from the files under `shaders/`: every module gets
//! common.wgsl and one of the two row-group reductions (subgroups or workgroup memory);
//! those that read weights get weights.wgsl once per weight buffer they bind (W, W2, W3);
//! prep and matvec's fused prologue share quant.wgsl, heads and attention head_row.wgsl.

const COMMON: &str = include_str!("shaders/common.wgsl");
const REDUCE_SUBGROUP: &str = include_str!("shaders/reduce_subgroup.wgsl");
const REDUCE_SHARED: &str = include_str!("shaders/reduce_shared.wgsl");
const WEIGHTS: &str = include_str!("shaders/weights.wgsl");
const MATVEC: &str = include_str!("shaders/matvec.wgsl");
const MATVEC_FUSED: &str = include_str!("shaders/matvec_fused.wgsl");
const MATVEC_GLOBAL: &str = include_str!("shaders/matvec_global.wgsl");
const MATVEC_ROW: &str = include_str!("shaders/matvec_row.wgsl");
const HEAD_ROW: &str = include_str!("shaders/head_row.wgsl");
const QUANT: &str = include_str!("shaders/quant.wgsl");

/// matvec.wgsl with its variant and one row dot per weight buffer.
fn matvec(variant: &str) -> String {
    let rows: String = [("", "1"), ("2", "2"), ("3", "3")]
        .iter()
        .map(|(w, s)| {
            MATVEC_ROW
                .replace("rows_dot_S(", &format!("rows_dot{s}("))
                .replace("wval_W(", &format!("wval{w}("))
                .replace("block_dot_W(", &format!("block_dot{w}("))
                .replace("q4_quarter_W(", &format!("q4_quarter{w}("))
        })
        .collect();
    MATVEC
        .replace("VARIANT", variant)
        .replace("ROW_DOTS", &rows)
}

/// Every module's name.
pub const MODULES: [&str; 10] = [
    "matvec",
    "matvec_g",
    "gemm",
    "embed",
    "prep",
    "heads",
    "attention",
    "misc",
    "speech",
    "signal",
];

/// Row values the fused matvec prologue holds (matvec_fused.wgsl MAXC).
pub const MATVEC_MAXC: usize = 8192;

/// A module's own source and the weight buffers it reads (`W`, then `W2`).
fn body(module: &str) -> (String, &'static [(&'static str, &'static str)]) {
    const ONE: &[(&str, &str)] = &[("W", "")];
    const THREE: &[(&str, &str)] = &[("W", ""), ("W2", "2"), ("W3", "3")];
    match module {
        "matvec" => (matvec(&(QUANT.to_string() + MATVEC_FUSED)), THREE),
        "matvec_g" => (matvec(MATVEC_GLOBAL), THREE),
        "gemm" => (include_str!("shaders/gemm.wgsl").into(), ONE),
        "embed" => (include_str!("shaders/embed.wgsl").into(), ONE),
        "prep" => (QUANT.to_string() + include_str!("shaders/prep.wgsl"), &[]),
        "heads" => (
            HEAD_ROW.to_string() + include_str!("shaders/heads.wgsl"),
            &[],
        ),
        "attention" => (
            HEAD_ROW.to_string() + include_str!("shaders/attention.wgsl"),
            &[],
        ),
        "misc" => (include_str!("shaders/misc.wgsl").into(), &[]),
        "speech" => (include_str!("shaders/speech.wgsl").into(), &[]),
        "signal" => (include_str!("shaders/signal.wgsl").into(), &[]),
        other => panic!("no WGSL module '{other}'"),
    }
}

/// The full source of `module`, for adapters with (`subgroups`) or without subgroup
/// operations.
pub fn source(module: &str, subgroups: bool) -> String {
    let (own, weights) = body(module);
    // (No `enable subgroups;`: naga takes the subgroup builtins from the device's
    // capabilities and rejects the directive.)
    let mut s = String::from(COMMON);
    s.push_str(if subgroups {
        REDUCE_SUBGROUP
    } else {
        REDUCE_SHARED
    });
    for (buf, suffix) in weights {
        s.push_str(
            &WEIGHTS
                .replace("WB[", &format!("{buf}["))
                .replace("_S(", &format!("{suffix}(")),
        );
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
    s.push_str(&own.replace("SG_ARGS", args).replace("LANES_CALL", call));
    s
}
