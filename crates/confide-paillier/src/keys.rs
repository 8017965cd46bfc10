//! Keys: generation (algorithms.md §1.1), the DJN public element h_s (§1.4),
//! the key id (§1.9) and the constants that CRT encryption (§1.6) and CRT
//! decryption (§1.7) need.

use crate::error::{invalid, Error, Result};
use crate::mont::Montgomery;
use crate::random::{random_bits, random_unit};
use crate::table::BaseTable;
use rug::integer::{IsPrime, Order};
use rug::Integer;
use sha2::{Digest, Sha256};
use std::fmt;
use std::sync::{Arc, OnceLock};

/// Scheme name carried in the public-key wire format.
pub const SCHEME: &str = "paillier-djn-v1";
/// Key sizes that `DecryptionKey::generate` accepts (NIST: 2048 ↔ 112-bit, 3072 ↔ 128-bit security).
pub const SUPPORTED_KEY_BITS: [u32; 3] = [2048, 3072, 4096];
/// Smallest modulus accepted anywhere (imports included): below 2048 bits is under 112-bit security.
pub const MIN_KEY_BITS: u32 = 2048;

/// 16-byte key identifier: SHA-256(scheme ‖ n ‖ h_s)[0..16].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId(pub [u8; 16]);

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// Default window of the public fixed-base table (h_s mod n²) for a `bits`-bit n.
///
/// With AVX-512 IFMA (8 lanes) w = 8 (2048-bit: 20 MiB). On the GMP path, measured
/// here (docs/crypto.md), w = 8/10/11 give ~2.5k/3.2k/3.4k encryptions/s per core
/// for 16/51/98 MiB, so it uses 11. Tables exist only in processes that encrypt.
pub fn default_window(bits: u32) -> u32 {
    if crate::ifma_available() {
        return if bits <= 3072 { 8 } else { 7 };
    }
    match bits {
        0..=2048 => 11,
        2049..=3072 => 8,
        _ => 7,
    }
}

/// Default window of the two CRT tables (h_s mod p², mod q²) of a key holder
/// (2048-bit, w = 8: 2 × 10 MiB with IFMA; w = 10: 2 × 25.7 MiB on GMP).
pub fn default_crt_window(bits: u32) -> u32 {
    if crate::ifma_available() {
        return 8;
    }
    match bits {
        0..=2048 => 10,
        _ => 8,
    }
}

pub(crate) struct PublicParts {
    pub(crate) n: Integer,
    pub(crate) n_squared: Integer,
    pub(crate) h_s: Integer,
    pub(crate) bits: u32,
    pub(crate) rand_bits: u32,
    pub(crate) key_id: KeyId,
    pub(crate) max_signed: Integer,
    pub(crate) window: u32,
    pub(crate) crt_window: u32,
    table: OnceLock<Result<BaseTable>>,
    montgomery: OnceLock<Montgomery>,
}

/// A Paillier public key with g = n + 1 and DJN randomizer base h_s = h^n mod n².
///
/// Cloning is cheap (shared); the fixed-base table is built on first use and
/// shared by all clones and threads.
#[derive(Clone)]
pub struct EncryptionKey {
    pub(crate) inner: Arc<PublicParts>,
}

impl fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EncryptionKey(bits={}, key_id={})", self.inner.bits, self.inner.key_id)
    }
}

impl PartialEq for EncryptionKey {
    fn eq(&self, other: &Self) -> bool {
        self.inner.key_id == other.inner.key_id && self.inner.n == other.inner.n && self.inner.h_s == other.inner.h_s
    }
}
impl Eq for EncryptionKey {}

