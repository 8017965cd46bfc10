//! Linear tags for verifiable aggregation: inner products with public challenge vectors.
//!
//! The protocol is in `python/confide/protect/verify.py` (and docs/crypto.md, "Verifiable
//! aggregation"); this module is its hot path. A challenge vector is the AES-128-CTR keystream
//! under a 16-byte key with the initial counter block `vector · 2^64` (big-endian, as NIST SP
//! 800-38A), read as little-endian u32 words:
//!
//! * integer tags: `r_j = word_j & (2^31 − 1)` and `t = Σ r_j q_j mod p` with `p = 2^31 − 1`,
//!   where `q_j` is the signed value of a residue mod `2^bits` (the masking modes' fixed point);
//! * float tags: `r_j = word_j · 2^−31 − 1` in [−1, 1), and `(Σ r_j x_j, Σ |r_j| |x_j|)` in f64
//!   ([`check_float`]).
//!
//! Each product of a 31-bit `r` and a 32-bit offset value is below 2^63, so a u128 accumulator
//! holds any slice exactly; the offset is removed once at the end.

use aes::cipher::{KeyIvInit, StreamCipher};

use crate::error::{invalid, Result};

type Aes128Ctr = ctr::Ctr128BE<aes::Aes128>;

/// The prime integer tags are reduced by.
pub const TAG_PRIME: u64 = (1 << 31) - 1;

/// Values whose challenge words are drawn at once (a 16 KiB buffer).
const BLOCK: usize = 4096;

/// The keystream of challenge vector `vector` under `key`, as consecutive u32 words.
struct Challenge {
    cipher: Aes128Ctr,
    bytes: Vec<u8>,
}

impl Challenge {
    fn new(key: &[u8; 16], vector: u64) -> Self {
        let mut iv = [0u8; 16];
        iv[..8].copy_from_slice(&vector.to_be_bytes());
        Self { cipher: Aes128Ctr::new(key.into(), &iv.into()), bytes: vec![0u8; 4 * BLOCK] }
    }

    /// The next `count` (at most [`BLOCK`]) words.
    fn next(&mut self, count: usize) -> impl Iterator<Item = u32> + '_ {
        let bytes = &mut self.bytes[..4 * count];
        bytes.fill(0);
        self.cipher.apply_keystream(bytes);
        bytes.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
    }

    /// The next `out.len()` (at most [`BLOCK`]) words as integer challenges `word & (2^31 − 1)`;
    /// returns their sum.
    fn integers(&mut self, out: &mut [u32]) -> u64 {
        let (mut weight, count) = (0u64, out.len());
        for (d, r) in out.iter_mut().zip(self.next(count)) {
            *d = r & 0x7FFF_FFFF;
            weight += u64::from(*d);
        }
        weight
    }
}

