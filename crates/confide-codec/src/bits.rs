//! Slot layout shared by both codecs: slot j of a plaintext occupies bits
//! [w·(s−1−j), w·(s−j)), so the first value of a chunk is the most significant
//! (algorithms.md §2.4). Plaintexts are little-endian u64 limbs.

/// Writes `value` (< 2^width, width ≤ 64) at bit `offset`.
pub(crate) fn put(limbs: &mut [u64], offset: usize, width: usize, value: u64) {
    let word = offset / 64;
    let shift = offset % 64;
    limbs[word] |= value << shift;
    if shift + width > 64 {
        limbs[word + 1] |= value >> (64 - shift);
    }
}

/// Reads `width` (≤ 64) bits at bit `offset`.
pub(crate) fn get(limbs: &[u64], offset: usize, width: usize) -> u64 {
    let word = offset / 64;
    let shift = offset % 64;
    let mut value = limbs.get(word).copied().unwrap_or(0) >> shift;
    if shift + width > 64 {
        value |= limbs.get(word + 1).copied().unwrap_or(0) << (64 - shift);
    }
    if width == 64 {
        value
    } else {
        value & ((1u64 << width) - 1)
    }
}

/// ⌈log2 m⌉ for m ≥ 1 (0 for m = 1).
pub(crate) fn ceil_log2(m: u64) -> u32 {
    if m <= 1 {
        0
    } else {
        64 - (m - 1).leading_zeros()
    }
}

/// Geometry of a packing: slot width w and s slots per plaintext of at most k − 2 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Bits per slot.
    pub slot_bits: u32,
    /// Slots per plaintext.
    pub slots: usize,
    /// u64 limbs per plaintext (enough for slots · slot_bits bits).
    pub limbs: usize,
}

impl Layout {
    pub(crate) fn new(slot_bits: u32, plaintext_bits: u32) -> crate::Result<Self> {
        // Packed plaintexts stay below 2^(k−2) < n, and so does any sum that
        // respects the padding: no slot's carry can reach past bit s·w.
        if plaintext_bits < slot_bits + 2 {
            return Err(crate::error::invalid(
                "plaintext_bits",
                format!("a {plaintext_bits}-bit plaintext space cannot hold one {slot_bits}-bit slot"),
            ));
        }
        let slots = ((plaintext_bits - 2) / slot_bits) as usize;
        let limbs = (slots * slot_bits as usize).div_ceil(64);
        Ok(Layout { slot_bits, slots, limbs })
    }

    /// Bit offset of slot j.
    pub(crate) fn offset(&self, slot: usize) -> usize {
        self.slot_bits as usize * (self.slots - 1 - slot)
    }

    /// Plaintexts needed for `values` values.
    pub fn plaintexts_for(&self, values: usize) -> usize {
        values.div_ceil(self.slots)
    }
}
