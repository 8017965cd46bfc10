//! BatchCrypt quantization and packing (algorithms.md §2), with our fixes:
//! p = ⌈log2 m⌉ carry bits, s = ⌊(k − 2)/w⌋ slots, and a decoder that reduces
//! each slot mod 2^(r+1), exact for sums of any number of vectors up to 2^p.
//!
//! Per value g (one party): ĝ = clip(g, −α, α); v = SR(ĝ · scale) with
//! scale = ⌊Q/m⌋/α ("exact bound", default: |Σ v| ≤ Q for m parties) or
//! Q/(m·α) ("paper" form of [BC]); Q = 2^(r−1) − 1. The code is written as an
//! (r+1)-bit two's-complement number (two sign bits) under p zero bits.
//! After summing, slot j holds S_j + (#negative summands)·2^(r+1); the
//! decoder drops the carries with mod 2^(r+1) and sign-extends.

use crate::bits::{ceil_log2, get, put, Layout};
use crate::error::{invalid, Error, Result};
use crate::rng::{chunk_rng, root_seed, stochastic_round};
use rayon::prelude::*;

/// How quantization scales values (§2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantizer {
    /// scale = ⌊Q/m⌋/α: the sum of m codes never exceeds ±Q (default).
    ExactBound,
    /// scale = Q/(m·α) as in BatchCrypt's code; sums may exceed Q by up to m − 1 units.
    Paper,
}

/// A BatchCrypt codec bound to a plaintext size.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchCryptCodec {
    bits: u32,
    max_summands: u32,
    alpha: f64,
    quantizer: Quantizer,
    padding_bits: u32,
    layout: Layout,
}

/// Largest quantization width: codes and their sums stay well inside i64/u64.
pub const MAX_BITS: u32 = 32;
/// Largest number of summed parties a codec may be built for.
pub const MAX_SUMMANDS: u32 = 1 << 20;

/// Plaintexts produced by packing: `count` plaintexts of `layout.limbs` limbs each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packed {
    /// Number of values packed (the vector length d).
    pub length: usize,
    /// Flat little-endian limbs, one plaintext after another.
    pub limbs: Vec<u64>,
}

/// A decoded sum.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    /// Dequantized sums, one per original position.
    pub values: Vec<f64>,
    /// Integer code sums S_j (exact).
    pub codes: Vec<i64>,
    /// Positions whose sum left the code range [−Q, Q] (or whose carry bits are
    /// impossible for the declared number of summands): a sign of more summands
    /// than declared, or of a faulty party.
    pub overflow: Vec<usize>,
}

impl BatchCryptCodec {
    /// `bits` = r (quantization width including the sign, 2..=32), `max_summands` = m
    /// (parties whose vectors will be summed), `alpha` = clipping threshold > 0,
    /// `plaintext_bits` = k (bit length of the Paillier n).
    ///
    /// # Errors
    /// `InvalidParameter` naming the field and its limit.
    pub fn new(bits: u32, max_summands: u32, alpha: f64, plaintext_bits: u32, quantizer: Quantizer) -> Result<Self> {
        if !(2..=MAX_BITS).contains(&bits) {
            return Err(invalid("bits", format!("must be in 2..={MAX_BITS}, got {bits}")));
        }
        if !(1..=MAX_SUMMANDS).contains(&max_summands) {
            return Err(invalid("max_summands", format!("must be in 1..={MAX_SUMMANDS}, got {max_summands}")));
        }
        if !(alpha.is_finite() && alpha > 0.0) {
            return Err(invalid("alpha", format!("must be finite and > 0, got {alpha}")));
        }
        let code_max = (1u64 << (bits - 1)) - 1;
        if quantizer == Quantizer::ExactBound && code_max < u64::from(max_summands) {
            return Err(invalid(
                "bits",
                format!("{bits} bits give codes up to {code_max}, fewer than the {max_summands} summands (need floor(Q/m) >= 1)"),
            ));
        }
        let padding_bits = ceil_log2(u64::from(max_summands));
        let layout = Layout::new(bits + 1 + padding_bits, plaintext_bits)?;
        Ok(BatchCryptCodec { bits, max_summands, alpha, quantizer, padding_bits, layout })
    }

    /// Quantization width r.
    pub fn bits(&self) -> u32 {
        self.bits
    }
    /// Declared number of summands m.
    pub fn max_summands(&self) -> u32 {
        self.max_summands
    }
    /// Clipping threshold α.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }
    /// Quantizer form.
    pub fn quantizer(&self) -> Quantizer {
        self.quantizer
    }
    /// Carry bits p per slot.
    pub fn padding_bits(&self) -> u32 {
        self.padding_bits
    }
    /// Packing geometry.
    pub fn layout(&self) -> Layout {
        self.layout
    }
    /// Largest code magnitude of an aggregate, Q = 2^(r−1) − 1.
    pub fn code_max(&self) -> i64 {
        (1i64 << (self.bits - 1)) - 1
    }
    /// Most vectors that can be summed without slots spilling: 2^p.
    pub fn summand_capacity(&self) -> u64 {
        1u64 << self.padding_bits
    }

