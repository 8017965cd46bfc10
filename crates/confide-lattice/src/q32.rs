//! RLWE with the ciphertext modulus `2^32`: ciphertexts are uint32 words, summed by the data plane's
//! masked-word kernel (wrapping addition), four bytes a value like plain float32.
//!
//! `b = a * s + e + Delta * m (mod 2^32)` with `Delta = 2^(32 - bits)` exactly, so messages live in
//! `Z_{2^bits}` and a sum that wraps there costs nothing; decryption is right while the summed
//! error stays under `Delta / 2` (`max_parties_q32`). The product `a * s` is computed exactly: the
//! negacyclic convolution of `a` (words) and a small `s` lies within `n * 2^32 * |s|_max`, under
//! `(q - 1) / 2` for the 62-bit NTT prime `Q`, so the NTT over `Q` and a centred lift give it
//! exactly, and it is then taken mod `2^32`. A vector of `len` values is cut into blocks of `n`;
//! each block is one RLWE sample truncated to the block's values (decryption is coefficient-wise,
//! and fewer coefficients of a sample reveal no more than the whole one).

use crate::{lift, xof, KeySum, LatticeError, Ring, SecretKey, Q};
use rand_core::{CryptoRng, RngCore};
use sha3::digest::XofReader;
use zeroize::Zeroize;

/// The most parties whose summed ciphertexts decrypt with `bits`-bit messages (`m * eta < 2^(31 - bits)`).
pub fn max_parties_q32(bits: u32, eta: u32) -> usize {
    if bits == 0 || bits > 30 {
        return 0;
    }
    (((1u64 << (31 - bits)) - 1) / eta as u64) as usize
}

