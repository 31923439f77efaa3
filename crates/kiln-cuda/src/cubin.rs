// The kernels' source compiled by NVRTC to a cubin for `arch` (ptxas included), with the
// run-time compile's options. Included by build.rs (kernels built ahead of time) and by
// device.rs's tests (the source assembles for every architecture), not a module of the crate.
fn cubin(source: &str, arch: &str) -> Vec<u8> {
    use cudarc::nvrtc::{result, sys};
    let src = std::ffi::CString::new(source).expect("no NUL in the kernel source");
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
