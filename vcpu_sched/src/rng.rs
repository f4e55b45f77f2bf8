//! The workspace's one small random number generator.
//!
//! WHAT: [`Rng`], xorshift64* (Vigna's variant of Marsaglia's xorshift with
//! a multiplicative output scramble): 64-bit state, one shift-xor round
//! and a multiply per value.
//!
//! WHY: workloads and tests need cheap, reproducible randomness (which
//! task to wake, which policy or mask to pick) with no dependency and no
//! global state; two identical copies of it had grown in the crate.
//!
//! HOW: the seed is spread by a multiplication and made odd, so that every
//! seed (0 included) gives a non-zero state, and the same seed always gives
//! the same sequence. Not for anything that needs unpredictability.

/// xorshift64*: deterministic, dependency-free, not cryptographic.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (`0` when `n` is 0); slightly biased for huge `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::Rng;

    #[test]
    fn deterministic_and_spread() {
        let a: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..8).map(|_| r.next()).collect()
        };
        let mut r = Rng::new(7);
        assert_eq!(a, (0..8).map(|_| r.next()).collect::<Vec<_>>());
        assert_ne!(a, {
            let mut r = Rng::new(8);
            (0..8).map(|_| r.next()).collect::<Vec<_>>()
        });
        let mut z = Rng::new(0);
        assert_ne!(z.next(), 0, "seed 0 still works");
        let mut r = Rng::new(1);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            seen[r.below(10) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| (800..1200).contains(&c)), "{seen:?}");
        assert_eq!(r.below(0), 0);
    }
}
