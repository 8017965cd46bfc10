//! FLBooster encoding-quantization and batch compression (algorithms.md §3),
//! for comparison with BatchCrypt. Offset binary, unsigned:
//! q = round((clip(x, −α, α) + α)/(2α) · (2^r − 1)) under b = ⌈log2 p⌉ zero
//! bits (Eq. 7 with the missing division by 2α restored), slots of r + b bits,
//! ⌊(k − 2)/(r + b)⌋ per plaintext. Decoding a sum of c vectors needs c:
//! Σx ≈ Z·2α/(2^r − 1) − c·α. Deterministic rounding, no overflow detection.

use crate::bits::{ceil_log2, get, put, Layout};
use crate::error::{invalid, Error, Result};
use rayon::prelude::*;

pub use crate::batchcrypt::Packed;

/// An FLBooster codec bound to a plaintext size.
#[derive(Clone, Debug, PartialEq)]
pub struct FlBoosterCodec {
    bits: u32,
    max_summands: u32,
    alpha: f64,
    padding_bits: u32,
    layout: Layout,
}

impl FlBoosterCodec {
    /// `bits` = r (1..=48), `max_summands` = p, `alpha` > 0, `plaintext_bits` = k.
    ///
    /// # Errors
    /// `InvalidParameter` naming the field and its limit.
    pub fn new(bits: u32, max_summands: u32, alpha: f64, plaintext_bits: u32) -> Result<Self> {
        if !(1..=48).contains(&bits) {
            return Err(invalid("bits", format!("must be in 1..=48, got {bits}")));
        }
        if !(1..=crate::batchcrypt::MAX_SUMMANDS).contains(&max_summands) {
            return Err(invalid("max_summands", format!("must be in 1..={}, got {max_summands}", crate::batchcrypt::MAX_SUMMANDS)));
        }
        if !(alpha.is_finite() && alpha > 0.0) {
            return Err(invalid("alpha", format!("must be finite and > 0, got {alpha}")));
        }
        let padding_bits = ceil_log2(u64::from(max_summands));
        let layout = Layout::new(bits + padding_bits, plaintext_bits)?;
        Ok(FlBoosterCodec { bits, max_summands, alpha, padding_bits, layout })
    }

    /// Packing geometry.
    pub fn layout(&self) -> Layout {
        self.layout
    }
    /// Quantization width r.
    pub fn bits(&self) -> u32 {
        self.bits
    }
    /// Declared number of summands p.
    pub fn max_summands(&self) -> u32 {
        self.max_summands
    }
    /// Clipping bound α.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    fn levels(&self) -> f64 {
        ((1u64 << self.bits) - 1) as f64
    }

    /// Quantizes (round to nearest) and packs.
    ///
    /// # Errors
    /// `NotFinite` for NaN/∞ inputs.
    pub fn encode<T: Copy + Into<f64> + Sync>(&self, values: &[T]) -> Result<Packed> {
        let layout = self.layout;
        let (alpha, levels) = (self.alpha, self.levels());
        let mut limbs = vec![0u64; layout.plaintexts_for(values.len()) * layout.limbs];
        limbs.par_chunks_mut(layout.limbs.max(1)).zip(values.par_chunks(layout.slots)).enumerate().try_for_each(
            |(chunk, (plaintext, chunk_values))| {
                for (slot, value) in chunk_values.iter().enumerate() {
                    let value: f64 = (*value).into();
                    if !value.is_finite() {
                        return Err(Error::NotFinite { index: chunk * layout.slots + slot });
                    }
                    let code = ((value.clamp(-alpha, alpha) + alpha) / (2.0 * alpha) * levels).round() as u64;
                    put(plaintext, layout.offset(slot), layout.slot_bits as usize, code);
                }
                Ok(())
            },
        )?;
        Ok(Packed { length: values.len(), limbs })
    }

    /// Decodes the sum of exactly `summands` vectors.
    ///
    /// # Errors
    /// `TooManySummands` beyond 2^b; `Malformed` for a wrong limb count.
    pub fn decode(&self, limbs: &[u64], length: usize, summands: u64) -> Result<Vec<f64>> {
        let layout = self.layout;
        let capacity = 1u64 << self.padding_bits;
        if summands == 0 || summands > capacity {
            return Err(Error::TooManySummands { summands, capacity });
        }
        let expected = layout.plaintexts_for(length) * layout.limbs;
        if limbs.len() != expected {
            return Err(Error::Malformed(format!("{length} values need {expected} limbs, got {}", limbs.len())));
        }
        let step = 2.0 * self.alpha / self.levels();
        let offset = summands as f64 * self.alpha;
        Ok((0..length)
            .into_par_iter()
            .map(|i| {
                let plaintext = &limbs[(i / layout.slots) * layout.limbs..][..layout.limbs];
                let z = get(plaintext, layout.offset(i % layout.slots), layout.slot_bits as usize);
                z as f64 * step - offset
            })
            .collect())
    }
}