impl Ring {
    /// Public polynomial ``index`` in `Z_{2^32}` from the round's seed (SHAKE128, 4 bytes a coefficient).
    pub fn public_poly_q32(&self, seed: &[u8; 32], index: u64) -> Vec<u32> {
        let mut reader = xof(b"confide-lattice/a32/v1", seed, index);
        let mut bytes = vec![0u8; 4 * self.params.n];
        reader.read(&mut bytes);
        bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    /// The NTT of a small signed polynomial (a key or a key sum), computed once for all the blocks
    /// of a slice; the caller zeroizes it.
    fn ntt_of(&self, s: &[i64]) -> Vec<u64> {
        let mut out: Vec<u64> = s.iter().map(|&c| lift(c)).collect();
        self.plan.fwd(&mut out);
        out
    }

    /// `a * s mod 2^32`, exact (see the module's note), for `|s|` coefficients below `2^17`, with
    /// `s` given as [`Ring::ntt_of`].
    fn product_q32(&self, a: &[u32], s_ntt: &[u64]) -> Vec<u32> {
        let mut left: Vec<u64> = a.iter().map(|&v| v as u64).collect();
        self.plan.fwd(&mut left);
        self.plan.mul_assign_normalize(&mut left, s_ntt);
        self.plan.inv(&mut left);
        let half = Q / 2;
        // centred: the exact integer, then its residue mod 2^32 (two's complement truncation)
        left.iter().map(|&v| if v > half { (v as i64 - Q as i64) as u32 } else { v as u32 }).collect()
    }

    fn check_bits(&self, bits: u32, parties: usize) -> Result<(), LatticeError> {
        if !(1..=30).contains(&bits) {
            return Err(LatticeError::PlaintextBits(bits));
        }
        let max = max_parties_q32(bits, self.params.eta);
        if parties > max {
            return Err(LatticeError::Noise { parties, bound: parties as u64 * self.params.eta as u64, margin: 1u64 << (31 - bits) });
        }
        Ok(())
    }

    /// ``values`` (each under `2^bits`) encrypted under ``key``: one word each, block `k` with the
    /// public polynomial `(seed, (slice << 24) | k)`.
    pub fn encrypt_q32<R: RngCore + CryptoRng>(
        &self,
        seed: &[u8; 32],
        slice: u32,
        key: &SecretKey,
        values: &[u32],
        bits: u32,
        rng: &mut R,
    ) -> Result<Vec<u32>, LatticeError> {
        self.check_bits(bits, 1)?;
        let n = self.params.n;
        if let Some((index, &value)) = values.iter().enumerate().find(|(_, &v)| (v as u64) >> bits != 0) {
            return Err(LatticeError::Message { index, value: value as u64, bits });
        }
        let shift = 32 - bits;
        let mask = (1u64 << self.params.eta) - 1;
        let mut out = Vec::with_capacity(values.len());
        let mut s_ntt = self.ntt_of(key.coefficients());
        for (k, block) in values.chunks(n).enumerate() {
            let a = self.public_poly_q32(seed, ((slice as u64) << 24) | k as u64);
            let product = self.product_q32(&a, &s_ntt);
            for (&p, &m) in product.iter().zip(block) {
                let bits64 = rng.next_u64();
                let e = (bits64 & mask).count_ones() as i32 - ((bits64 >> 32) & mask).count_ones() as i32;
                out.push(p.wrapping_add(e as u32).wrapping_add(m << shift));
            }
        }
        s_ntt.zeroize();
        Ok(out)
    }

    /// The messages of a sum of `keys.parties()` ciphertexts of slice ``slice``, each under `2^bits`.
    ///
    /// Checked: every coefficient's error, what rounding removes, must lie within the sum of the
    /// parties' error bounds (`parties * eta`: a centred binomial error never exceeds `eta`). A key
    /// sum rebuilt from a wrong share, or a sum that is not of ciphertexts under those keys, leaves
    /// errors spread over all of `Z_Delta`, and is refused ([`LatticeError::Residual`]) rather than
    /// decrypted to noise.
    pub fn decrypt_q32(&self, seed: &[u8; 32], slice: u32, keys: &KeySum, total: &[u32], bits: u32) -> Result<Vec<u32>, LatticeError> {
        let mut out = Vec::with_capacity(total.len());
        let wrong = self.decrypt_q32_into(seed, slice, keys, total, bits, Some(&mut out))?;
        if wrong > 0 {
            let bound = keys.parties() as u64 * self.params.eta as u64;
            return Err(LatticeError::Residual { wrong, of: total.len(), bound });
        }
        Ok(out)
    }

    /// How many coefficients of the decryption of ``total`` with ``keys`` have an error past the
    /// parties' bound (0: the key sum and the sum agree); nothing is decrypted out.
    pub fn residual_q32(&self, seed: &[u8; 32], slice: u32, keys: &KeySum, total: &[u32], bits: u32) -> Result<usize, LatticeError> {
        self.decrypt_q32_into(seed, slice, keys, total, bits, None)
    }

    fn decrypt_q32_into(
        &self,
        seed: &[u8; 32],
        slice: u32,
        keys: &KeySum,
        total: &[u32],
        bits: u32,
        mut out: Option<&mut Vec<u32>>,
    ) -> Result<usize, LatticeError> {
        self.check_bits(bits, keys.parties())?;
        if keys.coefficients().len() != self.params.n {
            return Err(LatticeError::Length { what: "the key sum", got: keys.coefficients().len(), expected: self.params.n });
        }
        let n = self.params.n;
        let shift = 32 - bits;
        let half = 1u32 << (shift - 1);
        let low = (1u32 << shift) - 1;
        let bound = (keys.parties() as u64 * self.params.eta as u64) as i64;
        let mut wrong = 0usize;
        let mut s_ntt = self.ntt_of(keys.coefficients());
        for (k, block) in total.chunks(n).enumerate() {
            let a = self.public_poly_q32(seed, ((slice as u64) << 24) | k as u64);
            let product = self.product_q32(&a, &s_ntt);
            for (&b, &p) in block.iter().zip(&product) {
                let shifted = b.wrapping_sub(p).wrapping_add(half);
                let error = (shifted & low) as i64 - half as i64;
                wrong += (error.abs() > bound) as usize;
                if let Some(out) = out.as_deref_mut() {
                    out.push(shifted >> shift);
                }
            }
        }
        s_ntt.zeroize();
        Ok(wrong)
    }
}
