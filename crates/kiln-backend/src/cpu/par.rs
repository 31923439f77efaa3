//! A persistent thread pool whose per-op synchronisation costs a few microseconds.
//!
//! `threads - 1` workers live as long as the pool. `run` publishes a job by bumping an epoch
//! counter; workers spin on it (then park when idle for a while), run their share, and count
//! themselves done; the calling thread runs share 0 and spins until everyone is done. No
//! allocation and no syscall per op while the pool is busy.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Job = dyn Fn(usize, usize) + Sync;

struct Shared {
    epoch: AtomicUsize,
    done: AtomicUsize,
    quit: AtomicBool,
    /// The current job as a raw fat pointer, valid while `broadcast` waits.
    job: std::cell::UnsafeCell<Option<JobPtr>>,
    threads: usize,
}

// SAFETY: `job` is written only by the thread in `run` before the epoch is published
// (Release) and read by workers after they observe the epoch (Acquire), never concurrently.
unsafe impl Sync for Shared {}

#[derive(Clone, Copy)]
struct JobPtr(*const Job);
// SAFETY: the pointee is Sync and outlives every use (run waits for all workers).
unsafe impl Send for JobPtr {}

pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises callers: one op runs on the pool at a time.
    busy: std::sync::Mutex<()>,
}

/// How long an idle worker spins before it parks.
const SPIN: Duration = Duration::from_millis(2);

impl Pool {
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            quit: AtomicBool::new(false),
            job: std::cell::UnsafeCell::new(None),
            threads,
        });
        let workers = (1..threads)
            .map(|id| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("kiln-cpu-{id}"))
                    .spawn(move || worker(s, id))
                    .expect("spawn worker thread")
            })
            .collect();
        Pool {
            shared,
            workers,
            busy: std::sync::Mutex::new(()),
        }
    }

    pub fn threads(&self) -> usize {
        self.shared.threads
    }

    /// Calls `f(thread, n_threads)` once on every thread of the pool (the caller is thread 0)
    /// and returns when all have finished.
    pub fn broadcast(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let n = self.shared.threads;
        if n == 1 {
            f(0, 1);
            return;
        }
        let _guard = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let s = &*self.shared;
        // SAFETY: the lifetime is erased only while this call waits for every worker below.
        let ptr: *const Job = unsafe {
            std::mem::transmute::<*const (dyn Fn(usize, usize) + Sync + '_), *const Job>(f)
        };
        unsafe { *s.job.get() = Some(JobPtr(ptr)) };
        s.done.store(0, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::Release);
        for w in &self.workers {
            w.thread().unpark();
        }
        f(0, n);
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) != n - 1 {
            // Spin briefly; then give the core away, in case a worker was descheduled (a
            // busy machine) and needs this core to finish.
            spins += 1;
            if spins < 4096 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Calls `f(start, end)` on disjoint contiguous chunks covering `0..n`, one per thread.
    pub fn run<F: Fn(usize, usize) + Sync>(&self, n: usize, f: F) {
        self.run_aligned(n, 1, f)
    }

    /// Like `run`, with chunk boundaries at multiples of `align` (except the end).
    pub fn run_aligned<F: Fn(usize, usize) + Sync>(&self, n: usize, align: usize, f: F) {
        let units = n.div_ceil(align);
        let threads = self.threads().min(units.max(1));
        if threads <= 1 {
            f(0, n);
            return;
        }
        self.broadcast(&|t, _| {
            if t >= threads {
                return;
            }
            let a = (units * t / threads * align).min(n);
            let b = (units * (t + 1) / threads * align).min(n);
            if a < b {
                f(a, b);
            }
        });
    }
}

fn worker(s: Arc<Shared>, id: usize) {
    let mut seen = 0usize;
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.quit.load(Ordering::Acquire) {
                return;
            }
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                seen = e;
                break;
            }
            spins += 1;
            if spins < 4096 {
                std::hint::spin_loop();
            } else if start.elapsed() < SPIN {
                std::thread::yield_now();
            } else {
                std::thread::park_timeout(Duration::from_millis(50));
            }
        }
        // SAFETY: published before the epoch bump we just observed; `run` keeps it alive.
        let job = unsafe { *s.job.get() };
        if let Some(JobPtr(p)) = job {
            let f: &Job = unsafe { &*p };
            f(id, s.threads);
        }
        s.done.fetch_add(1, Ordering::Release);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.quit.store(true, Ordering::Release);
        for w in self.workers.drain(..) {
            w.thread().unpark();
            let _ = w.join();
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_index_once() {
        for threads in 1..4 {
            let pool = Pool::new(threads);
            for n in [0usize, 1, 2, 3, 17, 1000] {
                let hits: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
                for _ in 0..50 {
                    pool.run_aligned(n, 4, |a, b| {
                        for h in &hits[a..b] {
                            h.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 50),
                    "{threads} {n}"
                );
            }
        }
    }
}
