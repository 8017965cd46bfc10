//! Vector forms of every operation, parallel with rayon. They run on the rayon
//! pool that is current: wrap calls in [`with_threads`] to choose the thread count.

use crate::error::{invalid, Error, Result};
use crate::keys::{DecryptionKey, EncryptionKey};
use crate::mont::pad;
use crate::ops::{check_ciphertext, Ciphertext, Randomizer};
use rayon::prelude::*;
use rug::integer::Order;
use rug::Integer;

/// Largest thread count accepted by [`with_threads`].
pub const MAX_THREADS: usize = confide_pool::MAX_THREADS;

/// Runs `work` on the workspace's shared rayon pool of `threads` threads (0 = one per core;
/// `confide-pool`: one registry for every crate, reused per size).
///
/// # Errors
/// `InvalidParameter` if `threads` > `MAX_THREADS` or the pool cannot start.
pub fn with_threads<R: Send>(threads: usize, work: impl FnOnce() -> R + Send) -> Result<R> {
    confide_pool::with_threads(threads, work).map_err(|e| invalid("threads", e.to_string()))
}

/// Work unit of the vector forms: the 8 lanes of the IFMA engine.
const BATCH: usize = 8;

fn flatten<T>(chunks: Result<Vec<Vec<T>>>) -> Result<Vec<T>> {
    Ok(chunks?.into_iter().flatten().collect())
}

fn check_plaintexts(key: &EncryptionKey, plaintexts: &[Integer]) -> Result<()> {
    match plaintexts.par_iter().position_first(|m| *m < 0 || m >= key.n()) {
        Some(index) => Err(Error::PlaintextOutOfRange { field: "plaintexts", limit: format!("0 <= m < n (element {index})") }),
        None => Ok(()),
    }
}

fn check_lengths(what: &'static str, expected: usize, found: usize) -> Result<()> {
    if expected != found {
        return Err(Error::LengthMismatch { what, expected, found });
    }
    Ok(())
}

fn with_index<T>(result: Result<T>, index: usize) -> Result<T> {
    result.map_err(|error| match error {
        Error::CiphertextOutOfRange { .. } => Error::CiphertextOutOfRange { index },
        Error::SignedOverflow { .. } => Error::SignedOverflow { index },
        Error::PlaintextOutOfRange { limit, .. } => {
            Error::PlaintextOutOfRange { field: "plaintexts", limit: format!("{limit} (element {index})") }
        }
        other => other,
    })
}

impl EncryptionKey {
    /// Checks 0 < c < n² for every element, reporting the first bad index.
    ///
    /// # Errors
    /// `CiphertextOutOfRange`.
    pub fn validate_all(&self, ciphertexts: &[Ciphertext]) -> Result<()> {
        ciphertexts.par_iter().enumerate().try_for_each(|(index, c)| check_ciphertext(self, &c.0, index))
    }

    /// Encrypts every plaintext with the public key.
    ///
    /// # Errors
    /// As [`EncryptionKey::encrypt_with`], with the failing index.
    pub fn encrypt_many(&self, plaintexts: &[Integer], randomizer: Randomizer) -> Result<Vec<Ciphertext>> {
        check_plaintexts(self, plaintexts)?;
        if randomizer == Randomizer::Classical {
            return plaintexts.par_iter().map(|m| self.encrypt_with(m, randomizer)).collect();
        }
        self.table()?; // build once, before the workers race for it
        flatten(plaintexts.par_chunks(BATCH).map(|chunk| self.encrypt_fixed_base_batch(chunk)).collect())
    }

    /// Element-wise ⊕ of two vectors.
    ///
    /// # Errors
    /// `LengthMismatch`.
    pub fn add_many(&self, a: &[Ciphertext], b: &[Ciphertext]) -> Result<Vec<Ciphertext>> {
        self.sum_many(&[a, b])
    }

    /// Element-wise ⊕ of any number of equally long vectors: Π_j c_j[i] mod n².
    ///
    /// Uses Montgomery products without converting the inputs: m − 1 products of
    /// normal-form values give Π c · R^−(m−1); one product with R^m mod n² fixes it.
    ///
    /// # Errors
    /// `LengthMismatch`; `InvalidParameter` for an empty list.
    pub fn sum_many(&self, vectors: &[&[Ciphertext]]) -> Result<Vec<Ciphertext>> {
        let Some(first) = vectors.first() else {
            return Err(invalid("vectors", "at least one vector is required"));
        };
        for v in vectors {
            check_lengths("summed vector", first.len(), v.len())?;
        }
        match vectors.len() {
            1 => return Ok(first.to_vec()),
            // One mpz product + division (3.2 µs at 2048 bits) beats two Montgomery
            // products (product + correction); Montgomery pays off from three vectors.
            2 => return Ok(first.par_iter().zip(vectors[1].par_iter()).map(|(a, b)| self.add(a, b)).collect()),
            _ => {}
        }
        let mont = self.montgomery();
        let limbs = mont.limbs();
        let r = Integer::from(1) << (64 * limbs as u32);
        let correction = r
            .pow_mod(&Integer::from(vectors.len()), self.n_squared())
            .map_err(|_| invalid("vectors", "cannot build the Montgomery correction"))?;
        let correction = pad(&correction, limbs);
        Ok((0..first.len())
            .into_par_iter()
            .map_init(
                || (mont.scratch(), vec![0u64; limbs], vec![0u64; limbs]),
                |(scratch, acc, tmp), i| {
                    acc.copy_from_slice(&pad(&vectors[0][i].0, limbs));
                    for v in &vectors[1..] {
                        mont.mul(acc, &pad(&v[i].0, limbs), tmp, scratch);
                        acc.copy_from_slice(tmp);
                    }
                    mont.mul(acc, &correction, tmp, scratch);
                    Ciphertext(Integer::from_digits(tmp, Order::Lsf))
                },
            )
            .collect())
    }

