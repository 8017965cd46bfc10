//! Key-homomorphic RLWE encryption for secure aggregation (docs/crypto.md, "Lattice aggregation").
//!
//! Each party encrypts its integer vector under a fresh secret key `s_i`:
//! `b_i = a * s_i + e_i + Delta * m_i  (mod q)` in `Z_q[X]/(X^n + 1)`, with the public polynomial
//! `a` expanded from a seed every party knows (so only `b_i` travels). The aggregator adds the
//! `b_i`; the sum is an encryption of `sum m_i` under the *sum of the keys*
//! `b = a * sum s_i + sum e_i + Delta * sum m_i`, so whoever learns `sum s_i` (and only it) decrypts
//! the sum and nothing else: `round((b - a * sum s_i) / Delta) mod t`, correct while the summed
//! error stays under `Delta / 2` (:meth:`Params::max_parties`).
//!
//! This crate holds the primitives only: the ring (a negacyclic NTT over one 62-bit prime from
//! `concrete-ntt`, not hand-written), the expansion of public polynomials (SHAKE128), secrets
//! (ternary) and errors (centred binomial), encryption, the fold an aggregator runs, and
//! decryption with a key sum. How the parties come to learn the key sum without anyone learning a
//! single party's key (a threshold scheme) is built above it.
//!
//! Secret-dependent arithmetic runs without branches on secret values (the ternary and binomial
//! samplers map random bits with arithmetic; the NTT and the modular operations are data
//! independent); secrets are zeroized when dropped.

pub mod packed;
pub mod shamir;

use rand_core::{CryptoRng, RngCore};
use sha3::digest::{ExtendableOutput, Update, XofReader};
use sha3::Shake128;
use zeroize::{Zeroize, ZeroizeOnDrop};

/// The ciphertext modulus: the prime `2^62 - 18 * 2^32 + 1`. It is `1 mod 2^32`, so rings up to
/// `n = 2^14` have their negacyclic NTT over it, and a plaintext modulus up to `2^32` divides
/// `q - 1`: a sum of messages that wraps past `t` costs 1 of the error margin per wrap, so
/// messages can live in `Z_{2^32}` like the masking modes' fixed point.
pub const Q: u64 = 0x3fff_ffee_0000_0001;

/// What can go wrong; every message names the field and the limit.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LatticeError {
    #[error("ring dimension {0}: must be a power of two in [1024, 16384]")]
    Dimension(usize),
    #[error("plaintext bits {0}: must be in [1, 48] (the ciphertext modulus has 62)")]
    PlaintextBits(u32),
    #[error("{what} has {got} coefficients, the ring {expected}")]
    Length { what: &'static str, got: usize, expected: usize },
    #[error("message coefficient {index} is {value}, at least the plaintext modulus 2^{bits}")]
    Message { index: usize, value: u64, bits: u32 },
    #[error("{parties} parties: the summed error can reach {bound}, over the decryption margin {margin}")]
    Noise { parties: usize, bound: u64, margin: u64 },
    #[error("threshold {threshold} of {parties} parties: needs 1 <= threshold <= parties <= 32760")]
    Threshold { threshold: usize, parties: usize },
    #[error("share points: {0}")]
    Points(String),
    #[error("{wrong} of {of} coefficients decrypt with an error past the parties' bound {bound}: the key sum or the summed ciphertexts are wrong (a share or a sum that does not verify)")]
    Residual { wrong: usize, of: usize, bound: u64 },
    #[error("the operating system's random source failed: {0}")]
    Random(String),
}

/// Ring dimension, plaintext modulus `t = 2^plaintext_bits` and the error's binomial parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    pub n: usize,
    pub plaintext_bits: u32,
    /// Centred binomial error: the difference of two sums of `eta` random bits (variance `eta / 2`).
    pub eta: u32,
}

impl Params {
    /// Checked parameters (`eta` 21: standard deviation about 3.2, the HE standard's).
    pub fn new(n: usize, plaintext_bits: u32) -> Result<Self, LatticeError> {
        if !n.is_power_of_two() || !(1024..=16384).contains(&n) {
            return Err(LatticeError::Dimension(n));
        }
        if !(1..=48).contains(&plaintext_bits) {
            return Err(LatticeError::PlaintextBits(plaintext_bits));
        }
        Ok(Self { n, plaintext_bits, eta: 21 })
    }

    /// `Delta = floor(q / t)`, the scale of the message in a ciphertext.
    pub fn delta(&self) -> u64 {
        Q >> self.plaintext_bits
    }

    /// `q mod t`: what each wrap of a summed message past `t` adds to the error.
    pub fn wrap_error(&self) -> u64 {
        Q % (1u64 << self.plaintext_bits)
    }

