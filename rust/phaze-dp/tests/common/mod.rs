//! What the brute-force tests share: a seeded generator.

/// xorshift64*: deterministic, seeded per test.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn time(&mut self) -> f64 {
        // 0, or a multiple of 1/64 below 8 s.
        if self.below(5) == 0 {
            0.0
        } else {
            self.below(512) as f64 / 64.0
        }
    }
    pub fn pow2(&mut self, max_exp: u64) -> u64 {
        1 << self.below(max_exp + 1)
    }
}