    /// Element-wise ⊕ with raw plaintexts.
    ///
    /// # Errors
    /// `LengthMismatch`, `PlaintextOutOfRange`.
    pub fn add_plain_many(&self, a: &[Ciphertext], plaintexts: &[Integer]) -> Result<Vec<Ciphertext>> {
        check_lengths("plaintexts", a.len(), plaintexts.len())?;
        a.par_iter().zip(plaintexts.par_iter()).enumerate().map(|(i, (c, m))| with_index(self.add_plain(c, m), i)).collect()
    }

    /// Element-wise negation.
    ///
    /// # Errors
    /// `CiphertextOutOfRange`.
    pub fn negate_many(&self, a: &[Ciphertext]) -> Result<Vec<Ciphertext>> {
        a.par_iter().enumerate().map(|(i, c)| with_index(self.negate(c), i)).collect()
    }

    /// Element-wise ⊗ with signed scalars.
    ///
    /// # Errors
    /// `LengthMismatch`, `CiphertextOutOfRange`.
    pub fn mul_scalar_many(&self, a: &[Ciphertext], scalars: &[Integer]) -> Result<Vec<Ciphertext>> {
        check_lengths("scalars", a.len(), scalars.len())?;
        a.par_iter().zip(scalars.par_iter()).enumerate().map(|(i, (c, s))| with_index(self.mul_scalar(c, s), i)).collect()
    }

    /// Every ciphertext raised to one secret exponent mod n² (threshold partial decryption:
    /// c^(2·Δ·d_j)). With IFMA, eight ciphertexts share each constant-time exponentiation
    /// (`pow_shared_exponent`); otherwise GMP's `mpz_powm_sec`. A negative exponent inverts
    /// the results.
    ///
    /// # Errors
    /// `CiphertextOutOfRange` with the failing index (also when a ciphertext has no inverse).
    pub fn pow_shared_many(&self, a: &[Ciphertext], exponent: &Integer) -> Result<Vec<Ciphertext>> {
        for (i, c) in a.iter().enumerate() {
            check_ciphertext(self, c.as_integer(), i)?;
        }
        let magnitude = Integer::from(exponent.abs_ref());
        let n_squared = self.n_squared();
        #[cfg(target_arch = "x86_64")]
        let ifma = if a.len() >= 2 { crate::ifma::IfmaModulus::new(n_squared) } else { None };
        #[cfg(not(target_arch = "x86_64"))]
        let ifma: Option<()> = None;
        let powers: Vec<Integer> = match &ifma {
            #[cfg(target_arch = "x86_64")]
            Some(modulus) => a
                .par_chunks(crate::ifma::LANES)
                .flat_map_iter(|chunk| modulus.pow_shared_exponent(&chunk.iter().map(|c| c.as_integer()).collect::<Vec<_>>(), &magnitude))
                .collect(),
            _ => a
                .par_iter()
                .map(|c| if magnitude == 0 { Integer::from(1) } else { c.as_integer().clone().secure_pow_mod(&magnitude, n_squared) })
                .collect(),
        };
        if *exponent >= 0 {
            return Ok(powers.into_iter().map(Ciphertext).collect());
        }
        powers
            .into_par_iter()
            .enumerate()
            .map(|(i, p)| p.invert(n_squared).map(Ciphertext).map_err(|_| Error::CiphertextOutOfRange { index: i }))
            .collect()
    }

    /// Element-wise re-randomization.
    ///
    /// # Errors
    /// `Randomness`.
    pub fn rerandomize_many(&self, a: &[Ciphertext]) -> Result<Vec<Ciphertext>> {
        let zeros = self.encrypt_many(&vec![Integer::new(); a.len()], Randomizer::FixedBase)?;
        Ok(a.par_iter().zip(zeros.par_iter()).map(|(c, zero)| self.add(c, zero)).collect())
    }
}

impl DecryptionKey {
    /// CRT encryption of every plaintext (key-holder path).
    ///
    /// # Errors
    /// As [`DecryptionKey::encrypt_with`], with the failing index.
    pub fn encrypt_many(&self, plaintexts: &[Integer], randomizer: Randomizer) -> Result<Vec<Ciphertext>> {
        check_plaintexts(self.encryption_key(), plaintexts)?;
        if randomizer == Randomizer::Classical {
            return plaintexts.par_iter().map(|m| self.encrypt_with(m, randomizer)).collect();
        }
        self.crt_tables()?;
        flatten(plaintexts.par_chunks(BATCH).map(|chunk| self.encrypt_fixed_base_batch(chunk)).collect())
    }

    /// Decrypts every ciphertext to its raw plaintext in [0, n).
    ///
    /// # Errors
    /// `CiphertextOutOfRange` with the failing index.
    pub fn decrypt_many(&self, ciphertexts: &[Ciphertext]) -> Result<Vec<Integer>> {
        flatten(ciphertexts.par_chunks(BATCH).enumerate().map(|(k, chunk)| self.decrypt_batch(chunk, k * BATCH)).collect())
    }

    /// Decrypts every ciphertext through the signed window.
    ///
    /// # Errors
    /// `CiphertextOutOfRange`, `SignedOverflow`, with the failing index.
    pub fn decrypt_signed_many(&self, ciphertexts: &[Ciphertext]) -> Result<Vec<Integer>> {
        let plaintexts = self.decrypt_many(ciphertexts)?;
        plaintexts.par_iter().enumerate().map(|(i, m)| self.public.decode_signed(m, i)).collect()
    }
}
