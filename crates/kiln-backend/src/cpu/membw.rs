//! Read bandwidth of this machine as decode sees it: every thread streams its share of a
//! buffer far larger than the caches, summing it so the reads cannot be skipped.

use std::time::Instant;

use super::Pool;

/// Bytes per second, the best of `reps` passes over `bytes` bytes (rounded to 4 KiB) read by
/// the pool's threads.
pub fn read_bandwidth(pool: &Pool, bytes: usize, reps: usize) -> f64 {
    let n = (bytes / 4096).max(1) * 4096 / 8;
    let buf: Vec<u64> = (0..n as u64)
        .map(|i| i.wrapping_mul(0x9e3779b97f4a7c15))
        .collect();
    let mut best = f64::MAX;
    let sink = std::sync::atomic::AtomicU64::new(0);
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        pool.run_aligned(n, 512, |a, b| {
            let s = sum(&buf[a..b]);
            sink.fetch_add(s, std::sync::atomic::Ordering::Relaxed);
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink.into_inner());
    (n * 8) as f64 / best
}

/// XOR of 8 independent lanes (vectorizes to full-width loads).
fn sum(v: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    for c in v.chunks_exact(8) {
        for l in 0..8 {
            acc[l] ^= c[l];
        }
    }
    acc.iter().fold(0, |a, b| a ^ b)
}