impl EncryptionKey {
    /// Builds a public key from n and h_s, validating both.
    ///
    /// # Errors
    /// `InvalidParameter` when n is even, smaller than `MIN_KEY_BITS` bits, or h_s is not in [1, n²).
    pub fn from_parts(n: Integer, h_s: Integer, rand_bits: u32) -> Result<Self> {
        let bits = n.significant_bits();
        if bits < MIN_KEY_BITS {
            return Err(invalid("n", format!("modulus has {bits} bits; the minimum is {MIN_KEY_BITS}")));
        }
        if n.is_even() {
            return Err(invalid("n", "modulus must be odd"));
        }
        let n_squared = Integer::from(&n * &n);
        if h_s <= 0 || h_s >= n_squared {
            return Err(invalid("h_s", "must satisfy 0 < h_s < n^2"));
        }
        if rand_bits < 2 * 112 || rand_bits > 2 * bits {
            return Err(invalid("rand_bits", format!("must be in [224, {}], got {rand_bits}", 2 * bits)));
        }
        let key_id = key_id_of(&n, &h_s, bits);
        let max_signed = Integer::from(&n / 3u32) - 1u32;
        Ok(EncryptionKey {
            inner: Arc::new(PublicParts {
                window: default_window(bits),
                crt_window: default_crt_window(bits),
                n,
                n_squared,
                h_s,
                bits,
                rand_bits,
                key_id,
                max_signed,
                table: OnceLock::new(),
                montgomery: OnceLock::new(),
            }),
        })
    }

    /// The same key with another window for both the public and the CRT tables
    /// (memory/speed trade-off, §1.5).
    ///
    /// # Errors
    /// `InvalidParameter` unless 1 ≤ window ≤ 16.
    pub fn with_window(&self, window: u32) -> Result<Self> {
        if !(1..=16).contains(&window) {
            return Err(invalid("window", format!("must be in 1..=16, got {window}")));
        }
        let p = &self.inner;
        Ok(EncryptionKey {
            inner: Arc::new(PublicParts {
                n: p.n.clone(),
                n_squared: p.n_squared.clone(),
                h_s: p.h_s.clone(),
                bits: p.bits,
                rand_bits: p.rand_bits,
                key_id: p.key_id,
                max_signed: p.max_signed.clone(),
                window,
                crt_window: window,
                table: OnceLock::new(),
                montgomery: OnceLock::new(),
            }),
        })
    }

    /// The modulus n.
    pub fn n(&self) -> &Integer {
        &self.inner.n
    }
    /// n².
    pub fn n_squared(&self) -> &Integer {
        &self.inner.n_squared
    }
    /// The DJN randomizer base h_s.
    pub fn h_s(&self) -> &Integer {
        &self.inner.h_s
    }
    /// Bit length k of n.
    pub fn bits(&self) -> u32 {
        self.inner.bits
    }
    /// Bit length ℓ of the DJN exponent.
    pub fn rand_bits(&self) -> u32 {
        self.inner.rand_bits
    }
    /// The key id.
    pub fn key_id(&self) -> KeyId {
        self.inner.key_id
    }
    /// Bytes of one ciphertext on the wire (2k/8, k rounded up to a byte).
    pub fn ciphertext_bytes(&self) -> usize {
        2 * (self.inner.bits as usize).div_ceil(8)
    }
    /// Largest magnitude of a signed plaintext: ⌊n/3⌋ − 1 (§1.2).
    pub fn max_signed(&self) -> &Integer {
        &self.inner.max_signed
    }
    /// Window of the public fixed-base table.
    pub fn window(&self) -> u32 {
        self.inner.window
    }
    /// Window of a key holder's CRT tables.
    pub fn crt_window(&self) -> u32 {
        self.inner.crt_window
    }

