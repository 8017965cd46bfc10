//! Two message lanes in every coefficient mod the 62-bit prime `Q`: the lattice mode's ciphertexts.
//!
//! `b = a * s + e + 2^d * (x_0 + 2^w * x_1)  (mod Q)`, one coefficient for two values. Each lane is
//! `w` bits wide: a value of `bits` bits plus `ceil(log2 m)` bits of headroom, so the sum of `m`
//! parties' lanes never carries into the next lane and the packed sum stays under `2^(2w)`: it never
//! wraps mod `Q` and needs no plaintext modulus. The scale `2^d` (`d = 61 - 2w`) leaves the summed
//! error `m * eta` a quarter of it: half for rounding, and a spare bit for the decryption check.
//!
//! Against one value a word mod `2^32` (the mode's first form: exact products through a forward
//! and an inverse NTT per `n` values) this halves the ring products per value and lets `a` be
//! drawn straight in the NTT domain (uniform mod a prime is uniform in
//! either domain), so a block costs one inverse NTT for `2n` values instead of a forward and an
//! inverse for `n`; and the public polynomial and the errors come from AES-128 in counter mode
//! (AES-NI) instead of SHAKE128. Eight bytes a coefficient are four a value, those of float32.

use crate::shamir::MAX_PARTIES;
use crate::{add_mod, lift, sub_mod, xof, KeyNtt, LatticeError, Ring, Q};
use aes::cipher::{KeyIvInit, StreamCipher};
use rand_core::{CryptoRng, RngCore};
use sha3::digest::XofReader;
use zeroize::Zeroize;

type Aes128Ctr = ctr::Ctr128BE<aes::Aes128>;

/// Values in one coefficient.
pub const LANES: usize = 2;

/// Bits of the packed plaintext and its scale: `2^(d + 2w) <= 2^61 < Q`.
const PLAINTEXT_AND_SCALE_BITS: u32 = 61;

fn bit_length(value: u64) -> u32 {
    64 - value.leading_zeros()
}

/// The lanes of one round: `bits` per value, lanes of `lane_bits`, scale `2^scale_bits`, for the sum
/// of at most `parties` ciphertexts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packing {
    pub bits: u32,
    pub lane_bits: u32,
    pub scale_bits: u32,
    pub parties: usize,
    eta: u32,
}

impl Packing {
    /// Checked: `bits` in `[1, 30]`, `parties` in `[1, 32760]`, and the summed error of `parties`
    /// ciphertexts (`parties * eta`) at most a quarter of the scale.
    pub fn new(bits: u32, parties: usize, eta: u32) -> Result<Self, LatticeError> {
        if !(1..=30).contains(&bits) {
            return Err(LatticeError::PlaintextBits(bits));
        }
        if parties == 0 || parties > MAX_PARTIES {
            return Err(LatticeError::Threshold { threshold: 1, parties });
        }
        let lane_bits = bits + bit_length(parties as u64 - 1);
        let used = LANES as u32 * lane_bits;
        let scale_bits = PLAINTEXT_AND_SCALE_BITS.saturating_sub(used);
        let bound = parties as u64 * eta as u64;
        if used >= PLAINTEXT_AND_SCALE_BITS || 4 * bound > 1u64 << scale_bits {
            return Err(LatticeError::Noise { parties, bound, margin: (1u64 << scale_bits) / 4 });
        }
        Ok(Self { bits, lane_bits, scale_bits, parties, eta })
    }

    /// The widest values `parties` ciphertexts can carry (0 where none fit).
    pub fn max_bits(parties: usize, eta: u32) -> u32 {
        if parties == 0 || parties > MAX_PARTIES {
            return 0;
        }
        let scale_bits = bit_length(4 * parties as u64 * eta as u64 - 1);
        let lane_bits = (PLAINTEXT_AND_SCALE_BITS - scale_bits) / LANES as u32;
        lane_bits.saturating_sub(bit_length(parties as u64 - 1)).min(30)
    }

    /// Coefficients a vector of `len` values takes.
    pub fn coefficients(len: usize) -> usize {
        len.div_ceil(LANES)
    }

