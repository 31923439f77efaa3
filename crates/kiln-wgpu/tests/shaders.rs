//! Every WGSL module, in both reduction variants, parsed and validated by naga (the version
//! wgpu uses) and translated to Metal Shading Language: the Apple path is compiled on every
//! change, on any host, without a GPU.

use naga::back::msl;
use naga::valid::{Capabilities, ValidationFlags, Validator};

#[test]
fn every_shader_validates_and_translates_to_msl() {
    let mut n = 0;
    for name in kiln_wgpu::shaders::MODULES {
        for subgroups in [false, true] {
            let src = kiln_wgpu::shaders::source(name, subgroups);
            let module = naga::front::wgsl::parse_str(&src).unwrap_or_else(|e| {
                panic!("{name} (subgroups {subgroups}): {}", e.emit_to_string(&src))
            });
            // pack/unpack2x16float (f16 weights and KV cache) are core WGSL; wgpu grants
            // the capability on Vulkan and Metal (downlevel SHADER_F16_IN_F32).
            let mut caps = Capabilities::SHADER_FLOAT16_IN_FLOAT32;
            if subgroups {
                caps |= Capabilities::SUBGROUP;
            }
            let info = Validator::new(ValidationFlags::all(), caps)
                .validate(&module)
                .unwrap_or_else(|e| {
                    panic!("{name} (subgroups {subgroups}): {}", e.emit_to_string(&src))
                });
            let options = msl::Options {
                // Apple silicon's Metal 3 devices (subgroups are simdgroups from 2.1 on).
                lang_version: (2, 4),
                ..Default::default()
            };
            // Pipelines are specialised on weight formats (override constants FMT1..) and
            // matvec on its rows a row group (ROWS): each format's specialisation is
            // translated.
            let names: Vec<String> = module
                .overrides
                .iter()
                .filter_map(|(_, o)| o.name.clone())
                .collect();
            let formats = if names.is_empty() { 0..1 } else { 0..7 };
            for fmt in formats {
                let mut consts = naga::back::PipelineConstants::default();
                for k in &names {
                    // ROWS: the most rows a matrix-vector row group computes together.
                    let v = if k == "ROWS" { 4 } else { fmt };
                    consts.insert(k.clone(), v as f64);
                }
                let (m, i) = naga::back::pipeline_constants::process_overrides(
                    &module, &info, None, &consts,
                )
                .unwrap_or_else(|e| panic!("{name} format {fmt}: {e}"));
                let (out, _) =
                    msl::write_string(&m, &i, &options, &msl::PipelineOptions::default())
                        .unwrap_or_else(|e| panic!("{name} (subgroups {subgroups}) to MSL: {e}"));
                assert!(out.contains("kernel void"), "{name}: no kernel in the MSL");
            }
            n += 1;
        }
    }
    eprintln!("{n} modules validated and translated to MSL (every weight format's specialisation)");
}