    /// The fixed-base table for h_s mod n², built on first use.
    pub(crate) fn table(&self) -> Result<&BaseTable> {
        self.inner
            .table
            .get_or_init(|| BaseTable::new(&self.inner.n_squared, &self.inner.h_s, self.inner.rand_bits, self.inner.window))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Montgomery context mod n² for homomorphic sums (no table: aggregators never build one).
    pub(crate) fn montgomery(&self) -> &Montgomery {
        self.inner.montgomery.get_or_init(|| Montgomery::new(&self.inner.n_squared))
    }

    /// Builds the fixed-base table now (otherwise built on first encryption); returns its size in bytes.
    ///
    /// # Errors
    /// Propagates table construction errors.
    pub fn precompute(&self) -> Result<usize> {
        Ok(self.table()?.size_bytes())
    }
}

pub(crate) struct SecretParts {
    pub(crate) p: Integer,
    pub(crate) q: Integer,
    pub(crate) p_squared: Integer,
    pub(crate) q_squared: Integer,
    pub(crate) p_minus_1: Integer,
    pub(crate) q_minus_1: Integer,
    /// h_p = −q⁻¹ mod p (g = n + 1 simplification of [Pai99]'s h-function).
    pub(crate) h_p: Integer,
    /// h_q = −p⁻¹ mod q.
    pub(crate) h_q: Integer,
    pub(crate) p_inverse_mod_q: Integer,
    pub(crate) q_squared_inverse_mod_p_squared: Integer,
    /// n mod p(p−1) and n mod q(q−1): exponents of the classical randomizer r^n by CRT.
    pub(crate) n_mod_order_p: Integer,
    pub(crate) n_mod_order_q: Integer,
    table_p: OnceLock<Result<BaseTable>>,
    table_q: OnceLock<Result<BaseTable>>,
    #[cfg(target_arch = "x86_64")]
    pub(crate) ifma_moduli: OnceLock<Option<(crate::ifma::IfmaModulus, crate::ifma::IfmaModulus)>>,
    /// Garner's recombination on the lanes, when both CRT tables run on IFMA.
    #[cfg(target_arch = "x86_64")]
    pub(crate) ifma_crt: OnceLock<Option<crate::ifma::IfmaCrt>>,
}

/// A Paillier private key: the factors p, q of n plus the public key.
///
/// Never printed (`Debug` is redacted) and not serializable except through the
/// explicit [`DecryptionKey::to_secret_bytes`].
#[derive(Clone)]
pub struct DecryptionKey {
    pub(crate) public: EncryptionKey,
    pub(crate) secret: Arc<SecretParts>,
}

impl fmt::Debug for DecryptionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DecryptionKey(bits={}, key_id={}, secret=<redacted>)", self.public.bits(), self.public.key_id())
    }
}

impl DecryptionKey {
    /// Generates a key pair of `bits` ∈ {2048, 3072, 4096} from the OS CSPRNG:
    /// |p| = |q| = k/2, p ≡ q ≡ 3 (mod 4), gcd(p−1, q−1) = 2, |p − q| > 2^(k/2−100)
    /// (FIPS 186-4, B.3.1),
    /// n of exactly k bits; h = −x² mod n for a random unit x, h_s = h^n mod n².
    ///
    /// # Errors
    /// `UnsupportedKeySize` for other sizes; `Randomness` if the OS RNG fails.
    pub fn generate(bits: u32) -> Result<Self> {
        if !SUPPORTED_KEY_BITS.contains(&bits) {
            return Err(Error::UnsupportedKeySize { bits });
        }
        let half = bits / 2;
        // A failed pair condition redraws both primes. (Keeping p and redrawing only q
        // made the run time heavy-tailed: for a p near the middle of its range almost
        // no q passed the old |p − q| bound, and generation could stall for seconds.)
        loop {
            let p = random_prime_3_mod_4(half)?;
            let q = random_prime_3_mod_4(half)?;
            let n = Integer::from(&p * &q);
            if n.significant_bits() != bits {
                continue;
            }
            let difference = Integer::from(&p - &q).abs();
            if difference.significant_bits() <= half - 100 {
                continue;
            }
            let gcd = Integer::from(&p - 1u32).gcd(&Integer::from(&q - 1u32));
            if gcd != 2 {
                continue;
            }
            // next_prime already ran GMP's BPSW + Miller-Rabin; skip from_primes' re-check.
            return Self::from_checked_primes(p, q, None);
        }
    }

