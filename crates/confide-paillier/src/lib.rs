//! Paillier encryption for Confide (algorithms.md §1).
//!
//! * g = n + 1, so g^m = 1 + m·n costs one multiplication (§1.3).
//! * Randomizer ρ = h_s^a with h_s = (−x²)^n mod n² and a of ℓ = k/2 bits
//!   (Damgård–Jurik–Nielsen, §1.4), computed from a precomputed fixed-base
//!   window table in Montgomery form (§1.5): ⌈ℓ/w⌉ multiplications, no squarings.
//!   The classical ρ = r^n is available as [`Randomizer::Classical`].
//! * The key holder encrypts by CRT mod p² and q² with per-prime tables (§1.6)
//!   and decrypts by CRT with h_p = −q⁻¹ mod p, h_q = −p⁻¹ mod q (§1.7), using
//!   constant-time `mpz_powm_sec` for the secret exponents p − 1, q − 1.
//! * Canonical big-endian wire formats with strict validation (§1.9).
//! * Vertical-FL kernels: gradient histograms, cipher folding and bucket-method
//!   multi-exponentiation on the 8-lane IFMA engine (`kernels.rs`).
//!
//! # Security
//! k = 2048 gives 112-bit security, 3072 gives 128-bit (NIST SP 800-57); smaller
//! moduli are refused. IND-CPA under the DCR assumption plus, for DJN
//! randomness, the short-exponent assumption at ℓ = k/2. Paillier is malleable:
//! authenticate channels and never offer a decryption oracle. All randomness
//! comes from the OS CSPRNG.

mod error;
#[cfg(target_arch = "x86_64")]
mod ifma;
mod kernels;
mod keys;
mod mont;
mod ops;
mod random;
mod table;
mod vector;
mod wire;

pub use error::{Error, Result};
pub use kernels::{MAX_DOT_BITS, MAX_FOLD_WIDTH, MAX_HISTOGRAM_BINS};

/// Whether the 8-lane AVX-512 IFMA engine runs on this CPU (set
/// `CONFIDE_DISABLE_IFMA=1` to force the GMP path).
pub fn ifma_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        ifma::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
pub use keys::{default_crt_window, default_window, DecryptionKey, EncryptionKey, KeyId, MIN_KEY_BITS, SCHEME, SUPPORTED_KEY_BITS};
pub use ops::{Ciphertext, Randomizer};
pub use rug::Integer;
pub use vector::{with_threads, MAX_THREADS};
pub use wire::{CiphertextBlock, Encoding, BLOCK_HEADER_BYTES, FLAG_RERANDOMIZED};
