//! Encryption (§1.3–1.6), decryption (§1.7), homomorphic operations (§1.8) and
//! the signed plaintext window (§1.2) on single ciphertexts.

use crate::error::{Error, Result};
use crate::keys::{DecryptionKey, EncryptionKey};
use crate::random::{random_limbs_many, random_unit};
use crate::table::BaseTable;
use rug::Integer;

/// A Paillier ciphertext: an integer c with 0 < c < n², in normal (not Montgomery) form.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Ciphertext(pub(crate) Integer);

impl Ciphertext {
    /// Wraps an integer after checking 0 < c < n² for `key`.
    ///
    /// # Errors
    /// `CiphertextOutOfRange` (index 0) otherwise.
    pub fn new(key: &EncryptionKey, value: Integer) -> Result<Self> {
        check_ciphertext(key, &value, 0)?;
        Ok(Ciphertext(value))
    }
    /// The underlying integer.
    pub fn as_integer(&self) -> &Integer {
        &self.0
    }
    /// Consumes into the underlying integer.
    pub fn into_integer(self) -> Integer {
        self.0
    }
}

pub(crate) fn check_ciphertext(key: &EncryptionKey, value: &Integer, index: usize) -> Result<()> {
    if *value <= 0 || value >= key.n_squared() {
        return Err(Error::CiphertextOutOfRange { index });
    }
    Ok(())
}

/// How the randomizer ρ of an encryption is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Randomizer {
    /// DJN: ρ = h_s^a, a of ℓ = k/2 bits, from the fixed-base table (§1.4–1.5). Default.
    #[default]
    FixedBase,
    /// Classical: ρ = r^n for a uniform unit r (§1.3); ~10x slower, kept for comparison and interop.
    Classical,
}

impl EncryptionKey {
    pub(crate) fn check_plaintext(&self, plaintext: &Integer) -> Result<()> {
        if *plaintext < 0 || plaintext >= self.n() {
            return Err(Error::PlaintextOutOfRange { field: "plaintext", limit: "0 <= m < n".into() });
        }
        Ok(())
    }

    /// Encrypts a raw plaintext 0 ≤ m < n with the public key only.
    ///
    /// # Errors
    /// `PlaintextOutOfRange`, `Randomness`.
    pub fn encrypt(&self, plaintext: &Integer) -> Result<Ciphertext> {
        self.encrypt_with(plaintext, Randomizer::FixedBase)
    }

    /// Encrypts with the chosen randomizer.
    ///
    /// # Errors
    /// `PlaintextOutOfRange`, `Randomness`.
    pub fn encrypt_with(&self, plaintext: &Integer, randomizer: Randomizer) -> Result<Ciphertext> {
        self.check_plaintext(plaintext)?;
        match randomizer {
            Randomizer::FixedBase => first(self.encrypt_fixed_base_batch(std::slice::from_ref(plaintext))?),
            Randomizer::Classical => {
                let r = random_unit(self.n())?;
                let rho = r.pow_mod(self.n(), self.n_squared()).map_err(|_| Error::Randomness)?;
                Ok(Ciphertext(g_of(self, plaintext) * rho % self.n_squared()))
            }
        }
    }

    /// DJN encryptions of a batch of plaintexts already checked to be < n:
    /// (1 + m·n)·h_s^a for fresh a, from the fixed-base table (8 at a time with IFMA).
    pub(crate) fn encrypt_fixed_base_batch(&self, plaintexts: &[Integer]) -> Result<Vec<Ciphertext>> {
        let table = self.table()?;
        let exponents = random_limbs_many(plaintexts.len(), self.rand_bits())?;
        let factors: Vec<Integer> = plaintexts.iter().map(|m| g_of(self, m)).collect();
        let factors: Vec<&Integer> = factors.iter().collect();
        Ok(table.power_times(&exponents, &factors).into_iter().map(Ciphertext).collect())
    }

    /// A fresh encryption of zero: the randomizer h_s^a itself.
    ///
    /// # Errors
    /// `Randomness`.
    pub fn encrypt_zero(&self) -> Result<Ciphertext> {
        self.encrypt(&Integer::new())
    }