/// `Σ r_j o_j` over one block (at most [`BLOCK`] values): each product of a 31-bit `r` and a
/// 32-bit `o` is split into its high and low 32 bits, so the two sums stay in u64 lanes (below
/// 2^44 for a block) that the compiler vectorizes, where a u128 accumulator would not. With AVX2
/// (detected at run time) four products a lane-instruction.
#[inline]
fn block_dot(r: &[u32], o: &[u32]) -> u128 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX2 (detected just above); the function is safe Rust otherwise.
        return unsafe { block_dot_avx2(r, o) };
    }
    block_dot_portable(r, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn block_dot_avx2(r: &[u32], o: &[u32]) -> u128 {
    block_dot_portable(r, o)
}

#[inline(always)]
fn block_dot_portable(r: &[u32], o: &[u32]) -> u128 {
    let (mut hi, mut lo) = (0u64, 0u64);
    for (&r, &o) in r.iter().zip(o) {
        let p = u64::from(r) * u64::from(o);
        hi += p >> 32;
        lo += p & 0xFFFF_FFFF;
    }
    (u128::from(hi) << 32) + u128::from(lo)
}

/// `encoded[j]`, `delivered[j]`: this party's value `j` encoded by `fixed`, and delivered word
/// `j`, both as offset values ([`offset32`]). AVX2 where the CPU has it, as [`block_dot`].
fn prepare<T: Copy + Into<f64>>(encoded: &mut [u32], delivered: &mut [u32], values: &[T], words: &[u32], fixed: FixedPoint, shift: u32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX2 (detected just above); the function is safe Rust otherwise.
        return unsafe { prepare_avx2(encoded, delivered, values, words, fixed, shift) };
    }
    prepare_portable(encoded, delivered, values, words, fixed, shift);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn prepare_avx2<T: Copy + Into<f64>>(
    encoded: &mut [u32],
    delivered: &mut [u32],
    values: &[T],
    words: &[u32],
    fixed: FixedPoint,
    shift: u32,
) {
    prepare_portable(encoded, delivered, values, words, fixed, shift);
}

#[inline(always)]
fn prepare_portable<T: Copy + Into<f64>>(
    encoded: &mut [u32],
    delivered: &mut [u32],
    values: &[T],
    words: &[u32],
    fixed: FixedPoint,
    shift: u32,
) {
    for ((e, d), (&x, &w)) in encoded.iter_mut().zip(delivered.iter_mut()).zip(values.iter().zip(words)) {
        *e = offset32(fixed.encode(x.into()), shift);
        *d = offset32(w, shift);
    }
}

/// A residue mod `2^bits` (`shift = 32 − bits`) as its signed value offset by 2^31, in [0, 2^32).
#[inline(always)]
fn offset32(word: u32, shift: u32) -> u32 {
    (((word << shift) as i32 >> shift) as u32) ^ 0x8000_0000
}

/// The first `count` words of challenge vector `vector` (for tests and the Python reference).
pub fn challenge_words(key: &[u8; 16], vector: u64, count: usize) -> Vec<u32> {
    let mut challenge = Challenge::new(key, vector);
    let mut out = Vec::with_capacity(count);
    let mut left = count;
    while left > 0 {
        let take = left.min(BLOCK);
        out.extend(challenge.next(take));
        left -= take;
    }
    out
}

/// `Σ r_j q_j mod p` for challenge vectors `0..vectors`, where `q_j` is `words[j]` read as a
/// signed residue mod `2^bits` (`bits` in 2..=32).
pub fn integer_tags(words: &[u32], bits: u32, key: &[u8; 16], vectors: usize) -> Result<Vec<u64>> {
    if !(2..=32).contains(&bits) {
        return Err(invalid("bits", format!("must be in [2, 32], got {bits}")));
    }
    let shift = 32 - bits;
    let mut out = Vec::with_capacity(vectors);
    let (mut drawn, mut offset) = (vec![0u32; BLOCK], vec![0u32; BLOCK]);
    for vector in 0..vectors {
        let mut challenge = Challenge::new(key, vector as u64);
        let (mut total, mut weight) = (0u128, 0u128);
        for block in words.chunks(BLOCK) {
            let n = block.len();
            for (o, &w) in offset.iter_mut().zip(block) {
                *o = offset32(w, shift);
            }
            weight += u128::from(challenge.integers(&mut drawn[..n]));
            total += block_dot(&drawn[..n], &offset[..n]);
        }
        out.push(reduce(total, weight));
    }
    Ok(out)
}

/// `total − 2^31 · weight` mod p: the offset of every value removed once.
fn reduce(total: u128, weight: u128) -> u64 {
    let prime = u128::from(TAG_PRIME);
    let removed = ((weight % prime) << 31) % prime;
    ((total % prime + prime - removed) % prime) as u64
}

/// The fixed-point encoding a masking mode sums (`confide.crypto.fixedpoint.FixedPoint`):
/// `round_half_even(clamp(x, −bound, bound) · scale) mod 2^bits`.
#[derive(Clone, Copy, Debug)]
pub struct FixedPoint {
    /// `2^fraction_bits`.
    pub scale: f64,
    /// The clipping bound.
    pub bound: f64,
    /// The ring's bits (2..=32).
    pub bits: u32,
}

impl FixedPoint {
    #[inline(always)]
    fn encode(&self, x: f64) -> u32 {
        // Round half to even without a libm call: adding and removing 1.5 * 2^52 leaves the
        // nearest integer (ties to even) for |v| < 2^51, far above any bound * scale (< 2^31).
        const MAGIC: f64 = 6_755_399_441_055_744.0;
        let v = x.clamp(-self.bound, self.bound) * self.scale;
        let q = ((v + MAGIC) - MAGIC) as i64;
        let masked = if self.bits < 32 { q & ((1i64 << self.bits) - 1) } else { q };
        masked as u32
    }
}

/// One slice's check, fused: the commitment hash of the delivered `payload`, then (with the
/// challenge drawn from it) the integer tags of the sum `words` and of this party's own values
/// encoded by `fixed`, in one pass over one keystream per vector.
///
/// The hash is `SHA-256(prefix | payload)`, `prefix` binding the job, round, attempt and slice.
pub struct SliceCheck {
    /// The commitment hash.
    pub digest: [u8; 32],
    /// `<r_k, S>` mod p for each vector.
    pub sums: Vec<u64>,
    /// `<r_k, q>` mod p of this party's own encoded values.
    pub tags: Vec<u64>,
}

/// The commitment hash of a delivered slice.
pub fn commitment(prefix: &[u8], payload: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(prefix);
    hasher.update(payload);
    hasher.finalize().into()
}

/// See [`SliceCheck`]; `values` are this party's (float) values of the slice, as many as `words`.
pub fn check_fixed_point<T: Copy + Into<f64>>(
    prefix: &[u8],
    payload: &[u8],
    words: &[u32],
    values: &[T],
    fixed: FixedPoint,
    vectors: usize,
) -> Result<SliceCheck> {
    if !(2..=32).contains(&fixed.bits) {
        return Err(invalid("bits", format!("must be in [2, 32], got {}", fixed.bits)));
    }
    if values.len() != words.len() {
        return Err(invalid("values", format!("holds {} values; the sum holds {}", values.len(), words.len())));
    }
    if !(fixed.scale.is_finite() && fixed.scale > 0.0 && fixed.bound.is_finite() && fixed.bound >= 0.0) {
        return Err(invalid("fixed point", "scale must be finite and > 0, bound finite and >= 0"));
    }
    let digest = commitment(prefix, payload);
    let mut key = [0u8; 16];
    key.copy_from_slice(&digest[..16]);
    let shift = 32 - fixed.bits;
    let mut challenges: Vec<Challenge> = (0..vectors).map(|k| Challenge::new(&key, k as u64)).collect();
    let (mut sum, mut own, mut weight) = (vec![0u128; vectors], vec![0u128; vectors], vec![0u128; vectors]);
    let (mut encoded, mut delivered, mut drawn) = (vec![0u32; BLOCK], vec![0u32; BLOCK], vec![0u32; BLOCK]);
    for (block, own_block) in words.chunks(BLOCK).zip(values.chunks(BLOCK)) {
        let n = block.len();
        // The delivered words and this party's encoding of the block, once for every vector.
        prepare(&mut encoded[..n], &mut delivered[..n], own_block, block, fixed, shift);
        for (k, challenge) in challenges.iter_mut().enumerate() {
            weight[k] += u128::from(challenge.integers(&mut drawn[..n]));
            sum[k] += block_dot(&drawn[..n], &delivered[..n]);
            own[k] += block_dot(&drawn[..n], &encoded[..n]);
        }
    }
    let sums = (0..vectors).map(|k| reduce(sum[k], weight[k])).collect();
    let tags = (0..vectors).map(|k| reduce(own[k], weight[k])).collect();
    Ok(SliceCheck { digest, sums, tags })
}

/// The float modes' fused check: the commitment hash, `<r_k, S>` of the float32 sum `sums`, and
/// `(<r_k, x>, <|r_k|, |x|>)` of this party's float32 image `values`.
pub fn check_float(prefix: &[u8], payload: &[u8], sums: &[f32], values: &[f32], vectors: usize) -> Result<(SliceCheckFloat, [u8; 32])> {
    if values.len() != sums.len() {
        return Err(invalid("values", format!("holds {} values; the sum holds {}", values.len(), sums.len())));
    }
    let digest = commitment(prefix, payload);
    let mut key = [0u8; 16];
    key.copy_from_slice(&digest[..16]);
    let mut out = SliceCheckFloat::default();
    for vector in 0..vectors {
        let mut challenge = Challenge::new(&key, vector as u64);
        let (mut sum, mut tag, mut weight) = (0f64, 0f64, 0f64);
        for (block, own) in sums.chunks(BLOCK).zip(values.chunks(BLOCK)) {
            for ((&s, &x), r) in block.iter().zip(own).zip(challenge.next(block.len())) {
                let r = f64::from(r) * (1.0 / 2_147_483_648.0) - 1.0;
                sum += r * f64::from(s);
                tag += r * f64::from(x);
                weight += r.abs() * f64::from(x).abs();
            }
        }
        out.sums.push(sum);
        out.tags.push(tag);
        out.weights.push(weight);
    }
    Ok((out, digest))
}

/// What [`check_float`] computes for one slice (besides the hash).
#[derive(Debug, Default)]
pub struct SliceCheckFloat {
    /// `<r_k, S>`.
    pub sums: Vec<f64>,
    /// `<r_k, x>`.
    pub tags: Vec<f64>,
    /// `<|r_k|, |x|>`.
    pub weights: Vec<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(words: &[u32], bits: u32, key: &[u8; 16], vector: u64) -> u64 {
        let r = challenge_words(key, vector, words.len());
        let modulus = 1i128 << bits;
        let mut total = 0i128;
        for (&w, &r) in words.iter().zip(&r) {
            let mut q = i128::from(w) % modulus;
            if q >= modulus / 2 {
                q -= modulus;
            }
            total += i128::from(r & 0x7FFF_FFFF) * q;
        }
        total.rem_euclid(i128::from(TAG_PRIME)) as u64
    }

    #[test]
    fn integer_tags_match_a_big_integer_reference() {
        let key = [7u8; 16];
        for bits in [2u32, 17, 31, 32] {
            let words: Vec<u32> = (0..10_000u32).map(|i| i.wrapping_mul(2_654_435_761) >> (32 - bits)).collect();
            let tags = integer_tags(&words, bits, &key, 2).expect("bits in range");
            assert_eq!(tags, vec![reference(&words, bits, &key, 0), reference(&words, bits, &key, 1)]);
        }
    }

    #[test]
    fn tags_are_linear_in_the_values() {
        let key = [3u8; 16];
        // Signed values in [-2^29, 2^29): their sum stays inside the 32-bit ring.
        let a: Vec<u32> = (0..5000u32).map(|i| (i.wrapping_mul(7919) as i32 >> 2) as u32).collect();
        let b: Vec<u32> = (0..5000u32).map(|i| ((i.wrapping_mul(104_729) ^ 0xDEAD) as i32 >> 2) as u32).collect();
        let sum: Vec<u32> = a.iter().zip(&b).map(|(x, y)| x.wrapping_add(*y)).collect();
        let ta = integer_tags(&a, 32, &key, 2).expect("bits");
        let tb = integer_tags(&b, 32, &key, 2).expect("bits");
        let ts = integer_tags(&sum, 32, &key, 2).expect("bits");
        for k in 0..2 {
            assert_eq!((ta[k] + tb[k]) % TAG_PRIME, ts[k]);
        }
    }

    #[test]
    fn the_fused_check_equals_its_parts() {
        let fixed = FixedPoint { scale: 2f64.powi(20), bound: 4.0, bits: 27 };
        let values: Vec<f32> = (0..7000).map(|i| ((i as f32) * 0.013).sin() * 5.0).collect();
        let own: Vec<u32> = values.iter().map(|&x| fixed.encode(f64::from(x))).collect();
        let sum: Vec<u32> = own.iter().map(|w| w.wrapping_mul(3) & ((1 << 27) - 1)).collect();
        let payload = b"delivered slice";
        let check = check_fixed_point(b"prefix", payload, &sum, &values, fixed, 2).expect("valid");
        assert_eq!(check.digest, commitment(b"prefix", payload));
        let mut key = [0u8; 16];
        key.copy_from_slice(&check.digest[..16]);
        assert_eq!(check.sums, integer_tags(&sum, 27, &key, 2).expect("bits"));
        assert_eq!(check.tags, integer_tags(&own, 27, &key, 2).expect("bits"));
        // Rounding half to even, as numpy's rint, and clipping at the bound.
        assert_eq!(fixed.encode(2.5 / fixed.scale), 2);
        assert_eq!(fixed.encode(3.5 / fixed.scale), 4);
        assert_eq!(fixed.encode(9.0), (4.0 * fixed.scale) as u32);
    }

    #[test]
    fn bits_out_of_range_are_refused() {
        assert!(integer_tags(&[1, 2], 1, &[0u8; 16], 1).is_err());
        assert!(integer_tags(&[1, 2], 33, &[0u8; 16], 1).is_err());
        let fixed = FixedPoint { scale: 1.0, bound: 1.0, bits: 40 };
        assert!(check_fixed_point(b"", b"", &[1], &[0.5f32], fixed, 2).is_err());
        let fixed = FixedPoint { scale: 1.0, bound: 1.0, bits: 32 };
        assert!(check_fixed_point(b"", b"", &[1, 2], &[0.5f32], fixed, 2).is_err());
    }

    #[test]
    fn float_checks_follow_the_challenge() {
        let values: Vec<f32> = (0..9000).map(|i| (i as f32 * 0.37).sin()).collect();
        let sums: Vec<f32> = values.iter().map(|v| 3.0 * v).collect();
        let (check, digest) = check_float(b"prefix", b"payload", &sums, &values, 2).expect("same lengths");
        let mut key = [0u8; 16];
        key.copy_from_slice(&digest[..16]);
        let words = challenge_words(&key, 1, values.len());
        let (mut tag, mut weight, mut sum) = (0f64, 0f64, 0f64);
        for ((&x, &s), &w) in values.iter().zip(&sums).zip(&words) {
            let r = f64::from(w) / 2_147_483_648.0 - 1.0;
            tag += r * f64::from(x);
            weight += r.abs() * f64::from(x).abs();
            sum += r * f64::from(s);
        }
        assert!((check.tags[1] - tag).abs() < 1e-9 && (check.weights[1] - weight).abs() < 1e-9);
        assert!((check.sums[1] - sum).abs() < 1e-9);
        assert!(check_float(b"", b"", &sums[..2], &values[..3], 2).is_err());
    }
}
