//! Quantization and packing codecs for Paillier-protected aggregation.
//!
//! * [`batchcrypt`]: BatchCrypt (algorithms.md §2) — symmetric signed
//!   quantization with stochastic rounding, two's complement with two sign
//!   bits, ⌈log2 m⌉ carry bits, exact decoding of sums of any m ≤ 2^p vectors,
//!   overflow flags.
//! * [`daciq`]: the dACIQ clipping threshold with the corrected A(b) table.
//! * [`flbooster`]: FLBooster's unsigned offset packing (§3), for comparison.
//! * [`bound`], [`norm`]: range and L2 norm proofs of a party's update (Bulletproofs).
//! * [`tags`]: linear tags of verifiable aggregation (inner products with public challenges).
//!
//! Packed plaintexts are little-endian u64 limbs of at most k − 2 bits, so they
//! and their sums stay below any k-bit Paillier modulus. This crate knows
//! nothing of Paillier; `confide-py` composes the two.

pub mod batchcrypt;
mod bits;
pub mod bound;
pub mod daciq;
mod error;
pub mod flbooster;
pub mod norm;
pub mod params;
mod rng;
pub mod tags;

pub use batchcrypt::{BatchCryptCodec, Decoded, Packed, Quantizer};
pub use bits::Layout;
pub use error::{Error, Result};
pub use flbooster::FlBoosterCodec;
pub use params::Codec;
