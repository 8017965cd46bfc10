//! Canonical wire formats (algorithms.md §1.9). All integers big-endian,
//! fixed width, zero-left-padded; ciphertexts never in Montgomery form.
//!
//! ```text
//! public key   u8 len ‖ scheme ‖ u16 k ‖ n (k/8 B) ‖ h_s (2k/8 B) ‖ u16 ℓ ‖ key_id (16 B)
//! secret key   "CSK1" ‖ u32 len ‖ public key ‖ u16 len ‖ p ‖ u16 len ‖ q
//! block        "PCT1" ‖ key_id (16 B) ‖ u32 count ‖ u16 elem_len ‖ u8 encoding
//!              ‖ u16 params_len ‖ params (TLV, owned by the codec) ‖ u8 flags
//!              ‖ count × elem_len bytes of ciphertexts
//! ```
//! Decoding is strict: exact lengths, matching key id, 0 < c < n² for every element.

use crate::error::{malformed, Error, Result};
use crate::keys::{to_fixed_be, DecryptionKey, EncryptionKey, KeyId, SCHEME};
use crate::ops::{check_ciphertext, Ciphertext};
use rayon::prelude::*;
use rug::integer::Order;
use rug::Integer;

const BLOCK_MAGIC: &[u8; 4] = b"PCT1";
const SECRET_MAGIC: &[u8; 4] = b"CSK1";
/// Bytes of a ciphertext block header without its codec parameters.
pub const BLOCK_HEADER_BYTES: usize = 4 + 16 + 4 + 2 + 1 + 2 + 1;
/// Flag bit: every ciphertext was re-randomized after its last homomorphic operation.
pub const FLAG_RERANDOMIZED: u8 = 1;

/// What the plaintexts of a block mean (the codec owns the parameter bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Encoding {
    /// Raw integers in [0, n).
    Raw = 0,
    /// Signed fixed point with a public exponent.
    FixedPoint = 1,
    /// BatchCrypt packing (algorithms.md §2).
    BatchCrypt = 2,
    /// FLBooster unsigned packing (§3).
    FlBooster = 3,
    /// SecureBoost g/h packing (§5.2).
    GhPack = 4,
}

impl Encoding {
    fn from_u8(value: u8) -> Result<Self> {
        Ok(match value {
            0 => Encoding::Raw,
            1 => Encoding::FixedPoint,
            2 => Encoding::BatchCrypt,
            3 => Encoding::FlBooster,
            4 => Encoding::GhPack,
            other => return Err(malformed("ciphertext block", format!("unknown encoding {other} (known: 0-4)"))),
        })
    }
}

/// A block of ciphertexts under one key, as it travels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CiphertextBlock {
    /// Key the ciphertexts belong to.
    pub key_id: KeyId,
    /// Meaning of the plaintexts.
    pub encoding: Encoding,
    /// Codec parameters (TLV), opaque here.
    pub params: Vec<u8>,
    /// Flag bits (bit 0 = re-randomized).
    pub flags: u8,
    /// The ciphertexts.
    pub ciphertexts: Vec<Ciphertext>,
}

struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize, field: &str) -> Result<&'a [u8]> {
        let end = self.position.checked_add(count).filter(|&end| end <= self.bytes.len()).ok_or_else(|| {
            malformed(
                self.what,
                format!("truncated at {field}: needs {count} bytes at offset {}, {} bytes in all", self.position, self.bytes.len()),
            )
        })?;
        let slice = &self.bytes[self.position..end];
        self.position = end;
        Ok(slice)
    }
    fn u8(&mut self, field: &str) -> Result<u8> {
        Ok(self.take(1, field)?[0])
    }
    fn u16(&mut self, field: &str) -> Result<u16> {
        let b = self.take(2, field)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, field: &str) -> Result<u32> {
        let b = self.take(4, field)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn finish(&self) -> Result<()> {
        if self.position != self.bytes.len() {
            return Err(malformed(self.what, format!("{} trailing bytes after the end", self.bytes.len() - self.position)));
        }
        Ok(())
    }
}