    fn check_values(&self, values: &[u32]) -> Result<(), LatticeError> {
        match values.iter().position(|&v| (v as u64) >> self.bits != 0) {
            Some(index) => Err(LatticeError::Message { index, value: values[index] as u64, bits: self.bits }),
            None => Ok(()),
        }
    }
}

/// The AES-128-CTR stream under ``key`` from counter 0 (NIST SP 800-38A, big-endian counter).
fn stream(key: &[u8; 16]) -> Aes128Ctr {
    Aes128Ctr::new(key.into(), &[0u8; 16].into())
}

/// Fills ``buf`` with the next keystream bytes.
fn keystream(cipher: &mut Aes128Ctr, buf: &mut [u8]) {
    buf.fill(0);
    cipher.apply_keystream(buf);
}

/// A centred binomial error from 64 random bits: two sums of `eta` bits, subtracted.
fn binomial(bits: u64, mask: u64) -> i64 {
    (bits & mask).count_ones() as i64 - ((bits >> 32) & mask).count_ones() as i64
}

impl Ring {
    /// Public polynomial ``index`` of a round, in the NTT domain mod `Q`.
    ///
    /// AES-128-CTR from counter 0 under the first 16 bytes of SHAKE128(tag, seed, index), cut into
    /// little-endian 8-byte words, each masked to 62 bits and kept if under `Q` (rejection on public
    /// randomness; a word is rejected with probability `2^-26`).
    pub fn public_poly_packed(&self, seed: &[u8; 32], index: u64) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.params.n);
        self.public_poly_into(seed, index, &mut out, &mut vec![0u8; 8 * self.params.n]);
        out
    }

    /// [`Ring::public_poly_packed`] into ``out`` (emptied first), through ``bytes`` (`8n` of them):
    /// the block loops reuse both.
    fn public_poly_into(&self, seed: &[u8; 32], index: u64, out: &mut Vec<u64>, bytes: &mut [u8]) {
        let mut key = [0u8; 16];
        xof(b"confide-lattice/a62-aes/v1", seed, index).read(&mut key);
        let mut cipher = stream(&key);
        let n = self.params.n;
        out.clear();
        while out.len() < n {
            let wanted = n - out.len();
            keystream(&mut cipher, &mut bytes[..8 * wanted]);
            for chunk in bytes[..8 * wanted].chunks_exact(8) {
                let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes")) & ((1u64 << 62) - 1);
                if word < Q {
                    out.push(word);
                }
            }
        }
    }

    /// ``values`` (each under `2^bits`) encrypted under ``key``, two to a coefficient: block `k` of
    /// `2n` values with the public polynomial `(seed, (slice << 24) | k)`, the last block cut to
    /// the values it holds (`Packing::coefficients(values.len())` words, each under `Q`).
    pub fn encrypt_packed<R: RngCore + CryptoRng>(
        &self,
        seed: &[u8; 32],
        slice: u32,
        key: &KeyNtt,
        values: &[u32],
        packing: &Packing,
        rng: &mut R,
    ) -> Result<Vec<u64>, LatticeError> {
        packing.check_values(values)?;
        self.check_len("the key", key.values().len())?;
        let n = self.params.n;
        let (w, d) = (packing.lane_bits, packing.scale_bits);
        let mask = (1u64 << self.params.eta) - 1;
        let mut noise_key = [0u8; 16];
        rng.fill_bytes(&mut noise_key);
        let mut noise = stream(&noise_key);
        noise_key.zeroize();
        let mut noise_bytes = vec![0u8; 8 * n];
        let (mut product, mut public_bytes) = (Vec::with_capacity(n), vec![0u8; 8 * n]);
        let mut out = Vec::with_capacity(Packing::coefficients(values.len()));
        for (k, block) in values.chunks(LANES * n).enumerate() {
            self.public_poly_into(seed, ((slice as u64) << 24) | k as u64, &mut product, &mut public_bytes);
            self.plan.mul_assign_normalize(&mut product, key.values());
            self.plan.inv(&mut product);
            let words = block.len().div_ceil(LANES);
            keystream(&mut noise, &mut noise_bytes[..8 * words]);
            for ((&p, pair), bits) in product.iter().zip(block.chunks(LANES)).zip(noise_bytes.chunks_exact(8)) {
                let high = pair.get(1).copied().unwrap_or(0) as u64;
                let message = (pair[0] as u64 | high << w) << d;
                let error = binomial(u64::from_le_bytes(bits.try_into().expect("8 bytes")), mask);
                out.push(add_mod(add_mod(p, lift(error)), message));
            }
        }
        noise_bytes.zeroize();
        product.zeroize(); // a*s gives the key away to whoever knows a
        Ok(out)
    }

    /// The first ``len`` values of a sum of `keys.parties()` packed ciphertexts of slice ``slice``,
    /// each reduced mod `2^bits` (a sum that wraps there wraps as the masking modes' words do).
    ///
    /// Checked: every coefficient's error, what rounding removes, must lie within the sum of the
    /// parties' error bounds (`parties * eta`: a centred binomial error never exceeds `eta`), and the
    /// packed sum under `2^(2w)`. A key sum rebuilt from a wrong share, or a sum that is not of
    /// ciphertexts under those keys, leaves the residue uniform mod `Q`: past the bound for at
    /// least half of the coefficients, refused ([`LatticeError::Residual`]) rather than decrypted to
    /// noise. A word outside `[0, Q)` counts as wrong.
    pub fn decrypt_packed(
        &self,
        seed: &[u8; 32],
        slice: u32,
        keys: &KeyNtt,
        total: &[u64],
        packing: &Packing,
        len: usize,
    ) -> Result<Vec<u32>, LatticeError> {
        let mut out = Vec::with_capacity(LANES * total.len());
        let wrong = self.decrypt_packed_into(seed, slice, keys, total, packing, len, Some(&mut out))?;
        if wrong > 0 {
            let bound = keys.parties() as u64 * self.params.eta as u64;
            return Err(LatticeError::Residual { wrong, of: total.len(), bound });
        }
        out.truncate(len);
        Ok(out)
    }

    /// How many coefficients of ``total`` decrypt with an error past the parties' bound under
    /// ``keys`` (0: the key sum and the sum agree); nothing is decrypted out.
    pub fn residual_packed(
        &self,
        seed: &[u8; 32],
        slice: u32,
        keys: &KeyNtt,
        total: &[u64],
        packing: &Packing,
        len: usize,
    ) -> Result<usize, LatticeError> {
        self.decrypt_packed_into(seed, slice, keys, total, packing, len, None)
    }

    #[allow(clippy::too_many_arguments)]
    fn decrypt_packed_into(
        &self,
        seed: &[u8; 32],
        slice: u32,
        keys: &KeyNtt,
        total: &[u64],
        packing: &Packing,
        len: usize,
        mut out: Option<&mut Vec<u32>>,
    ) -> Result<usize, LatticeError> {
        let n = self.params.n;
        self.check_len("the key sum", keys.values().len())?;
        let expected = Packing::coefficients(len);
        if total.len() != expected {
            return Err(LatticeError::Length { what: "the summed slice", got: total.len(), expected });
        }
        if keys.parties() > packing.parties {
            let bound = keys.parties() as u64 * packing.eta as u64;
            return Err(LatticeError::Noise { parties: keys.parties(), bound, margin: (1u64 << packing.scale_bits) / 4 });
        }
        let (w, d) = (packing.lane_bits, packing.scale_bits);
        let bound = keys.parties() as u64 * self.params.eta as u64;
        let low = (1u64 << d) - 1;
        let value_mask = (1u64 << packing.bits) - 1;
        let mut wrong = 0usize;
        let (mut product, mut public_bytes) = (Vec::with_capacity(n), vec![0u8; 8 * n]);
        for (k, block) in total.chunks(n).enumerate() {
            self.public_poly_into(seed, ((slice as u64) << 24) | k as u64, &mut product, &mut public_bytes);
            self.plan.mul_assign_normalize(&mut product, keys.values());
            self.plan.inv(&mut product);
            for (&b, &p) in block.iter().zip(&product) {
                let in_range = b < Q;
                // Delta * M + e + bound, with e + bound in [0, 2 * bound] when the sum is right
                let shifted = add_mod(sub_mod(b % Q, p), bound);
                let packed = shifted >> d;
                wrong += (!in_range || shifted & low > 2 * bound || packed >> (LANES as u32 * w) != 0) as usize;
                if let Some(out) = out.as_deref_mut() {
                    out.push((packed & value_mask) as u32);
                    out.push(((packed >> w) & value_mask) as u32);
                }
            }
        }
        product.zeroize();
        Ok(wrong)
    }
}

