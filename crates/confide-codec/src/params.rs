//! Codec parameters as TLV bytes for the `params` field of a ciphertext block
//! (algorithms.md §1.9): tag u8 ‖ len u8 ‖ big-endian value. All of them are
//! public metadata; they carry the codec, the vector length and how many
//! vectors were summed into the block.

use crate::batchcrypt::{BatchCryptCodec, Quantizer};
use crate::error::{Error, Result};
use crate::flbooster::FlBoosterCodec;

/// A codec of either kind.
#[derive(Clone, Debug, PartialEq)]
pub enum Codec {
    /// BatchCrypt (§2).
    BatchCrypt(BatchCryptCodec),
    /// FLBooster (§3).
    FlBooster(FlBoosterCodec),
}

const TAG_BITS: u8 = 1;
const TAG_SUMMANDS_MAX: u8 = 2;
const TAG_ALPHA: u8 = 3;
const TAG_QUANTIZER: u8 = 4;
const TAG_LENGTH: u8 = 5;
const TAG_SUMMED: u8 = 6;
const TAG_PLAINTEXT_BITS: u8 = 7;

/// Serializes codec, vector length and number of summed vectors.
pub fn to_params(codec: &Codec, plaintext_bits: u32, length: u64, summed: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut put = |tag: u8, value: &[u8]| {
        out.push(tag);
        out.push(value.len() as u8);
        out.extend_from_slice(value);
    };
    let (bits, max_summands, alpha) = match codec {
        Codec::BatchCrypt(c) => (c.bits(), c.max_summands(), c.alpha()),
        Codec::FlBooster(c) => (c.bits(), c.max_summands(), c.alpha()),
    };
    put(TAG_BITS, &[bits as u8]);
    put(TAG_SUMMANDS_MAX, &max_summands.to_be_bytes());
    put(TAG_ALPHA, &alpha.to_bits().to_be_bytes());
    if let Codec::BatchCrypt(c) = codec {
        put(TAG_QUANTIZER, &[u8::from(c.quantizer() == Quantizer::Paper)]);
    }
    put(TAG_LENGTH, &length.to_be_bytes());
    put(TAG_SUMMED, &summed.to_be_bytes());
    put(TAG_PLAINTEXT_BITS, &plaintext_bits.to_be_bytes());
    out
}

fn be_u64(value: &[u8], field: &str) -> Result<u64> {
    if value.is_empty() || value.len() > 8 {
        return Err(Error::Malformed(format!("codec parameter {field} must have 1 to 8 bytes, got {}", value.len())));
    }
    Ok(value.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
}

/// Parses TLV parameters for a codec of kind `batchcrypt` (else FLBooster).
/// Returns (codec, plaintext_bits, length, summed).
///
/// # Errors
/// `Malformed` for truncated or missing fields; codec construction errors.
pub fn from_params(bytes: &[u8], batchcrypt: bool) -> Result<(Codec, u32, u64, u64)> {
    let (mut bits, mut max_summands, mut alpha, mut paper, mut length, mut summed, mut plaintext_bits) =
        (None, None, None, false, None, None, None);
    let mut position = 0;
    while position < bytes.len() {
        if position + 2 > bytes.len() {
            return Err(Error::Malformed("codec parameters truncated in a tag header".into()));
        }
        let (tag, len) = (bytes[position], bytes[position + 1] as usize);
        let value =
            bytes.get(position + 2..position + 2 + len).ok_or_else(|| Error::Malformed(format!("codec parameter tag {tag} truncated")))?;
        position += 2 + len;
        match tag {
            TAG_BITS => bits = Some(be_u64(value, "bits")? as u32),
            TAG_SUMMANDS_MAX => max_summands = Some(be_u64(value, "max_summands")? as u32),
            TAG_ALPHA => alpha = Some(f64::from_bits(be_u64(value, "alpha")?)),
            TAG_QUANTIZER => paper = be_u64(value, "quantizer")? == 1,
            TAG_LENGTH => length = Some(be_u64(value, "length")?),
            TAG_SUMMED => summed = Some(be_u64(value, "summed")?),
            TAG_PLAINTEXT_BITS => plaintext_bits = Some(be_u64(value, "plaintext_bits")? as u32),
            other => return Err(Error::Malformed(format!("unknown codec parameter tag {other}"))),
        }
    }
    let missing = |field: &str| Error::Malformed(format!("codec parameter {field} missing"));
    let (bits, max_summands, alpha) = (
        bits.ok_or_else(|| missing("bits"))?,
        max_summands.ok_or_else(|| missing("max_summands"))?,
        alpha.ok_or_else(|| missing("alpha"))?,
    );
    let plaintext_bits = plaintext_bits.ok_or_else(|| missing("plaintext_bits"))?;
    let codec = if batchcrypt {
        let quantizer = if paper { Quantizer::Paper } else { Quantizer::ExactBound };
        Codec::BatchCrypt(BatchCryptCodec::new(bits, max_summands, alpha, plaintext_bits, quantizer)?)
    } else {
        Codec::FlBooster(FlBoosterCodec::new(bits, max_summands, alpha, plaintext_bits)?)
    };
    Ok((codec, plaintext_bits, length.ok_or_else(|| missing("length"))?, summed.ok_or_else(|| missing("summed"))?))
}