    /// The largest number of parties whose summed ciphertexts always decrypt correctly.
    ///
    /// Each error coefficient lies in `[-eta, eta]`, so `m` of them sum to at most `m * eta`; a sum
    /// of messages that passes `t` (a wrap, fewer than `m` of them) adds `q mod t` each, since
    /// `t * Delta = q - (q mod t)`. Decryption rounds correctly while the total stays under
    /// `Delta / 2`. With `t` at most `2^32`, `q mod t` is 1.
    pub fn max_parties(&self) -> usize {
        (self.delta() / 2 / (self.eta as u64 + self.wrap_error())) as usize
    }

    fn check_parties(&self, parties: usize) -> Result<(), LatticeError> {
        if parties > self.max_parties() {
            return Err(LatticeError::Noise {
                parties,
                bound: parties as u64 * (self.eta as u64 + self.wrap_error()),
                margin: self.delta() / 2,
            });
        }
        Ok(())
    }
}

/// The ring `Z_q[X]/(X^n + 1)` and its NTT plan.
pub struct Ring {
    params: Params,
    plan: concrete_ntt::prime64::Plan,
}

impl Ring {
    pub fn new(params: Params) -> Self {
        let plan = concrete_ntt::prime64::Plan::try_new(params.n, Q).expect("Q is 1 mod 2n for every allowed n");
        Self { params, plan }
    }

    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Public polynomial `index` of a round, in the NTT domain, from the round's 32-byte seed.
    ///
    /// SHAKE128 over (domain tag, seed, index), cut into 8-byte words, each kept if under `4q`
    /// (rejection sampling, then reduced): uniform mod `q`. A uniform polynomial is uniform in either
    /// domain, so it is drawn in the one the products need.
    pub fn public_poly(&self, seed: &[u8; 32], index: u64) -> Vec<u64> {
        let mut reader = xof(b"confide-lattice/a/v1", seed, index);
        let bound = 4 * Q; // 4q < 2^64: at most 1 word in 2^14 is rejected
        let mut out = Vec::with_capacity(self.params.n);
        let mut word = [0u8; 8];
        while out.len() < self.params.n {
            reader.read(&mut word);
            let value = u64::from_le_bytes(word);
            if value < bound {
                out.push(value % Q);
            }
        }
        out
    }

    /// A fresh ternary secret key (coefficients -1, 0, 1, each a third of the time).
    pub fn secret_key<R: RngCore + CryptoRng>(&self, rng: &mut R) -> SecretKey {
        let mut coefficients = vec![0i64; self.params.n];
        let mut bytes = [0u8; 64];
        let mut filled = 0;
        while filled < self.params.n {
            rng.fill_bytes(&mut bytes);
            for &byte in bytes.iter() {
                // 243 = 3^5: a byte under it is uniform mod 3 (rejection on public randomness only)
                if byte < 243 && filled < self.params.n {
                    coefficients[filled] = (byte % 3) as i64 - 1;
                    filled += 1;
                }
            }
        }
        bytes.zeroize();
        SecretKey { coefficients }
    }

    fn error<R: RngCore + CryptoRng>(&self, rng: &mut R) -> Vec<i64> {
        let eta = self.params.eta;
        let mask = (1u64 << eta) - 1;
        (0..self.params.n)
            .map(|_| {
                let bits = rng.next_u64();
                ((bits & mask).count_ones() as i64) - (((bits >> 32) & mask).count_ones() as i64)
            })
            .collect()
    }

    /// `a * s` in coefficient form, for `a` in the NTT domain and `s` with small signed coefficients.
    fn product(&self, a_ntt: &[u64], s: &[i64]) -> Vec<u64> {
        let mut buf: Vec<u64> = s.iter().map(|&c| lift(c)).collect();
        self.plan.fwd(&mut buf);
        self.plan.mul_assign_normalize(&mut buf, a_ntt);
        self.plan.inv(&mut buf);
        buf
    }

    /// The NTT of a small signed polynomial (a key or a key sum), computed once for all the blocks
    /// of a slice; the caller zeroizes it.
    pub(crate) fn ntt_of(&self, s: &[i64]) -> Vec<u64> {
        let mut out: Vec<u64> = s.iter().map(|&c| lift(c)).collect();
        self.plan.fwd(&mut out);
        out
    }

    fn check_len(&self, what: &'static str, got: usize) -> Result<(), LatticeError> {
        if got != self.params.n {
            return Err(LatticeError::Length { what, got, expected: self.params.n });
        }
        Ok(())
    }