/// The aggregator's fold of one packed slice: ``acc += words (mod Q)``, little-endian 8-byte words.
///
/// Every word must lie in `[0, Q)`; otherwise nothing is added and the error gives the first one
/// out of range (its index and value), so a bad arrival never spoils the running sum.
pub fn fold_words(acc: &mut [u64], words: &[u8]) -> Result<(), (usize, u64)> {
    const CHUNK: usize = 2048; // 16 KiB of words, added and checked in one pass while in cache
    let word = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8 bytes"));
    if words.len() != 8 * acc.len() {
        return Err((acc.len().min(words.len() / 8), words.len() as u64));
    }
    // AVX2 where the host has it, picked at run time (an AVX-512 build of the same body measured
    // no faster here: 0.75x the float32 fold either way, the copy and the check included)
    let arch = pulp::Arch::new();
    let mut saved = [0u64; CHUNK];
    for (done, (acc_chunk, bytes)) in acc.chunks_mut(CHUNK).zip(words.chunks(8 * CHUNK)).enumerate() {
        saved[..acc_chunk.len()].copy_from_slice(acc_chunk);
        if arch.dispatch(|| add_words(acc_chunk, bytes)) != 0 {
            acc_chunk.copy_from_slice(&saved[..acc_chunk.len()]);
            // take back what the chunks before it added: the running sum is as it was
            for (x, c) in
                acc.chunks_mut(CHUNK).zip(words.chunks(8 * CHUNK)).take(done).flat_map(|(a, b)| a.iter_mut().zip(b.chunks_exact(8)))
            {
                *x = sub_mod(*x, word(c));
            }
            let at = bytes.chunks_exact(8).position(|c| word(c) >= Q).expect("a word at least Q");
            let index = done * CHUNK + at;
            return Err((index, word(&words[8 * index..8 * index + 8])));
        }
    }
    Ok(())
}

