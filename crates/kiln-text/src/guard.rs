//! A memory and time bound for work that a file controls (chat template rendering), which
//! nothing but the allocator can see: `{% set ns.s = ns.s ~ ns.s %}` in a loop doubles a string
//! with a handful of instructions per step, so fuel alone cannot bound it.
//!
//! [`GuardedAlloc`] is the system allocator plus a per-thread account that only a guarded
//! thread has. [`run_guarded`] runs a closure on a new thread whose allocations, net of its
//! frees, may not pass `budget` bytes, and waits at most `timeout` for it. A thread over its
//! budget, or still running when the wait ends, is stopped at its next allocation: it never
//! returns from it (a thread cannot be unwound from inside the allocator), sleeping for good
//! while holding at most its budget. The caller gets an error at once. Binaries install the
//! allocator (`#[global_allocator]`); without it the thread and timeout still apply, the
//! memory bound does not, and [`installed`] says so.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Why a guarded run did not finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// It needed more than its memory budget.
    Memory,
    /// It ran past its time limit.
    Time,
    /// It panicked (a bug: reported, not propagated).
    Panicked,
}

const RUNNING: u8 = 0;
const OVER_BUDGET: u8 = 1;
const CANCELLED: u8 = 2;

/// What a guarded thread and its caller share: the run's state and a wake-up for the caller
/// (futex-backed, so the allocator can signal it without allocating).
struct Shared {
    state: AtomicU8,
    done: Mutex<bool>,
    cv: Condvar,
}

impl Shared {
    fn wake(&self) {
        if let Ok(mut d) = self.done.lock() {
            *d = true;
        }
        self.cv.notify_all();
    }
}

thread_local! {
    /// Bytes the guarded thread may still allocate; `isize::MAX` on every other thread.
    static LEFT: Cell<isize> = const { Cell::new(isize::MAX) };
    /// The run's state, shared with the waiting caller; null on unguarded threads.
    static STATE: Cell<*const Shared> = const { Cell::new(std::ptr::null()) };
}

static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Whether this process's global allocator is [`GuardedAlloc`] (so budgets are enforced).
pub fn installed() -> bool {
    // Any allocation through GuardedAlloc sets the flag; make sure one has happened.
    drop(std::hint::black_box(Box::new(0u8)));
    INSTALLED.load(Ordering::Relaxed)
}

pub struct GuardedAlloc;

/// Charges `n` bytes to the current thread; a guarded thread over its budget or cancelled
/// stops here for good.
#[inline]
fn charge(n: usize) {
    let _ = LEFT.try_with(|left| {
        let l = left.get();
        if l == isize::MAX {
            return;
        }
        let shared = STATE.try_with(|s| s.get()).unwrap_or(std::ptr::null());
        // SAFETY: a guarded thread's STATE points into an Arc that the thread's own closure
        // holds for as long as the thread lives.
        let shared = unsafe { shared.as_ref() };
        let cancelled = shared.is_some_and(|s| s.state.load(Ordering::Relaxed) != RUNNING);
        let after = l.saturating_sub(n as isize);
        if after < 0 || cancelled {
            // Unguard the thread (so what follows may allocate), tell the caller, then never
            // return to the work that asked.
            left.set(isize::MAX);
            if let Some(s) = shared {
                let _ = s.state.compare_exchange(
                    RUNNING,
                    OVER_BUDGET,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                s.wake();
            }
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        left.set(after);
    });
}

#[inline]
fn refund(n: usize) {
    let _ = LEFT.try_with(|left| {
        let l = left.get();
        if l != isize::MAX {
            left.set(l.saturating_add(n as isize).min(isize::MAX - 1));
        }
    });
}

// SAFETY: every call is forwarded to `System` unchanged; the accounting around it never
// touches the memory handed out.
unsafe impl GlobalAlloc for GuardedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        charge(layout.size());
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        charge(layout.size());
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        refund(layout.size());
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            charge(new_size - layout.size());
        } else {
            refund(layout.size() - new_size);
        }
        System.realloc(ptr, layout, new_size)
    }
}

/// Runs `f` on a new thread within `budget` bytes and `timeout`.
pub fn run_guarded<T: Send + 'static>(
    budget: usize,
    timeout: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Stopped> {
    let shared = Arc::new(Shared {
        state: AtomicU8::new(RUNNING),
        done: Mutex::new(false),
        cv: Condvar::new(),
    });
    let (tx, rx) = mpsc::sync_channel(1);
    let sh = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("kiln-guarded".into())
        .spawn(move || {
            STATE.with(|s| s.set(Arc::as_ptr(&sh)));
            LEFT.with(|l| l.set(budget.min(isize::MAX as usize - 1) as isize));
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            LEFT.with(|l| l.set(isize::MAX));
            STATE.with(|s| s.set(std::ptr::null()));
            let _ = tx.send(out);
            sh.wake();
        });
    if spawned.is_err() {
        // No thread to spare: refuse rather than run unguarded.
        return Err(Stopped::Memory);
    }
    let deadline = Instant::now() + timeout;
    if let Ok(mut done) = shared.done.lock() {
        while !*done {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match shared.cv.wait_timeout(done, left) {
                Ok((d, _)) => done = d,
                Err(_) => break,
            }
        }
    }
    match rx.try_recv() {
        Ok(Ok(v)) => return Ok(v),
        Ok(Err(_)) => return Err(Stopped::Panicked),
        Err(_) => {}
    }
    let _ = shared
        .state
        .compare_exchange(RUNNING, CANCELLED, Ordering::Relaxed, Ordering::Relaxed);
    match shared.state.load(Ordering::Relaxed) {
        OVER_BUDGET => Err(Stopped::Memory),
        _ => Err(Stopped::Time),
    }
}
