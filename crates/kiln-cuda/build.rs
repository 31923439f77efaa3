//! Kernels built ahead of time: with `KILN_CUDA_ARCHS` set (for example `sm_90` or
//! `sm_80,sm_86,sm_89,sm_90`), the kernels are compiled here with NVRTC to one cubin per
//! architecture and embedded in the binary, so a first `--device cuda` run on such a GPU loads
//! them at once instead of compiling for tens of seconds. Unset: nothing is embedded and
//! every architecture takes the run-time path (compiled once with NVRTC, kept in the cache).
//! The kernels' one source is assembled here for both (`aot::SOURCE` in `src/device.rs`,
//! whose run-time compile takes the same options).

use std::ffi::CString;
use std::path::PathBuf;

/// The files of src/kernels, one after the other in the source (each uses only what the files
/// before it define).
const FILES: [&str; 9] = [
    "common.cu",
    "products.cu",
    "rows.cu",
    "attention.cu",
    "flash.cu",
    "gemm.cu",
    "elementwise.cu",
    "speech.cu",
    "signal.cu",
];

fn main() {
    println!("cargo:rerun-if-env-changed=KILN_CUDA_ARCHS");
    println!("cargo:rerun-if-changed=build.rs");
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
            let cubin = compile(&source, arch);
            let path = out.join(format!("kernels-{arch}.cubin"));
            std::fs::write(&path, cubin).expect("write the cubin");
            table.push_str(&format!(
                "    ({arch:?}, include_bytes!({:?})),\n",
                path.display().to_string()
            ));
        }
    }
    table.push_str("];\n");
    std::fs::write(out.join("aot.rs"), table).expect("write aot.rs");
}

/// The kernels for `arch` as a cubin, with the run-time compile's options.
fn compile(source: &str, arch: &str) -> Vec<u8> {
    use cudarc::nvrtc::{result, sys};
    let src = CString::new(source).expect("no NUL in the kernel source");
    let opts = [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
    ];
    let prog = result::create_program(&src, None).expect("nvrtcCreateProgram");
    // SAFETY: `prog` was just created and is destroyed below, once.
    unsafe {
        if let Err(e) = result::compile_program(prog, &opts) {
            let log = result::get_program_log(prog).unwrap_or_default();
            let log: String = log.iter().map(|&c| c as u8 as char).collect();
            panic!("compiling the kernels for {arch}: {e:?}\n{log}");
        }
        let mut size = 0usize;
        sys::nvrtcGetCUBINSize(prog, &mut size)
            .result()
            .expect("nvrtcGetCUBINSize");
        let mut cubin = vec![0u8; size];
        sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut _)
            .result()
            .expect("nvrtcGetCUBIN");
        result::destroy_program(prog).expect("nvrtcDestroyProgram");
        cubin
    }
}