    /// Rebuilds a private key from p and q. With `public` given (an existing
    /// public key for n = p·q) that key is kept; otherwise a fresh DJN element
    /// h_s is drawn, which gives a new key id.
    ///
    /// # Errors
    /// `InvalidPrivateKey` if p or q is not prime, p = q, or `public.n ≠ p·q`.
    pub fn from_primes(p: Integer, q: Integer, public: Option<EncryptionKey>) -> Result<Self> {
        if p <= 2 || q <= 2 || p.is_probably_prime(30) == IsPrime::No || q.is_probably_prime(30) == IsPrime::No {
            return Err(Error::InvalidPrivateKey("p and q must be odd primes"));
        }
        Self::from_checked_primes(p, q, public)
    }

    fn from_checked_primes(p: Integer, q: Integer, public: Option<EncryptionKey>) -> Result<Self> {
        if p == q {
            return Err(Error::InvalidPrivateKey("p and q must differ"));
        }
        let n = Integer::from(&p * &q);
        let public = match public {
            Some(key) => {
                if key.n() != &n {
                    return Err(Error::InvalidPrivateKey("p·q does not equal the public modulus n"));
                }
                key
            }
            None => {
                let x = random_unit(&n)?;
                let h = &n - Integer::from(&x * &x) % &n;
                let h_s = crt_power(&h, &n, &p, &q)?;
                let rand_bits = n.significant_bits().div_ceil(2);
                EncryptionKey::from_parts(n.clone(), h_s, rand_bits)?
            }
        };
        let p_squared = Integer::from(&p * &p);
        let q_squared = Integer::from(&q * &q);
        let p_minus_1 = Integer::from(&p - 1u32);
        let q_minus_1 = Integer::from(&q - 1u32);
        let inverse = |a: &Integer, m: &Integer| -> Result<Integer> {
            a.clone().invert(m).map_err(|_| Error::InvalidPrivateKey("p and q must be coprime"))
        };
        let q_inverse_mod_p = inverse(&q, &p)?;
        let p_inverse_mod_q = inverse(&p, &q)?;
        let h_p = &p - q_inverse_mod_p;
        let h_q = Integer::from(&q - &p_inverse_mod_q);
        let q_squared_inverse_mod_p_squared = inverse(&q_squared, &p_squared)?;
        let order_p = Integer::from(&p * &p_minus_1);
        let order_q = Integer::from(&q * &q_minus_1);
        let n_mod_order_p = Integer::from(&n % &order_p);
        let n_mod_order_q = Integer::from(&n % &order_q);
        Ok(DecryptionKey {
            public,
            secret: Arc::new(SecretParts {
                p,
                q,
                p_squared,
                q_squared,
                p_minus_1,
                q_minus_1,
                h_p,
                h_q,
                p_inverse_mod_q,
                q_squared_inverse_mod_p_squared,
                n_mod_order_p,
                n_mod_order_q,
                table_p: OnceLock::new(),
                table_q: OnceLock::new(),
                #[cfg(target_arch = "x86_64")]
                ifma_moduli: OnceLock::new(),
                #[cfg(target_arch = "x86_64")]
                ifma_crt: OnceLock::new(),
            }),
        })
    }

    /// The public half.
    pub fn encryption_key(&self) -> &EncryptionKey {
        &self.public
    }

    /// The prime factors (p, q). Secret: callers decide where they may go.
    pub fn primes(&self) -> (&Integer, &Integer) {
        (&self.secret.p, &self.secret.q)
    }

