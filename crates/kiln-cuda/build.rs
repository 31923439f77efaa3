//! Kernels built ahead of time: with `KILN_CUDA_ARCHS` set (for example `sm_90` or
//! `sm_80,sm_86,sm_89,sm_90`), the kernels are compiled here with NVRTC to one cubin per
//! architecture and embedded in the binary, so a first `--device cuda` run on such a GPU loads
//! them at once instead of compiling for tens of seconds. Unset: nothing is embedded and
//! every architecture takes the run-time path (compiled once with NVRTC, kept in the cache).
//! The kernels' one source is assembled here for both (`aot::SOURCE` in `src/device.rs`,
//! whose run-time compile takes the same options).

use std::path::PathBuf;

/// The files of src/kernels, one after the other in the source (each uses only what the files
/// before it define).
const FILES: [&str; 10] = [
    "common.cu",
    "products.cu",
    "rows.cu",
    "attention.cu",
    "flash.cu",
    "decode_mma.cu",
    "gemm.cu",
    "elementwise.cu",
    "speech.cu",
    "signal.cu",
];

fn main() {
    println!("cargo:rerun-if-env-changed=KILN_CUDA_ARCHS");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/cubin.rs");
    for f in FILES {
        println!("cargo:rerun-if-changed=src/kernels/{f}");
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let archs = std::env::var("KILN_CUDA_ARCHS").unwrap_or_default();
    let archs: Vec<&str> = archs
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    // The kernels' one source, for the run-time compile too (device.rs `SOURCE`).
    let source: String = FILES
        .iter()
        .map(|f| std::fs::read_to_string(format!("src/kernels/{f}")).expect("kernel source"))
        .collect();
    let source_path = out.join("kernels.cu");
    std::fs::write(&source_path, &source).expect("write kernels.cu");
    let mut table = format!(
        "/// The kernels' source: src/kernels/*.cu in order.\n\
         pub(crate) const SOURCE: &str = include_str!({:?});\n",
        source_path.display().to_string()
    );
    table.push_str("/// Cubins built ahead of time: (architecture, image).\n");
    table.push_str("pub(crate) static AOT: &[(&str, &[u8])] = &[\n");
    if !archs.is_empty() {
        // SAFETY: a check of whether the library loads; nothing else.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            panic!(
                "KILN_CUDA_ARCHS is set but libnvrtc cannot be loaded: put the CUDA toolkit's \
                 (or the nvidia-cuda-nvrtc wheel's) lib directory on LD_LIBRARY_PATH, or unset \
                 KILN_CUDA_ARCHS to compile at run time"
            );
        }
        for arch in archs {
            assert!(
                arch.starts_with("sm_") && arch[3..].chars().all(|c| c.is_ascii_digit()),
                "KILN_CUDA_ARCHS: '{arch}' is not an architecture like sm_90"
            );
            let image = cubin(&source, arch);
            let path = out.join(format!("kernels-{arch}.cubin"));
            std::fs::write(&path, image).expect("write the cubin");
            table.push_str(&format!(
                "    ({arch:?}, include_bytes!({:?})),\n",
                path.display().to_string()
            ));
        }
    }
    table.push_str("];\n");
    std::fs::write(out.join("aot.rs"), table).expect("write aot.rs");
}

// `cubin(source, arch)`: the kernels for `arch` as a cubin, with the run-time compile's
// options (shared with device.rs's test that they assemble for every architecture).
include!("src/cubin.rs");