    /// [[a]] ⊕ [[b]] = c_a · c_b mod n².
    pub fn add(&self, a: &Ciphertext, b: &Ciphertext) -> Ciphertext {
        Ciphertext(Integer::from(&a.0 * &b.0) % self.n_squared())
    }

    /// [[a]] ⊕ b = c · (1 + b·n) mod n², for a raw plaintext 0 ≤ b < n.
    ///
    /// # Errors
    /// `PlaintextOutOfRange`.
    pub fn add_plain(&self, a: &Ciphertext, plaintext: &Integer) -> Result<Ciphertext> {
        self.check_plaintext(plaintext)?;
        let g_b = g_of(self, plaintext);
        Ok(Ciphertext(g_b * &a.0 % self.n_squared()))
    }

    /// [[−a]] = c⁻¹ mod n².
    ///
    /// # Errors
    /// `CiphertextOutOfRange` if c is not a unit (then it was never a valid ciphertext).
    pub fn negate(&self, a: &Ciphertext) -> Result<Ciphertext> {
        a.0.clone().invert(self.n_squared()).map(Ciphertext).map_err(|_| Error::CiphertextOutOfRange { index: 0 })
    }

    /// [[a]] ⊗ s = c^s mod n² for any integer s (negative s inverts c first).
    /// The scalar is public, so variable-time `mpz_powm` is fine.
    ///
    /// # Errors
    /// `CiphertextOutOfRange` if s < 0 and c is not a unit.
    pub fn mul_scalar(&self, a: &Ciphertext, scalar: &Integer) -> Result<Ciphertext> {
        a.0.clone().pow_mod(scalar, self.n_squared()).map(Ciphertext).map_err(|_| Error::CiphertextOutOfRange { index: 0 })
    }

    /// Re-randomizes: c · h_s^a (multiplies by a fresh encryption of zero), so a
    /// derived ciphertext cannot be linked to its inputs.
    ///
    /// # Errors
    /// `Randomness`.
    pub fn rerandomize(&self, a: &Ciphertext) -> Result<Ciphertext> {
        let zero = self.encrypt_zero()?;
        Ok(self.add(a, &zero))
    }

    /// Maps a signed integer into Z_n with the window |v| ≤ ⌊n/3⌋ − 1 (§1.2).
    ///
    /// # Errors
    /// `PlaintextOutOfRange` when |v| exceeds the window.
    pub fn encode_signed(&self, value: &Integer) -> Result<Integer> {
        if value.cmp_abs(self.max_signed()) == std::cmp::Ordering::Greater {
            return Err(Error::PlaintextOutOfRange { field: "value", limit: "|v| <= floor(n/3) - 1".into() });
        }
        Ok(if *value < 0 { Integer::from(value + self.n()) } else { value.clone() })
    }

    /// Inverse of [`Self::encode_signed`]; values in the middle third are an overflow.
    ///
    /// # Errors
    /// `SignedOverflow` for a plaintext in (⌊n/3⌋ − 1, n − ⌊n/3⌋ + 1).
    pub fn decode_signed(&self, plaintext: &Integer, index: usize) -> Result<Integer> {
        if plaintext <= self.max_signed() {
            return Ok(plaintext.clone());
        }
        let negative = Integer::from(plaintext - self.n());
        if negative.cmp_abs(self.max_signed()) != std::cmp::Ordering::Greater {
            return Ok(negative);
        }
        Err(Error::SignedOverflow { index })
    }
}

impl DecryptionKey {
    /// Encrypts with CRT (§1.6): randomizer and g^m computed mod p² and q² from
    /// per-prime fixed-base tables, then recombined. Same distribution as the
    /// public-key path, ~2-3x faster.
    ///
    /// # Errors
    /// `PlaintextOutOfRange`, `Randomness`.
    pub fn encrypt(&self, plaintext: &Integer) -> Result<Ciphertext> {
        self.encrypt_with(plaintext, Randomizer::FixedBase)
    }