impl EncryptionKey {
    /// Canonical public-key bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let modulus_bytes = (self.bits() as usize).div_ceil(8);
        let mut out = Vec::with_capacity(1 + SCHEME.len() + 2 + 3 * modulus_bytes + 2 + 16);
        out.push(SCHEME.len() as u8);
        out.extend_from_slice(SCHEME.as_bytes());
        out.extend_from_slice(&(self.bits() as u16).to_be_bytes());
        out.extend_from_slice(&to_fixed_be(self.n(), modulus_bytes));
        out.extend_from_slice(&to_fixed_be(self.h_s(), 2 * modulus_bytes));
        out.extend_from_slice(&(self.rand_bits() as u16).to_be_bytes());
        out.extend_from_slice(&self.key_id().0);
        out
    }

    /// Parses and validates public-key bytes (the key id must match n and h_s).
    ///
    /// # Errors
    /// `Malformed` naming the field, or `InvalidParameter` from [`EncryptionKey::from_parts`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut reader = Reader { bytes, position: 0, what: "public key" };
        let scheme_len = reader.u8("scheme length")? as usize;
        let scheme = reader.take(scheme_len, "scheme")?;
        if scheme != SCHEME.as_bytes() {
            return Err(malformed("public key", format!("scheme must be {SCHEME:?}, got {:?}", String::from_utf8_lossy(scheme))));
        }
        let bits = reader.u16("k")? as u32;
        let modulus_bytes = (bits as usize).div_ceil(8);
        let n = Integer::from_digits(reader.take(modulus_bytes, "n")?, Order::Msf);
        let h_s = Integer::from_digits(reader.take(2 * modulus_bytes, "h_s")?, Order::Msf);
        let rand_bits = reader.u16("rand_bits")? as u32;
        let key_id = reader.take(16, "key_id")?;
        reader.finish()?;
        if n.significant_bits() != bits {
            return Err(malformed("public key", format!("n has {} bits but k says {bits}", n.significant_bits())));
        }
        let key = EncryptionKey::from_parts(n, h_s, rand_bits)?;
        if key.key_id().0 != key_id {
            return Err(malformed("public key", "key_id does not match n and h_s"));
        }
        Ok(key)
    }
}

impl DecryptionKey {
    /// Explicit export of the secret key (public key + p + q). Handle as a secret.
    pub fn to_secret_bytes(&self) -> Vec<u8> {
        let public = self.public.to_bytes();
        let (p, q) = self.primes();
        let p_bytes: Vec<u8> = p.to_digits(Order::Msf);
        let q_bytes: Vec<u8> = q.to_digits(Order::Msf);
        let mut out = Vec::with_capacity(4 + 4 + public.len() + 4 + p_bytes.len() + q_bytes.len());
        out.extend_from_slice(SECRET_MAGIC);
        out.extend_from_slice(&(public.len() as u32).to_be_bytes());
        out.extend_from_slice(&public);
        out.extend_from_slice(&(p_bytes.len() as u16).to_be_bytes());
        out.extend_from_slice(&p_bytes);
        out.extend_from_slice(&(q_bytes.len() as u16).to_be_bytes());
        out.extend_from_slice(&q_bytes);
        out
    }

    /// Parses a secret key exported by [`DecryptionKey::to_secret_bytes`].
    ///
    /// # Errors
    /// `Malformed` or `InvalidPrivateKey`.
    pub fn from_secret_bytes(bytes: &[u8]) -> Result<Self> {
        let mut reader = Reader { bytes, position: 0, what: "secret key" };
        if reader.take(4, "magic")? != SECRET_MAGIC {
            return Err(malformed("secret key", "magic must be \"CSK1\""));
        }
        let public_len = reader.u32("public key length")? as usize;
        let public = EncryptionKey::from_bytes(reader.take(public_len, "public key")?)?;
        let p_len = reader.u16("p length")? as usize;
        let p = Integer::from_digits(reader.take(p_len, "p")?, Order::Msf);
        let q_len = reader.u16("q length")? as usize;
        let q = Integer::from_digits(reader.take(q_len, "q")?, Order::Msf);
        reader.finish()?;
        DecryptionKey::from_primes(p, q, Some(public))
    }
}