    /// Tables for h_s mod p² and mod q², for CRT encryption by the key holder.
    pub(crate) fn crt_tables(&self) -> Result<(&BaseTable, &BaseTable)> {
        let s = &self.secret;
        let public = &self.public;
        let build = |prime_squared: &Integer| BaseTable::new(prime_squared, public.h_s(), public.rand_bits(), public.crt_window());
        let table_p = s.table_p.get_or_init(|| build(&s.p_squared)).as_ref().map_err(Clone::clone)?;
        let table_q = s.table_q.get_or_init(|| build(&s.q_squared)).as_ref().map_err(Clone::clone)?;
        Ok((table_p, table_q))
    }

    /// Builds the CRT tables now; returns their total size in bytes.
    ///
    /// # Errors
    /// Propagates table construction errors.
    pub fn precompute(&self) -> Result<usize> {
        let (table_p, table_q) = self.crt_tables()?;
        Ok(table_p.size_bytes() + table_q.size_bytes())
    }

    /// Garner recombination of values mod p² and q² into one mod n² (§1.6).
    pub(crate) fn combine_mod_n_squared(&self, mod_p_squared: &Integer, mod_q_squared: &Integer) -> Integer {
        let s = &self.secret;
        let mut difference = Integer::from(mod_p_squared - mod_q_squared);
        difference *= &s.q_squared_inverse_mod_p_squared;
        difference %= &s.p_squared;
        if difference < 0 {
            difference += &s.p_squared;
        }
        difference *= &s.q_squared;
        difference += mod_q_squared;
        difference
    }
}

fn key_id_of(n: &Integer, h_s: &Integer, bits: u32) -> KeyId {
    let modulus_bytes = (bits as usize).div_ceil(8);
    let mut hasher = Sha256::new();
    hasher.update(SCHEME.as_bytes());
    hasher.update(to_fixed_be(n, modulus_bytes));
    hasher.update(to_fixed_be(h_s, 2 * modulus_bytes));
    let digest = hasher.finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    KeyId(id)
}

/// Big-endian, zero-left-padded to `len` bytes (x must fit).
pub(crate) fn to_fixed_be(x: &Integer, len: usize) -> Vec<u8> {
    let digits: Vec<u8> = x.to_digits(Order::Msf);
    let mut out = vec![0u8; len.saturating_sub(digits.len())];
    out.extend_from_slice(&digits);
    out
}

/// h^n mod n² by CRT (≈4x cheaper than one exponentiation mod n²; keygen only).
fn crt_power(h: &Integer, n: &Integer, p: &Integer, q: &Integer) -> Result<Integer> {
    let half = |prime: &Integer| -> Result<(Integer, Integer)> {
        let square = Integer::from(prime * prime);
        let order = prime * Integer::from(prime - 1u32);
        let exponent = Integer::from(n % &order);
        let value = Integer::from(h % &square).pow_mod(&exponent, &square).map_err(|_| Error::InvalidPrivateKey("cannot derive h_s"))?;
        Ok((value, square))
    };
    let (value_p, p_squared) = half(p)?;
    let (value_q, q_squared) = half(q)?;
    let inverse = q_squared.clone().invert(&p_squared).map_err(|_| Error::InvalidPrivateKey("p and q must be coprime"))?;
    let mut t = Integer::from(&value_p - &value_q) * inverse % &p_squared;
    if t < 0 {
        t += &p_squared;
    }
    Ok(t * q_squared + value_q)
}

/// A random prime of exactly `bits` bits, ≡ 3 (mod 4), with its top two bits set
/// (so that the product of two of them has exactly 2·bits bits).
fn random_prime_3_mod_4(bits: u32) -> Result<Integer> {
    loop {
        let mut candidate = random_bits(bits)?;
        candidate.set_bit(bits - 1, true);
        candidate.set_bit(bits - 2, true);
        // GMP 6.3's next_prime runs BPSW plus Miller-Rabin rounds on each candidate.
        let mut prime = candidate.next_prime();
        while prime.mod_u(4) != 3 {
            prime = prime.next_prime();
        }
        if prime.significant_bits() == bits {
            return Ok(prime);
        }
    }
}
