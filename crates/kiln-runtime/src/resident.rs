//! A value on a thread of its own: made there, used from any thread through calls that
//! run there one at a time. A backend bound to the thread that made it (a CUDA context, a
//! GPU queue) then serves callers on any thread: the LLM engine ([`crate::engine`]) and the
//! speech models ([`crate::speech`]) live this way.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

type Job<M> = Box<dyn FnOnce(&mut M) + Send>;

/// A value that lives on a thread of its own: made there by [`Resident::spawn`], used through
/// [`Resident::call`] from any thread. `M` need not be `Send`.
pub struct Resident<M: ?Sized> {
    tx: Mutex<Option<mpsc::Sender<Job<M>>>>,
    thread: Option<JoinHandle<()>>,
}

impl<M: ?Sized + 'static> Resident<M> {
    /// Starts thread `name` and makes the value there with `load`; its error is returned
    /// here (and the thread ends).
    pub fn spawn<E>(
        name: &str,
        load: impl FnOnce() -> Result<Box<M>, E> + Send + 'static,
    ) -> Result<Self, E>
    where
        E: Send + 'static,
    {
        Self::spawn_scoped(name, move |serve| {
            let mut m = load()?;
            serve(&mut *m);
            Ok(())
        })
    }

    /// Like [`Resident::spawn`] for a value that borrows what its thread made: `make` builds
    /// it on the thread's stack and hands it to `serve`, which returns when the handle goes.
    /// An error before `serve` is called is returned here.
    pub fn spawn_scoped<E>(
        name: &str,
        make: impl FnOnce(&mut dyn FnMut(&mut M)) -> Result<(), E> + Send + 'static,
    ) -> Result<Self, E>
    where
        E: Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<Job<M>>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), E>>();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let mut ready = Some(ready_tx);
                let mut serve = |m: &mut M| {
                    if let Some(r) = ready.take() {
                        let _ = r.send(Ok(()));
                    }
                    // Until the handle goes (its sender dropped).
                    while let Ok(job) = rx.recv() {
                        job(m);
                    }
                };
                let res = catch_unwind(AssertUnwindSafe(|| make(&mut serve)));
                match res {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        if let Some(r) = ready.take() {
                            let _ = r.send(Err(e));
                        }
                    }
                    Err(p) => {
                        drop(ready);
                        resume_unwind(p)
                    }
                }
            })
            // As std::thread::spawn: a machine that cannot start a thread cannot go on.
            .expect("starting a model thread");
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Resident {
                tx: Mutex::new(Some(tx)),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            // The load panicked (the same panic here), or ended without serving.
            Err(_) => match thread.join() {
                Err(p) => resume_unwind(p),
                Ok(()) => panic!("a resident value's thread ended before it served"),
            },
        }
    }

    /// Runs `f` on the value's thread (calls queue there, one at a time) and returns its
    /// result. A panic in `f` is resumed here; the value stays for the next call.
    pub fn call<R: Send + 'static>(&self, f: impl FnOnce(&mut M) -> R + Send + 'static) -> R {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send(Box::new(move |m: &mut M| {
            let _ = tx.send(catch_unwind(AssertUnwindSafe(|| f(m))));
        }));
        match rx.recv() {
            Ok(Ok(r)) => r,
            Ok(Err(p)) => resume_unwind(p),
            Err(_) => unreachable!("a resident thread ends only with its handle"),
        }
    }

    /// Like [`Resident::call`], `f` also given `emit`, whose items reach `each` on this
    /// thread as they are made. Once `each` returns false, `emit` returns false (so `f` can
    /// stop early) and later items are dropped.
    pub fn stream<T, R>(
        &self,
        f: impl FnOnce(&mut M, &mut dyn FnMut(T) -> bool) -> R + Send + 'static,
        each: &mut dyn FnMut(T) -> bool,
    ) -> R
    where
        T: Send + 'static,
        R: Send + 'static,
    {
        enum Msg<T, R> {
            Item(T),
            Done(std::thread::Result<R>),
        }
        // Two items in flight at most: the value's thread waits for a slow reader.
        let (tx, rx) = mpsc::sync_channel::<Msg<T, R>>(2);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        self.send(Box::new(move |m: &mut M| {
            let mut emit = |t: T| !stopped.load(Ordering::Acquire) && tx.send(Msg::Item(t)).is_ok();
            let r = catch_unwind(AssertUnwindSafe(|| f(m, &mut emit)));
            let _ = tx.send(Msg::Done(r));
        }));
        loop {
            match rx.recv() {
                Ok(Msg::Item(t)) => {
                    if !stop.load(Ordering::Acquire) && !each(t) {
                        stop.store(true, Ordering::Release);
                    }
                }
                Ok(Msg::Done(Ok(r))) => return r,
                Ok(Msg::Done(Err(p))) => resume_unwind(p),
                Err(_) => unreachable!("a resident thread ends only with its handle"),
            }
        }
    }

    fn send(&self, job: Job<M>) {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        // The thread ends only when the sender is dropped (below), and jobs catch panics.
        let sent = tx.as_ref().map(|tx| tx.send(job));
        assert!(
            matches!(sent, Some(Ok(()))),
            "a resident thread ends only with its handle"
        );
    }
}

impl<M: ?Sized> Drop for Resident<M> {
    fn drop(&mut self) {
        self.tx.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Resident;
    use std::cell::Cell;
    use std::rc::Rc;

    /// A value that is not `Send` (an `Rc`) lives on its thread and serves calls from
    /// others, in order; a panic in a call reaches the caller and the value stays usable;
    /// a load error comes back from `spawn`.
    #[test]
    fn a_resident_value_serves_calls_from_any_thread() {
        let r = Resident::spawn("test", || {
            Ok::<_, std::io::Error>(Box::new(Rc::new(Cell::new(0u32))))
        })
        .unwrap();
        let here = std::thread::current().id();
        let there = r.call(|_| std::thread::current().id());
        assert_ne!(here, there);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..25 {
                        r.call(|c| c.set(c.get() + 1));
                    }
                });
            }
        });
        assert_eq!(r.call(|c| c.get()), 100);
        let p = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            r.call(|_| -> u32 { panic!("inside") })
        }));
        assert!(p.is_err());
        assert_eq!(r.call(|c| c.get()), 100);
        let e = Resident::<u8>::spawn("test", || Err(std::io::Error::other("no model")));
        assert_eq!(e.err().unwrap().to_string(), "no model");
    }

    /// Streamed items arrive in order on the caller's thread; once the reader says stop,
    /// the producer is told (emit returns false) and the call still returns.
    #[test]
    fn a_stream_stops_when_its_reader_does() {
        let r = Resident::spawn("test", || Ok::<_, std::io::Error>(Box::new(()))).unwrap();
        let mut got = Vec::new();
        let made = r.stream(
            |_, emit: &mut dyn FnMut(u32) -> bool| {
                let mut made = 0;
                for i in 0..1000 {
                    made += 1;
                    if !emit(i) {
                        break;
                    }
                }
                made
            },
            &mut |i| {
                got.push(i);
                got.len() < 5
            },
        );
        assert_eq!(got, vec![0, 1, 2, 3, 4]);
        // The producer may run past the stop by the channel's depth (items 5 and 6 queued
        // when the reader stops), one send blocked behind them (7) that completes once the
        // reader drains, and the item whose emit then sees the stop (8): 9 made at most.
        assert!((5..=9).contains(&made), "{made}");
    }
}
