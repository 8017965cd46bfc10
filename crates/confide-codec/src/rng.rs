//! Randomness for stochastic rounding. An injected seed makes runs reproducible
//! (tests, experiments); without one the seed comes from the OS CSPRNG. Each
//! plaintext chunk uses its own ChaCha20 stream, so results do not depend on
//! the thread count.

use crate::error::{Error, Result};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

pub(crate) fn root_seed(seed: Option<u64>) -> Result<[u8; 32]> {
    let mut bytes = [0u8; 32];
    match seed {
        Some(seed) => bytes[..8].copy_from_slice(&seed.to_le_bytes()),
        None => getrandom::fill(&mut bytes).map_err(|_| Error::Randomness)?,
    }
    Ok(bytes)
}

pub(crate) fn chunk_rng(root: &[u8; 32], chunk: usize) -> ChaCha20Rng {
    let mut rng = ChaCha20Rng::from_seed(*root);
    rng.set_stream(chunk as u64);
    rng
}

/// A uniform double in [0, 1) with 53 random bits.
pub(crate) fn uniform(rng: &mut ChaCha20Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Stochastic rounding: ⌊x⌋ + 1[u < x − ⌊x⌋], unbiased: E[SR(x)] = x.
pub(crate) fn stochastic_round(x: f64, rng: &mut ChaCha20Rng) -> i64 {
    let floor = x.floor();
    let fraction = x - floor;
    floor as i64 + i64::from(uniform(rng) < fraction)
}
