//! Randomness from the operating system's CSPRNG (getrandom). Every secret and
//! every encryption exponent comes from here; there is no seeded path.

use crate::error::{Error, Result};
use rug::integer::Order;
use rug::Integer;

/// `bits` uniformly random bits as little-endian u64 limbs.
pub(crate) fn random_limbs(bits: u32) -> Result<Vec<u64>> {
    random_limbs_many(1, bits)?.pop().ok_or(Error::Randomness)
}

/// `count` independent values of `bits` uniformly random bits each, as
/// little-endian u64 limbs, from one request to the OS (one system call per
/// batch instead of one per value).
pub(crate) fn random_limbs_many(count: usize, bits: u32) -> Result<Vec<Vec<u64>>> {
    let words = bits.div_ceil(64) as usize;
    if words == 0 {
        return Ok(vec![Vec::new(); count]);
    }
    let mut bytes = vec![0u8; count * words * 8];
    getrandom::fill(&mut bytes).map_err(|_| Error::Randomness)?;
    let spare = words as u32 * 64 - bits;
    Ok(bytes
        .chunks_exact(words * 8)
        .map(|value| {
            let mut limbs: Vec<u64> = value
                .chunks_exact(8)
                .map(|chunk| u64::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3], chunk[4], chunk[5], chunk[6], chunk[7]]))
                .collect();
            if spare > 0 {
                if let Some(top) = limbs.last_mut() {
                    *top &= u64::MAX >> spare;
                }
            }
            limbs
        })
        .collect())
}

/// A uniformly random integer of at most `bits` bits.
pub(crate) fn random_bits(bits: u32) -> Result<Integer> {
    Ok(Integer::from_digits(&random_limbs(bits)?, Order::Lsf))
}

/// A uniformly random integer in [1, bound) coprime to `bound` (rejection sampling).
pub(crate) fn random_unit(bound: &Integer) -> Result<Integer> {
    let bits = bound.significant_bits();
    loop {
        let candidate = random_bits(bits)?;
        if candidate > 0 && &candidate < bound && candidate.clone().gcd(bound) == 1 {
            return Ok(candidate);
        }
    }
}
