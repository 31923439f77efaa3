//! A persistent thread pool whose per-op synchronisation costs a few microseconds.
//!
//! `threads - 1` workers live as long as the pool. `run` cuts the range into chunks, publishes
//! a job by bumping an epoch counter; workers spin on it (then park when idle for a while) and
//! take chunks, their own first, then any nobody has started; the calling thread does the
//! same, and returns once every chunk is done: not when every worker has checked in, so a
//! worker the OS has descheduled (a busy machine) costs at most the chunk it holds, not the
//! op. No allocation and no syscall per op while the pool is busy.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Job = dyn Fn(usize) + Sync;

struct Shared {
    epoch: AtomicUsize,
    /// Workers between their check of `closed` and the end of their part of a job.
    active: AtomicUsize,
    /// No job open: a worker that wakes late skips it. The caller closes a job once its
    /// chunks are done, then waits for `active` to drain before the job goes away.
    closed: AtomicBool,
    quit: AtomicBool,
    /// The current job as a raw fat pointer, valid while it is open.
    job: std::cell::UnsafeCell<Option<JobPtr>>,
    threads: usize,
}

// SAFETY: `job` is written only by the thread in `run_job`, while the pool is closed and no
// worker is active, before it clears `closed` (SeqCst); a worker reads it only after counting
// itself in `active` and then seeing `closed` clear (SeqCst), and the caller closes the job
// and drains `active` before it returns: a write never meets a read.
unsafe impl Sync for Shared {}

#[derive(Clone, Copy)]
struct JobPtr(*const Job);
// SAFETY: the pointee is Sync and outlives every use (run_job drains `active` first).
unsafe impl Send for JobPtr {}

pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises callers: one op runs on the pool at a time.
    busy: std::sync::Mutex<()>,
}

/// How long an idle worker spins before it parks.
const SPIN: Duration = Duration::from_millis(2);

/// Chunks a thread's share of `run_aligned` is cut into (the unit of rebalancing).
const CLAIMS: usize = 4;
/// Threads up to which `run_aligned` rebalances (its claim counters live on the stack).
const MAX_CLAIM_THREADS: usize = 64;

/// Spins, then yields the core (a descheduled thread may need it), until `done`.
fn wait_until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        spins += 1;
        if spins < 4096 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

impl Pool {
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            closed: AtomicBool::new(true),
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