impl CiphertextBlock {
    /// Serializes for `key` (which fixes elem_len = 2k/8).
    ///
    /// # Errors
    /// `KeyMismatch` if the block is not under `key`; `InvalidParameter` if the
    /// count or params exceed their u32/u16 fields.
    pub fn to_bytes(&self, key: &EncryptionKey) -> Result<Vec<u8>> {
        if self.key_id != key.key_id() {
            return Err(Error::KeyMismatch {
                what: "ciphertext block",
                expected: key.key_id().to_string(),
                found: self.key_id.to_string(),
            });
        }
        let count = u32::try_from(self.ciphertexts.len())
            .map_err(|_| crate::error::invalid("ciphertexts", format!("at most {} per block", u32::MAX)))?;
        let params_len =
            u16::try_from(self.params.len()).map_err(|_| crate::error::invalid("params", format!("at most {} bytes", u16::MAX)))?;
        let elem_len = key.ciphertext_bytes();
        let mut out = Vec::with_capacity(BLOCK_HEADER_BYTES + self.params.len() + self.ciphertexts.len() * elem_len);
        out.extend_from_slice(BLOCK_MAGIC);
        out.extend_from_slice(&self.key_id.0);
        out.extend_from_slice(&count.to_be_bytes());
        out.extend_from_slice(&(elem_len as u16).to_be_bytes());
        out.push(self.encoding as u8);
        out.extend_from_slice(&params_len.to_be_bytes());
        out.extend_from_slice(&self.params);
        out.push(self.flags);
        let body_start = out.len();
        out.resize(body_start + self.ciphertexts.len() * elem_len, 0);
        out[body_start..].par_chunks_mut(elem_len).zip(self.ciphertexts.par_iter()).for_each(|(slot, c)| {
            let digits: Vec<u8> = c.0.to_digits(Order::Msf);
            slot[elem_len - digits.len()..].copy_from_slice(&digits);
        });
        Ok(out)
    }

    /// The key id of a serialized block, without parsing the body.
    ///
    /// # Errors
    /// `Malformed` if the header is truncated or the magic is wrong.
    pub fn peek_key_id(bytes: &[u8]) -> Result<KeyId> {
        let mut reader = Reader { bytes, position: 0, what: "ciphertext block" };
        if reader.take(4, "magic")? != BLOCK_MAGIC {
            return Err(malformed("ciphertext block", "magic must be \"PCT1\""));
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(reader.take(16, "key_id")?);
        Ok(KeyId(id))
    }

    /// Parses and validates a block under `key`.
    ///
    /// # Errors
    /// `KeyMismatch` (wrong key id), `Malformed` (bad magic, elem_len, length or
    /// flags), `CiphertextOutOfRange` (c = 0 or c ≥ n²) with the element index.
    pub fn from_bytes(bytes: &[u8], key: &EncryptionKey) -> Result<Self> {
        let key_id = Self::peek_key_id(bytes)?;
        if key_id != key.key_id() {
            return Err(Error::KeyMismatch { what: "ciphertext block", expected: key.key_id().to_string(), found: key_id.to_string() });
        }
        let mut reader = Reader { bytes, position: 20, what: "ciphertext block" };
        let count = reader.u32("count")? as usize;
        let elem_len = reader.u16("elem_len")? as usize;
        if elem_len != key.ciphertext_bytes() {
            return Err(malformed("ciphertext block", format!("elem_len must be {} for this key, got {elem_len}", key.ciphertext_bytes())));
        }
        let encoding = Encoding::from_u8(reader.u8("encoding")?)?;
        let params_len = reader.u16("params length")? as usize;
        let params = reader.take(params_len, "params")?.to_vec();
        let flags = reader.u8("flags")?;
        if flags & !FLAG_RERANDOMIZED != 0 {
            return Err(malformed("ciphertext block", format!("unknown flag bits {flags:#04x} (known: 0x01)")));
        }
        let expected = reader.position + count * elem_len;
        if bytes.len() != expected {
            return Err(malformed(
                "ciphertext block",
                format!("length must be {expected} bytes for {count} ciphertexts, got {}", bytes.len()),
            ));
        }
        let body = &bytes[reader.position..];
        let ciphertexts = body
            .par_chunks(elem_len)
            .enumerate()
            .map(|(index, chunk)| {
                let value = Integer::from_digits(chunk, Order::Msf);
                check_ciphertext(key, &value, index)?;
                Ok(Ciphertext(value))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(CiphertextBlock { key_id, encoding, params, flags, ciphertexts })
    }
}