    /// `b = a * s + e + Delta * m`: the message's coefficients must be under `t`.
    pub fn encrypt<R: RngCore + CryptoRng>(
        &self,
        a_ntt: &[u64],
        key: &SecretKey,
        message: &[u64],
        rng: &mut R,
    ) -> Result<Vec<u64>, LatticeError> {
        self.check_len("the public polynomial", a_ntt.len())?;
        self.check_len("the message", message.len())?;
        let t = 1u64 << self.params.plaintext_bits;
        if let Some((index, &value)) = message.iter().enumerate().find(|(_, &v)| v >= t) {
            return Err(LatticeError::Message { index, value, bits: self.params.plaintext_bits });
        }
        let delta = self.params.delta();
        let mut b = self.product(a_ntt, &key.coefficients);
        let mut e = self.error(rng);
        for ((out, &err), &m) in b.iter_mut().zip(e.iter()).zip(message) {
            *out = add_mod(add_mod(*out, lift(err)), m * delta);
        }
        e.zeroize();
        Ok(b)
    }

    /// Decrypt a sum of `parties` ciphertexts of one public polynomial with the sum of their keys.
    pub fn decrypt(&self, a_ntt: &[u64], keys: &KeySum, sum: &[u64]) -> Result<Vec<u64>, LatticeError> {
        self.check_len("the public polynomial", a_ntt.len())?;
        self.check_len("the ciphertext sum", sum.len())?;
        self.check_len("the key sum", keys.coefficients.len())?;
        self.params.check_parties(keys.parties)?;
        let mask = self.product(a_ntt, &keys.coefficients);
        let delta = self.params.delta();
        let t_mask = (1u64 << self.params.plaintext_bits) - 1;
        // Delta * m + e (mod q), rounded to the nearest multiple of Delta; a small negative error
        // on m = 0 sits just under q = t * Delta + (q mod t), which rounds to t, that is 0 mod t
        Ok(sum.iter().zip(mask).map(|(&b, am)| ((sub_mod(b, am) + delta / 2) / delta) & t_mask).collect())
    }
}

impl Ring {
    /// Blocks of `n` values a vector of ``len`` values takes (the last block zero-padded).
    pub fn blocks(&self, len: usize) -> usize {
        len.div_ceil(self.params.n)
    }

    /// ``values`` (each under `t`) encrypted block by block under one key: block `k` under the
    /// public polynomial `(seed, k)`; `blocks(len) * n` coefficients.
    pub fn encrypt_vector<R: RngCore + CryptoRng>(
        &self,
        seed: &[u8; 32],
        key: &SecretKey,
        values: &[u64],
        rng: &mut R,
    ) -> Result<Vec<u64>, LatticeError> {
        let n = self.params.n;
        let mut out = Vec::with_capacity(self.blocks(values.len()) * n);
        let mut block = vec![0u64; n];
        for (k, chunk) in values.chunks(n).enumerate() {
            block[..chunk.len()].copy_from_slice(chunk);
            block[chunk.len()..].fill(0);
            let a = self.public_poly(seed, k as u64);
            out.extend(self.encrypt(&a, key, &block, rng).map_err(|error| match error {
                LatticeError::Message { index, value, bits } => LatticeError::Message { index: index + k * n, value, bits },
                other => other,
            })?);
        }
        block.zeroize();
        Ok(out)
    }

    /// The first ``len`` values of a summed vector, decrypted block by block with the key sum.
    pub fn decrypt_vector(&self, seed: &[u8; 32], keys: &KeySum, sum: &[u64], len: usize) -> Result<Vec<u64>, LatticeError> {
        let n = self.params.n;
        let expected = self.blocks(len) * n;
        if sum.len() != expected {
            return Err(LatticeError::Length { what: "the summed vector", got: sum.len(), expected });
        }
        let mut out = Vec::with_capacity(expected);
        for (k, block) in sum.chunks(n).enumerate() {
            let a = self.public_poly(seed, k as u64);
            out.extend(self.decrypt(&a, keys, block)?);
        }
        out.truncate(len);
        Ok(out)
    }
}

/// SHAKE128 over (domain tag, seed, index): the stream a public polynomial is drawn from.
pub(crate) fn xof(tag: &[u8], seed: &[u8; 32], index: u64) -> impl XofReader {
    let mut shake = Shake128::default();
    shake.update(tag);
    shake.update(seed);
    shake.update(&index.to_le_bytes());
    shake.finalize_xof()
}

/// The generator keys, errors and share polynomials are drawn from.
pub type KeyRng = rand_chacha::ChaCha20Rng;

/// A ChaCha20 generator seeded from the operating system (keys, errors, share polynomials).
pub fn os_rng() -> Result<KeyRng, LatticeError> {
    use rand_core::SeedableRng;
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|error| LatticeError::Random(error.to_string()))?;
    let rng = rand_chacha::ChaCha20Rng::from_seed(seed);
    seed.zeroize();
    Ok(rng)
}

/// The aggregator's fold: `acc += b (mod q)`, coefficient by coefficient.
pub fn add_assign(acc: &mut [u64], b: &[u64]) {
    for (x, &y) in acc.iter_mut().zip(b) {
        *x = add_mod(*x, y);
    }
}