    /// CRT encryption with the chosen randomizer.
    ///
    /// # Errors
    /// `PlaintextOutOfRange`, `Randomness`.
    pub fn encrypt_with(&self, plaintext: &Integer, randomizer: Randomizer) -> Result<Ciphertext> {
        self.public.check_plaintext(plaintext)?;
        if randomizer == Randomizer::FixedBase {
            return first(self.encrypt_fixed_base_batch(std::slice::from_ref(plaintext))?);
        }
        // Classical ρ = r^n, with the exponent n reduced mod p(p−1) and q(q−1).
        let s = &self.secret;
        let g_m = g_of(&self.public, plaintext);
        let r = random_unit(self.public.n())?;
        let half = |prime_squared: &Integer, exponent: &Integer| -> Result<Integer> {
            let base = Integer::from(&r % prime_squared);
            let rho = base.pow_mod(exponent, prime_squared).map_err(|_| Error::Randomness)?;
            Ok(rho * Integer::from(&g_m % prime_squared) % prime_squared)
        };
        let (c_p, c_q) = (half(&s.p_squared, &s.n_mod_order_p)?, half(&s.q_squared, &s.n_mod_order_q)?);
        Ok(Ciphertext(self.combine_mod_n_squared(&c_p, &c_q)))
    }

    /// CRT encryptions (§1.6) of plaintexts already checked to be < n: the same
    /// exponent a drives the tables of h_s mod p² and mod q², then Garner.
    pub(crate) fn encrypt_fixed_base_batch(&self, plaintexts: &[Integer]) -> Result<Vec<Ciphertext>> {
        let (table_p, table_q) = self.crt_tables()?;
        let public = &self.public;
        let exponents = random_limbs_many(plaintexts.len(), public.rand_bits())?;
        let g_m: Vec<Integer> = plaintexts.iter().map(|m| g_of(public, m)).collect();
        let reduce = |table: &BaseTable| -> Vec<Integer> { g_m.iter().map(|g| Integer::from(g % table.modulus())).collect() };
        let (g_p, g_q) = (reduce(table_p), reduce(table_q));
        let (g_p, g_q): (Vec<&Integer>, Vec<&Integer>) = (g_p.iter().collect(), g_q.iter().collect());
        #[cfg(target_arch = "x86_64")]
        if let (BaseTable::Ifma(ifma_p), BaseTable::Ifma(ifma_q)) = (table_p, table_q) {
            let s = &self.secret;
            let crt = s.ifma_crt.get_or_init(|| crate::ifma::IfmaCrt::new(ifma_p, ifma_q, &s.q_squared_inverse_mod_p_squared));
            if let Some(crt) = crt {
                let lanes = crate::ifma::LANES;
                return Ok(exponents
                    .chunks(lanes)
                    .zip(g_p.chunks(lanes).zip(g_q.chunks(lanes)))
                    .flat_map(|(e, (f_p, f_q))| crt.power_times(ifma_p, ifma_q, e, f_p, f_q))
                    .map(Ciphertext)
                    .collect());
            }
        }
        let (c_p, c_q) = (table_p.power_times(&exponents, &g_p), table_q.power_times(&exponents, &g_q));
        Ok(c_p.iter().zip(&c_q).map(|(p, q)| Ciphertext(self.combine_mod_n_squared(p, q))).collect())
    }

    /// Decrypts to the raw plaintext in [0, n) by CRT (§1.7):
    /// m_p = L_p(c^(p−1) mod p²)·h_p mod p, likewise for q, then Garner.
    /// Exponents p−1, q−1 are secret, so this uses GMP's constant-time `mpz_powm_sec`.
    ///
    /// # Errors
    /// `CiphertextOutOfRange` unless 0 < c < n².
    pub fn decrypt(&self, ciphertext: &Ciphertext) -> Result<Integer> {
        self.decrypt_at(ciphertext, 0)
    }

    pub(crate) fn decrypt_at(&self, ciphertext: &Ciphertext, index: usize) -> Result<Integer> {
        let s = &self.secret;
        let (base_p, base_q) = self.crt_bases(ciphertext, index)?;
        let u_p = base_p.secure_pow_mod(&s.p_minus_1, &s.p_squared);
        let u_q = base_q.secure_pow_mod(&s.q_minus_1, &s.q_squared);
        Ok(self.recombine(u_p, u_q))
    }

