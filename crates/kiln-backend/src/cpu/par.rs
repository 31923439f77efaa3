//! Splitting an op's work over threads.

/// A fixed number of workers; `run` splits `0..n` into contiguous chunks, one per worker.
pub struct Pool {
    threads: usize,
}

impl Pool {
    pub fn new(threads: usize) -> Self {
        Pool {
            threads: threads.max(1),
        }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Calls `f(start, end)` on disjoint chunks covering `0..n`, in parallel.
    pub fn run<F: Fn(usize, usize) + Sync>(&self, n: usize, f: F) {
        let workers = self.threads.min(n.max(1));
        if workers <= 1 {
            f(0, n);
            return;
        }
        let chunk = n.div_ceil(workers);
        std::thread::scope(|s| {
            for w in 1..workers {
                let (a, b) = (w * chunk, ((w + 1) * chunk).min(n));
                if a < b {
                    let f = &f;
                    s.spawn(move || f(a, b));
                }
            }
            f(0, chunk.min(n));
        });
    }
}

/// A raw pointer that several workers write through, each to indices no other touches.
#[derive(Clone, Copy)]
pub struct SharedMut(pub *mut f32);
// SAFETY: users guarantee disjoint writes (each worker owns a distinct index range).
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// # Safety
    /// `i` is in bounds and written by one worker only.
    pub unsafe fn write(self, i: usize, v: f32) {
        unsafe { *self.0.add(i) = v };
    }
}