/// A key or a key sum in the NTT domain, for the ring that made it: computed once and used for every
/// block of every slice of a round (zeroized when dropped).
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct KeyNtt {
    values: Vec<u64>,
    #[zeroize(skip)]
    parties: usize,
}

impl KeyNtt {
    /// The parties whose keys it sums (1 for one party's key).
    pub fn parties(&self) -> usize {
        self.parties
    }

    pub(crate) fn values(&self) -> &[u64] {
        &self.values
    }
}

impl Ring {
    /// ``key`` in the NTT domain.
    pub fn key_ntt(&self, key: &SecretKey) -> KeyNtt {
        KeyNtt { values: self.ntt_of(key.coefficients()), parties: 1 }
    }

    /// ``keys`` in the NTT domain.
    pub fn key_sum_ntt(&self, keys: &KeySum) -> KeyNtt {
        KeyNtt { values: self.ntt_of(keys.coefficients()), parties: keys.parties() }
    }
}

/// One party's secret key: small signed coefficients, zeroized when dropped.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct SecretKey {
    coefficients: Vec<i64>,
}

impl SecretKey {
    pub fn coefficients(&self) -> &[i64] {
        &self.coefficients
    }
}

/// The sum of some parties' keys: what decrypts the sum of their ciphertexts, and nothing else.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct KeySum {
    coefficients: Vec<i64>,
    #[zeroize(skip)]
    parties: usize,
}

impl KeySum {
    /// The sum of ``keys`` (the key-homomorphic property: it decrypts the sum of their ciphertexts).
    pub fn of<'a>(keys: impl IntoIterator<Item = &'a SecretKey>) -> Self {
        let mut coefficients: Vec<i64> = Vec::new();
        let mut parties = 0;
        for key in keys {
            if coefficients.is_empty() {
                coefficients = vec![0; key.coefficients.len()];
            }
            for (sum, &c) in coefficients.iter_mut().zip(&key.coefficients) {
                *sum += c;
            }
            parties += 1;
        }
        Self { coefficients, parties }
    }

    pub fn parties(&self) -> usize {
        self.parties
    }

    pub(crate) fn from_coefficients(coefficients: Vec<i64>, parties: usize) -> Self {
        Self { coefficients, parties }
    }

    pub fn coefficients(&self) -> &[i64] {
        &self.coefficients
    }
}

pub(crate) fn lift(value: i64) -> u64 {
    // a small signed value mod q, without a branch on its sign
    let sign = (value >> 63) as u64; // all ones when negative
    (value as u64).wrapping_add(Q & sign)
}

pub(crate) fn add_mod(a: u64, b: u64) -> u64 {
    let s = a + b; // both under 2^62: no overflow
    let reduced = s.wrapping_sub(Q);
    // keep s when it was under q (the subtraction wrapped), without a branch
    let wrapped = ((reduced as i64) >> 63) as u64;
    (s & wrapped) | (reduced & !wrapped)
}

pub(crate) fn sub_mod(a: u64, b: u64) -> u64 {
    add_mod(a, Q - b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ring product through concrete-ntt's plan against the schoolbook negacyclic convolution
    /// mod `Q` (a known answer computed without any NTT): `X^n = -1` folds the high half back negated.
    #[test]
    fn ntt_product_equals_the_schoolbook_negacyclic_product() {
        use rand_core::SeedableRng;
        let n = 1024;
        let ring = Ring::new(Params::new(n, 16).unwrap());
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(7);
        let a: Vec<u64> = (0..n).map(|_| rng.next_u64() % Q).collect();
        let s = ring.secret_key(&mut rng);
        let mut want = vec![0u64; n];
        for (i, &ai) in a.iter().enumerate() {
            for (j, &sj) in s.coefficients().iter().enumerate() {
                let term = ((ai as u128 * lift(sj) as u128) % Q as u128) as u64;
                let k = (i + j) % n;
                want[k] = if i + j < n { add_mod(want[k], term) } else { sub_mod(want[k], term) };
            }
        }
        let mut a_ntt = a.clone();
        ring.plan.fwd(&mut a_ntt);
        assert_eq!(ring.product(&a_ntt, s.coefficients()), want);
        // and the packed form's path: a in the NTT domain times the key's cached NTT, inverted
        let key = ring.key_ntt(&s);
        let mut got = a_ntt.clone();
        ring.plan.mul_assign_normalize(&mut got, key.values());
        ring.plan.inv(&mut got);
        assert_eq!(got, want);
    }

    #[test]
    fn modular_helpers_stay_in_range() {
        assert_eq!(lift(-1), Q - 1);
        assert_eq!(lift(5), 5);
        assert_eq!(add_mod(Q - 1, 1), 0);
        assert_eq!(add_mod(Q - 1, Q - 1), Q - 2);
        assert_eq!(sub_mod(0, 1), Q - 1);
    }
}