/// `acc += words (mod Q)`, and a non-zero result where a word is at least `Q` (then ``acc`` holds
/// garbage and the caller restores it).
///
/// The sum: `s - Q`, plus `Q` back where that went below zero (its bit 63), both under `2^63` for
/// words under `Q`; the data is public, so the select need not be hidden. The check: bit 63 of
/// `!(w - Q) | w` is set exactly when `w >= Q`. Shifts, ors and 64-bit additions only, which
/// vectorize on every x86-64 level (unlike 64-bit compares before AVX-512).
#[inline(always)]
fn add_words(acc: &mut [u64], bytes: &[u8]) -> u64 {
    let mut bad = 0u64;
    for (x, c) in acc.iter_mut().zip(bytes.chunks_exact(8)) {
        let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        bad |= (!w.wrapping_sub(Q) | w) >> 63;
        let r = x.wrapping_add(w).wrapping_sub(Q);
        *x = r.wrapping_add(Q & 0u64.wrapping_sub(r >> 63));
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{os_rng, KeySum, Params, SecretKey};

    fn ring() -> Ring {
        Ring::new(Params::new(4096, 16).unwrap())
    }

    #[test]
    fn max_bits_fit_and_one_more_does_not() {
        for parties in [1, 2, 3, 4, 10, 200, 1000, 32760] {
            let bits = Packing::max_bits(parties, 21);
            if bits == 0 {
                continue;
            }
            Packing::new(bits, parties, 21).unwrap();
            if bits < 30 {
                assert!(Packing::new(bits + 1, parties, 21).is_err(), "{parties} parties, {bits} bits");
            }
        }
        assert_eq!(Packing::max_bits(3, 21), 24);
        assert_eq!(Packing::max_bits(200, 21), 15);
    }

    #[test]
    fn sum_at_the_lane_limits_is_exact() {
        let ring = ring();
        let mut rng = os_rng().unwrap();
        for parties in [2usize, 3, 10] {
            let bits = Packing::max_bits(parties, 21);
            let packing = Packing::new(bits, parties, 21).unwrap();
            let top = (1u32 << bits) - 1;
            let len = 2 * 4096 + 3; // two whole blocks and a cut one, with an odd value left
            let keys: Vec<SecretKey> = (0..parties).map(|_| ring.secret_key(&mut rng)).collect();
            let seed = [3u8; 32];
            let mut total = vec![0u64; Packing::coefficients(len)];
            let mut expected = vec![0u64; len];
            for (i, key) in keys.iter().enumerate() {
                let values: Vec<u32> = (0..len).map(|j| if (i + j) % 3 == 0 { top } else { (j as u32 * 7919) & top }).collect();
                for (e, &v) in expected.iter_mut().zip(&values) {
                    *e += v as u64;
                }
                let words = ring.encrypt_packed(&seed, 5, &ring.key_ntt(key), &values, &packing, &mut rng).unwrap();
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                fold_words(&mut total, &bytes).unwrap();
            }
            let sum = ring.key_sum_ntt(&KeySum::of(&keys));
            let got = ring.decrypt_packed(&seed, 5, &sum, &total, &packing, len).unwrap();
            let want: Vec<u32> = expected.iter().map(|&e| (e & ((1u64 << bits) - 1)) as u32).collect();
            assert_eq!(got, want, "{parties} parties");
        }
    }

    #[test]
    fn a_wrong_key_sum_or_slice_is_refused() {
        let ring = ring();
        let mut rng = os_rng().unwrap();
        let packing = Packing::new(Packing::max_bits(3, 21), 3, 21).unwrap();
        let keys: Vec<SecretKey> = (0..3).map(|_| ring.secret_key(&mut rng)).collect();
        let seed = [9u8; 32];
        let values = vec![1u32; 31];
        let mut total = vec![0u64; Packing::coefficients(31)];
        for key in &keys {
            let words = ring.encrypt_packed(&seed, 0, &ring.key_ntt(key), &values, &packing, &mut rng).unwrap();
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            fold_words(&mut total, &bytes).unwrap();
        }
        let two = ring.key_sum_ntt(&KeySum::of(&keys[..2]));
        assert!(ring.residual_packed(&seed, 0, &two, &total, &packing, 31).unwrap() > 0);
        let all = ring.key_sum_ntt(&KeySum::of(&keys));
        assert_eq!(ring.residual_packed(&seed, 0, &all, &total, &packing, 31).unwrap(), 0);
        assert!(matches!(ring.decrypt_packed(&seed, 1, &all, &total, &packing, 31), Err(LatticeError::Residual { .. })));
    }

    #[test]
    fn bad_input_is_named() {
        let ring = ring();
        let mut rng = os_rng().unwrap();
        let key = ring.secret_key(&mut rng);
        let packing = Packing::new(8, 3, 21).unwrap();
        let error = ring.encrypt_packed(&[0u8; 32], 0, &ring.key_ntt(&key), &[1, 2, 256], &packing, &mut rng).unwrap_err();
        assert_eq!(error, LatticeError::Message { index: 2, value: 256, bits: 8 });
        assert!(matches!(Packing::new(24, 200, 21), Err(LatticeError::Noise { parties: 200, .. })));
        assert!(matches!(Packing::new(0, 3, 21), Err(LatticeError::PlaintextBits(0))));
        let mut acc: Vec<u64> = (0..5000u64).map(|i| Q - 1 - i).collect();
        let before = acc.clone();
        let mut words: Vec<u64> = (0..5000u64).collect();
        words[4500] = Q; // in the third chunk: the two before it are taken back
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(fold_words(&mut acc, &bytes), Err((4500, Q)));
        assert_eq!(acc, before, "nothing added");
        bytes.truncate(8);
        assert!(fold_words(&mut acc, &bytes).is_err());
    }

    #[test]
    fn public_polynomial_is_in_range_and_seeded() {
        let ring = ring();
        let a = ring.public_poly_packed(&[1u8; 32], 7);
        assert_eq!(a.len(), 4096);
        assert!(a.iter().all(|&v| v < Q));
        assert_eq!(a, ring.public_poly_packed(&[1u8; 32], 7));
        assert_ne!(a, ring.public_poly_packed(&[1u8; 32], 8));
    }
}
