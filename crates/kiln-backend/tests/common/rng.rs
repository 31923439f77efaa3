//! A small xorshift generator for the kernel tests (no dependency, same stream everywhere).

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Roughly normal, with occasional outliers (as activations have).
    pub fn normal(&mut self) -> f32 {
        let s: f32 = (0..4)
            .map(|_| (self.next() % 2001) as f32 / 1000.0 - 1.0)
            .sum();
        if self.next() % 97 == 0 {
            s * 20.0
        } else {
            s
        }
    }
}