    /// Codes per unit of value for one party.
    fn scale(&self) -> f64 {
        let q = self.code_max() as f64;
        match self.quantizer {
            Quantizer::ExactBound => (self.code_max() / i64::from(self.max_summands)) as f64 / self.alpha,
            Quantizer::Paper => q / (f64::from(self.max_summands) * self.alpha),
        }
    }

    /// Clips, quantizes with stochastic rounding and packs `values`.
    /// `seed` makes the rounding reproducible; `None` draws it from the OS.
    ///
    /// # Errors
    /// `NotFinite` for NaN/∞ inputs; `Randomness`.
    pub fn encode<T: Copy + Into<f64> + Sync>(&self, values: &[T], seed: Option<u64>) -> Result<Packed> {
        let root = root_seed(seed)?;
        let layout = self.layout;
        let scale = self.scale();
        let alpha = self.alpha;
        let field_mask = (1u64 << (self.bits + 1)) - 1;
        let plaintexts = layout.plaintexts_for(values.len());
        let mut limbs = vec![0u64; plaintexts * layout.limbs];
        limbs.par_chunks_mut(layout.limbs.max(1)).zip(values.par_chunks(layout.slots)).enumerate().try_for_each(
            |(chunk, (plaintext, chunk_values))| {
                let mut rng = chunk_rng(&root, chunk);
                for (slot, value) in chunk_values.iter().enumerate() {
                    let value: f64 = (*value).into();
                    if !value.is_finite() {
                        return Err(Error::NotFinite { index: chunk * layout.slots + slot });
                    }
                    let code = stochastic_round(value.clamp(-alpha, alpha) * scale, &mut rng);
                    // Two's complement in r + 1 bits: bits r and r − 1 both carry the sign.
                    put(plaintext, layout.offset(slot), layout.slot_bits as usize, (code as u64) & field_mask);
                }
                Ok(())
            },
        )?;
        Ok(Packed { length: values.len(), limbs })
    }

    /// The integer codes [`BatchCryptCodec::encode`] packs for `values` under the same `seed`:
    /// clipped, scaled and stochastically rounded with the same per-plaintext generators, so a
    /// party that keeps its seed can re-derive exactly what it contributed (verification).
    ///
    /// # Errors
    /// `NotFinite` for NaN/∞ inputs; `Randomness`.
    pub fn codes<T: Copy + Into<f64> + Sync>(&self, values: &[T], seed: Option<u64>) -> Result<Vec<i64>> {
        let root = root_seed(seed)?;
        let (slots, scale, alpha) = (self.layout.slots, self.scale(), self.alpha);
        let mut out = vec![0i64; values.len()];
        out.par_chunks_mut(slots).zip(values.par_chunks(slots)).enumerate().try_for_each(|(chunk, (codes, chunk_values))| {
            let mut rng = chunk_rng(&root, chunk);
            for (slot, (code, value)) in codes.iter_mut().zip(chunk_values).enumerate() {
                let value: f64 = (*value).into();
                if !value.is_finite() {
                    return Err(Error::NotFinite { index: chunk * slots + slot });
                }
                *code = stochastic_round(value.clamp(-alpha, alpha) * scale, &mut rng);
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// Decodes the plaintext sum of `summands` packed vectors of `length` values.
    ///
    /// # Errors
    /// `TooManySummands` beyond 2^p; `Malformed` if `limbs` has the wrong size.
    pub fn decode(&self, limbs: &[u64], length: usize, summands: u64) -> Result<Decoded> {
        let layout = self.layout;
        if summands == 0 || summands > self.summand_capacity() {
            return Err(Error::TooManySummands { summands, capacity: self.summand_capacity() });
        }
        let expected = layout.plaintexts_for(length) * layout.limbs;
        if limbs.len() != expected {
            return Err(Error::Malformed(format!("{length} values need {expected} limbs, got {}", limbs.len())));
        }
        let field_bits = self.bits + 1;
        let field_mask = (1u64 << field_bits) - 1;
        let half = 1i64 << self.bits;
        let q = self.code_max();
        let scale = self.scale();
        let per_chunk: Vec<(Vec<i64>, Vec<usize>)> = limbs
            .par_chunks(layout.limbs.max(1))
            .enumerate()
            .map(|(chunk, plaintext)| {
                let first = chunk * layout.slots;
                let count = layout.slots.min(length - first);
                let mut codes = Vec::with_capacity(count);
                let mut overflow = Vec::new();
                for slot in 0..count {
                    let raw = get(plaintext, layout.offset(slot), layout.slot_bits as usize);
                    let t = (raw & field_mask) as i64;
                    let code = if t < half { t } else { t - 2 * half };
                    // Carries count negative summands, so they can never exceed `summands`.
                    let carries = raw >> field_bits;
                    if code.abs() > q || carries > summands {
                        overflow.push(first + slot);
                    }
                    codes.push(code);
                }
                (codes, overflow)
            })
            .collect();
        let mut codes = Vec::with_capacity(length);
        let mut overflow = Vec::new();
        for (chunk_codes, chunk_overflow) in per_chunk {
            codes.extend(chunk_codes);
            overflow.extend(chunk_overflow);
        }
        let values = codes.par_iter().map(|&code| code as f64 / scale).collect();
        Ok(Decoded { values, codes, overflow })
    }
}
