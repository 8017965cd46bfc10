//! Encryption (§1.3–1.6), decryption (§1.7), homomorphic operations (§1.8) and
//! the signed plaintext window (§1.2) on single ciphertexts.

use crate::error::{Error, Result};
use crate::keys::{DecryptionKey, EncryptionKey};
use crate::mont::pad;
use crate::random::{random_limbs, random_unit};
use rug::integer::Order;
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
    fn check_plaintext(&self, plaintext: &Integer) -> Result<()> {
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
        // g^m = (1 + n)^m = 1 + m·n (mod n²): one multiplication, no exponentiation.
        let g_m = Integer::from(plaintext * self.n()) + 1u32;
        match randomizer {
            Randomizer::FixedBase => {
                let table = self.table()?;
                let mont = table.montgomery();
                let mut scratch = mont.scratch();
                let exponent = random_limbs(self.rand_bits())?;
                let mut rho = vec![0u64; mont.limbs()];
                table.pow_mont(&exponent, &mut rho, &mut scratch);
                // Multiplying the Montgomery-form ρ by the normal-form g^m leaves
                // Montgomery form for free: (ρR)·g^m·R⁻¹ = ρ·g^m.
                let mut out = vec![0u64; mont.limbs()];
                mont.mul(&rho, &pad(&g_m, mont.limbs()), &mut out, &mut scratch);
                Ok(Ciphertext(Integer::from_digits(&out, Order::Lsf)))
            }
            Randomizer::Classical => {
                let r = random_unit(self.n())?;
                let rho = r.pow_mod(self.n(), self.n_squared()).map_err(|_| Error::Randomness)?;
                Ok(Ciphertext(g_m * rho % self.n_squared()))
            }
        }
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
        let g_b = Integer::from(plaintext * self.n()) + 1u32;
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
        let public = &self.public;
        if *plaintext < 0 || plaintext >= public.n() {
            return Err(Error::PlaintextOutOfRange { field: "plaintext", limit: "0 <= m < n".into() });
        }
        let s = &self.secret;
        let g_m = Integer::from(plaintext * public.n()) + 1u32;
        let (c_p, c_q) = match randomizer {
            Randomizer::FixedBase => {
                let (table_p, table_q) = self.crt_tables()?;
                let exponent = random_limbs(public.rand_bits())?;
                (crt_half(table_p, &exponent, &g_m), crt_half(table_q, &exponent, &g_m))
            }
            Randomizer::Classical => {
                let r = random_unit(public.n())?;
                let half = |prime_squared: &Integer, exponent: &Integer| -> Result<Integer> {
                    let base = Integer::from(&r % prime_squared);
                    let rho = base.pow_mod(exponent, prime_squared).map_err(|_| Error::Randomness)?;
                    Ok(rho * Integer::from(&g_m % prime_squared) % prime_squared)
                };
                (half(&s.p_squared, &s.n_mod_order_p)?, half(&s.q_squared, &s.n_mod_order_q)?)
            }
        };
        Ok(Ciphertext(self.combine_mod_n_squared(&c_p, &c_q)))
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
        check_ciphertext(&self.public, &ciphertext.0, index)?;
        let s = &self.secret;
        let half = |prime: &Integer, prime_squared: &Integer, exponent: &Integer, h: &Integer| -> Result<Integer> {
            let base = Integer::from(&ciphertext.0 % prime_squared);
            if base == 0 {
                return Err(Error::CiphertextOutOfRange { index });
            }
            let u = base.secure_pow_mod(exponent, prime_squared);
            let l = (u - 1u32).div_exact(prime);
            Ok(l * h % prime)
        };
        let m_p = half(&s.p, &s.p_squared, &s.p_minus_1, &s.h_p)?;
        let m_q = half(&s.q, &s.q_squared, &s.q_minus_1, &s.h_q)?;
        let mut t = Integer::from(&m_q - &m_p);
        t *= &s.p_inverse_mod_q;
        t %= &s.q;
        if t < 0 {
            t += &s.q;
        }
        Ok(t * &s.p + m_p)
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

/// (1 + m·n) · h_s^a mod x² from the table for h_s mod x².
fn crt_half(table: &crate::table::FixedBaseTable, exponent: &[u64], g_m: &Integer) -> Integer {
    let mont = table.montgomery();
    let mut scratch = mont.scratch();
    let mut rho = vec![0u64; mont.limbs()];
    table.pow_mont(exponent, &mut rho, &mut scratch);
    let g_m_reduced = Integer::from(g_m % mont.modulus());
    let mut out = vec![0u64; mont.limbs()];
    mont.mul(&rho, &pad(&g_m_reduced, mont.limbs()), &mut out, &mut scratch);
    Integer::from_digits(&out, Order::Lsf)
}