    /// Opens `f` to the workers (each calls `f(its id)` if it wakes while the job is open),
    /// calls `f(0)` here, waits until `done()`, then closes the job and waits for every worker
    /// still inside `f` to leave it.
    fn run_job(&self, f: &(dyn Fn(usize) + Sync), done: &dyn Fn() -> bool) {
        let _guard = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let s = &*self.shared;
        // SAFETY: the lifetime is erased only while this call keeps the job open and then
        // drains `active` below.
        let ptr: *const Job =
            unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Job>(f) };
        // The pool is closed and no worker active here (the previous call drained them).
        unsafe { *s.job.get() = Some(JobPtr(ptr)) };
        s.closed.store(false, Ordering::SeqCst);
        s.epoch.fetch_add(1, Ordering::Release);
        for w in &self.workers {
            w.thread().unpark();
        }
        f(0);
        wait_until(done);
        s.closed.store(true, Ordering::SeqCst);
        wait_until(|| s.active.load(Ordering::SeqCst) == 0);
    }

    /// Calls `f(start, end)` on disjoint contiguous chunks covering `0..n`, spread over the
    /// threads (see `run_aligned`).
    pub fn run<F: Fn(usize, usize) + Sync>(&self, n: usize, f: F) {
        self.run_aligned(n, 1, f)
    }

    /// Like `run`, with chunk boundaries at multiples of `align` (except the end).
    ///
    /// The range is cut into `CLAIMS` chunks a thread, the same cuts every time for a given
    /// `n`, `align` and thread count; each thread takes its own chunks in order, then the
    /// chunks other threads have not started. On a quiet machine that is one contiguous share
    /// a thread; when a thread is descheduled (a busy machine), the others do its work instead
    /// of waiting for it. Which thread computes a chunk never changes what it computes: `f`
    /// must give each index's result from the index alone.
    pub fn run_aligned<F: Fn(usize, usize) + Sync>(&self, n: usize, align: usize, f: F) {
        let units = n.div_ceil(align);
        let threads = self.threads().min(units.max(1));
        if threads <= 1 {
            f(0, n);
            return;
        }
        let span = |c: usize, of: usize| {
            let a = (units * c / of * align).min(n);
            let b = (units * (c + 1) / of * align).min(n);
            (a, b)
        };
        let finished = AtomicUsize::new(0);
        if threads > MAX_CLAIM_THREADS {
            // One share a thread, no rebalancing.
            return self.run_job(
                &|t| {
                    if t < threads {
                        let (a, b) = span(t, threads);
                        if a < b {
                            f(a, b);
                        }
                        finished.fetch_add(1, Ordering::Release);
                    }
                },
                &|| finished.load(Ordering::Acquire) == threads,
            );
        }
        let chunks = (threads * CLAIMS).min(units);
        // Thread t owns chunks first(t)..first(t + 1); next[t] is the first of them nobody
        // has taken.
        let first = |t: usize| chunks * t / threads;
        let next: [AtomicUsize; MAX_CLAIM_THREADS] =
            std::array::from_fn(|t| AtomicUsize::new(if t < threads { first(t) } else { 0 }));
        self.run_job(
            &|t| {
                if t >= threads {
                    return;
                }
                for v in (t..threads).chain(0..t) {
                    let end = first(v + 1);
                    loop {
                        let c = next[v].fetch_add(1, Ordering::Relaxed);
                        if c >= end {
                            break;
                        }
                        let (a, b) = span(c, chunks);
                        if a < b {
                            f(a, b);
                        }
                        finished.fetch_add(1, Ordering::Release);
                    }
                }
            },
            &|| finished.load(Ordering::Acquire) == chunks,
        );
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
        s.active.fetch_add(1, Ordering::SeqCst);
        if !s.closed.load(Ordering::SeqCst) {
            // SAFETY: written before `closed` was cleared; the caller drains `active`
            // (which counts us) before the job goes away or is replaced.
            if let Some(JobPtr(p)) = unsafe { *s.job.get() } {
                let f: &Job = unsafe { &*p };
                f(id);
            }
        }
        s.active.fetch_sub(1, Ordering::SeqCst);
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

    /// The `len` values from `at`.
    ///
    /// # Safety
    /// `at..at + len` is in bounds, written by this worker only, and not otherwise
    /// borrowed while the slice lives.
    pub unsafe fn slice<'a>(self, at: usize, len: usize) -> &'a mut [f32] {
        unsafe { std::slice::from_raw_parts_mut(self.0.add(at), len) }
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
                        assert!(a % 4 == 0 && (b % 4 == 0 || b == n) && (a < b || n == 0));
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

    /// A thread that stalls (descheduled, say) leaves its chunks to the others: with the
    /// worker asleep on its first chunk, the caller does everything else.
    #[test]
    fn a_stalled_thread_loses_its_chunks() {
        let pool = Pool::new(2);
        let n = 64;
        let by_caller = AtomicU64::new(0);
        let caller = std::thread::current().id();
        pool.run(n, |a, b| {
            if std::thread::current().id() == caller {
                by_caller.fetch_add((b - a) as u64, Ordering::Relaxed);
            } else {
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        // The worker's share is half; it keeps at most the chunk it slept in.
        let n_chunks = 2 * CLAIMS;
        let worker_kept = (n / n_chunks) as u64;
        assert!(by_caller.load(Ordering::Relaxed) >= n as u64 - worker_kept);
    }
}
