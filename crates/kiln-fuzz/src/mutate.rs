//! A small structure-blind mutator, for running the targets without libFuzzer (the smoke test
//! and `kiln-fuzz`'s own loop): bit flips, byte sets, interesting integers written over
//! 1/2/4/8 bytes (0, 1, -1, the type's max, lengths just past the end of the input),
//! truncations, chunk duplication and deletion, and splices with another input.

/// xorshift64*: deterministic from its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Integers that end up as counts, lengths and offsets in headers.
fn interesting(len: usize, r: &mut Rng) -> u64 {
    let l = len as u64;
    match r.below(12) {
        0 => 0,
        1 => 1,
        2 => u64::MAX,
        3 => u32::MAX as u64,
        4 => u16::MAX as u64,
        5 => i32::MAX as u64,
        6 => i64::MAX as u64,
        7 => l,
        8 => l + 1,
        9 => l.wrapping_sub(1),
        10 => 1 << r.below(64),
        _ => 0x80,
    }
}

/// One to four mutations of `input`; `other` is a second input to splice from.
pub fn mutate(input: &[u8], other: &[u8], r: &mut Rng) -> Vec<u8> {
    let mut b = input.to_vec();
    for _ in 0..1 + r.below(4) {
        mutate_once(&mut b, other, r);
    }
    b
}

fn mutate_once(b: &mut Vec<u8>, other: &[u8], r: &mut Rng) {
    if b.is_empty() {
        b.push(r.next() as u8);
        return;
    }
    let n = b.len();
    match r.below(9) {
        0 => b[r.below(n)] ^= 1 << r.below(8),
        1 => b[r.below(n)] = r.next() as u8,
        2 | 3 => {
            let v = interesting(n, r);
            let w = [1, 2, 4, 8][r.below(4)];
            let at = r.below(n);
            let bytes = if r.below(2) == 0 {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            };
            let src = if r.below(2) == 0 {
                &bytes[..w]
            } else {
                &bytes[8 - w..]
            };
            for (i, &x) in src.iter().enumerate() {
                if let Some(d) = b.get_mut(at + i) {
                    *d = x;
                }
            }
        }
        4 => b.truncate(r.below(n)),
        5 => {
            // Duplicate a chunk in place.
            let start = r.below(n);
            let len = 1 + r.below((n - start).min(64));
            let chunk = b[start..start + len].to_vec();
            let at = r.below(n + 1);
            b.splice(at..at, chunk);
        }
        6 => {
            let start = r.below(n);
            let len = 1 + r.below((n - start).min(64));
            b.drain(start..start + len);
        }
        7 if !other.is_empty() => {
            // Splice: our head, the other's tail.
            let at = r.below(n);
            let from = r.below(other.len());
            b.truncate(at);
            b.extend_from_slice(&other[from..]);
        }
        _ => {
            // Insert random bytes.
            let at = r.below(n + 1);
            let k = 1 + r.below(8);
            let ins: Vec<u8> = (0..k).map(|_| r.next() as u8).collect();
            b.splice(at..at, ins);
        }
    }
}