    /// Decrypts a batch; with IFMA, eight ciphertexts share each constant-time
    /// exponentiation c^(p−1) mod p² (and mod q²).
    pub(crate) fn decrypt_batch(&self, ciphertexts: &[Ciphertext], first_index: usize) -> Result<Vec<Integer>> {
        #[cfg(target_arch = "x86_64")]
        if let Some((modulus_p, modulus_q)) = self.ifma_moduli(ciphertexts.len()) {
            let s = &self.secret;
            let mut out = Vec::with_capacity(ciphertexts.len());
            for (chunk_index, chunk) in ciphertexts.chunks(crate::ifma::LANES).enumerate() {
                let bases = chunk
                    .iter()
                    .enumerate()
                    .map(|(i, c)| self.crt_bases(c, first_index + chunk_index * crate::ifma::LANES + i))
                    .collect::<Result<Vec<_>>>()?;
                let u_p = modulus_p.pow_shared_exponent(&bases.iter().map(|b| &b.0).collect::<Vec<_>>(), &s.p_minus_1);
                let u_q = modulus_q.pow_shared_exponent(&bases.iter().map(|b| &b.1).collect::<Vec<_>>(), &s.q_minus_1);
                out.extend(u_p.into_iter().zip(u_q).map(|(p, q)| self.recombine(p, q)));
            }
            return Ok(out);
        }
        ciphertexts.iter().enumerate().map(|(i, c)| self.decrypt_at(c, first_index + i)).collect()
    }

    /// The IFMA contexts mod p² and q², when the engine runs and a batch is worth it.
    #[cfg(target_arch = "x86_64")]
    fn ifma_moduli(&self, batch: usize) -> Option<&(crate::ifma::IfmaModulus, crate::ifma::IfmaModulus)> {
        if batch < 2 || !crate::ifma::available() {
            return None;
        }
        let s = &self.secret;
        s.ifma_moduli
            .get_or_init(|| Some((crate::ifma::IfmaModulus::new(&s.p_squared)?, crate::ifma::IfmaModulus::new(&s.q_squared)?)))
            .as_ref()
    }

    /// c mod p² and c mod q², after checking 0 < c < n² and that neither is 0.
    fn crt_bases(&self, ciphertext: &Ciphertext, index: usize) -> Result<(Integer, Integer)> {
        check_ciphertext(&self.public, &ciphertext.0, index)?;
        let s = &self.secret;
        let base_p = Integer::from(&ciphertext.0 % &s.p_squared);
        let base_q = Integer::from(&ciphertext.0 % &s.q_squared);
        if base_p == 0 || base_q == 0 {
            return Err(Error::CiphertextOutOfRange { index });
        }
        Ok((base_p, base_q))
    }

    /// m from u_p = c^(p−1) mod p² and u_q = c^(q−1) mod q²:
    /// m_p = L_p(u_p)·h_p mod p, m_q likewise, m = m_p + p·((m_q − m_p)·p⁻¹ mod q).
    fn recombine(&self, u_p: Integer, u_q: Integer) -> Integer {
        let s = &self.secret;
        let m_p = (u_p - 1u32).div_exact(&s.p) * &s.h_p % &s.p;
        let m_q = (u_q - 1u32).div_exact(&s.q) * &s.h_q % &s.q;
        let mut t = Integer::from(&m_q - &m_p);
        t *= &s.p_inverse_mod_q;
        t %= &s.q;
        if t < 0 {
            t += &s.q;
        }
        t * &s.p + m_p
    }

    /// Decrypts and maps back through the signed window (§1.2).
    ///
    /// # Errors
    /// `CiphertextOutOfRange`, `SignedOverflow`.
    pub fn decrypt_signed(&self, ciphertext: &Ciphertext) -> Result<Integer> {
        let raw = self.decrypt(ciphertext)?;
        self.public.decode_signed(&raw, 0)
    }
}

/// g^m = (1 + n)^m = 1 + m·n (mod n²): one multiplication, no exponentiation (§1.3).
fn g_of(key: &EncryptionKey, plaintext: &Integer) -> Integer {
    Integer::from(plaintext * key.n()) + 1u32
}

fn first(mut ciphertexts: Vec<Ciphertext>) -> Result<Ciphertext> {
    ciphertexts.pop().ok_or(Error::Randomness)
}
