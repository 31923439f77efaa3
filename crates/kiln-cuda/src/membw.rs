//! The device memory's read bandwidth, for `kiln bench --membw`: what a decode row's
//! effective GB/s is measured against.

use std::ffi::c_void;
use std::time::Instant;

use cudarc::driver::result;

use crate::device::DevBuf;
use crate::CudaBackend;

/// Bytes the probe reads at most: 2 GiB (about a millisecond on an H100 or H200), less where
/// a quarter of the free device memory is less.
const PROBE_BYTES: usize = 2 << 30;

/// Passes over the buffer a timing takes (one synchronization at the end).
const PASSES: usize = 10;

impl CudaBackend {
    /// The device memory's read bandwidth in bytes a second: the best of `reps` timings of
    /// [`PASSES`] passes of kernels/elementwise.cu read_probe over a zeroed buffer of up to
    /// [`PROBE_BYTES`] (freed before this returns).
    pub fn read_bandwidth(&self, reps: usize) -> Result<f64, String> {
        let (free, _) = result::mem_get_info().map_err(|e| format!("CUDA: {e:?}"))?;
        let bytes = PROBE_BYTES.min(free / 4) / (1 << 20) * (1 << 20);
        if bytes == 0 {
            return Err("CUDA: too little free device memory to measure its bandwidth".into());
        }
        let buf = DevBuf::try_alloc(bytes).map_err(|e| format!("CUDA: {e:?}"))?;
        let out = DevBuf::try_alloc(4).map_err(|e| format!("CUDA: {e:?}"))?;
        self.dev.memset_u32(buf.ptr, 0, bytes / 4);
        let f = self.dev.func("read_probe");
        let (mut p, mut n, mut never, mut o) = (buf.ptr, bytes / 16, 1u32, out.ptr);
        let mut args: [*mut c_void; 4] = [
            (&mut p as *mut u64).cast(),
            (&mut n as *mut usize).cast(),
            (&mut never as *mut u32).cast(),
            (&mut o as *mut u64).cast(),
        ];
        let grid = (8 * self.dev.num_sms as u32, 1, 1);
        let mut pass = || {
            for _ in 0..PASSES {
                self.dev.launch(f, grid, (256, 1, 1), 0, &mut args);
            }
            self.dev.sync().map_err(|e| format!("CUDA: {e:?}"))
        };
        // A warm-up, then the timings.
        pass()?;
        let mut best = f64::INFINITY;
        for _ in 0..reps.max(1) {
            let t0 = Instant::now();
            pass()?;
            best = best.min(t0.elapsed().as_secs_f64());
        }
        Ok((bytes * PASSES) as f64 / best)
    }
}

#[cfg(test)]
mod tests {
    /// The probe reads at a rate a GPU's memory can have (its buffer zeroed, so what it
    /// measures is reads, not a stored fold), and again within a factor of the first.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn read_bandwidth_is_a_memory_rate() {
        let b = crate::CudaBackend::new().expect("this test needs a CUDA GPU");
        let (x, y) = (b.read_bandwidth(3).unwrap(), b.read_bandwidth(3).unwrap());
        eprintln!(
            "device read bandwidth: {:.1} / {:.1} GB/s",
            x / 1e9,
            y / 1e9
        );
        for g in [x, y] {
            assert!((50e9..20e12).contains(&g), "{g} bytes a second");
        }
        assert!(x / y < 1.5 && y / x < 1.5, "{x} then {y}");
    }
}
