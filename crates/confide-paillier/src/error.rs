//! The one error type of this crate. Messages name the field and the limit and
//! never contain secret-dependent values.

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in `confide-paillier`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Key generation was asked for a size we do not support.
    #[error("unsupported key size {bits} bits: supported sizes are 2048, 3072 and 4096")]
    UnsupportedKeySize {
        /// The requested size.
        bits: u32,
    },
    /// A plaintext does not fit the key's plaintext space.
    #[error("{field} out of range: plaintexts must satisfy {limit}")]
    PlaintextOutOfRange {
        /// Which input was wrong.
        field: &'static str,
        /// The bound that was violated.
        limit: String,
    },
    /// A ciphertext is not a canonical element of Z_{n^2} (0 < c < n^2).
    #[error("ciphertext at index {index} out of range: ciphertexts must satisfy 0 < c < n^2")]
    CiphertextOutOfRange {
        /// Position in the vector or block.
        index: usize,
    },
    /// Two objects belong to different keys.
    #[error("key mismatch: {what} belongs to key {found}, expected key {expected}")]
    KeyMismatch {
        /// What carried the wrong key.
        what: &'static str,
        /// Key id expected (hex).
        expected: String,
        /// Key id found (hex).
        found: String,
    },
    /// Two vectors that must have equal lengths do not.
    #[error("length mismatch: {what} has {found} elements, expected {expected}")]
    LengthMismatch {
        /// What had the wrong length.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Actual length.
        found: usize,
    },
    /// A byte string is not a valid encoding.
    #[error("malformed {what}: {reason}")]
    Malformed {
        /// What was being decoded.
        what: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// A parameter is outside its allowed range.
    #[error("invalid parameter {field}: {reason}")]
    InvalidParameter {
        /// Parameter name.
        field: &'static str,
        /// The rule it broke.
        reason: String,
    },
    /// A decrypted value lies outside the signed window |v| ≤ ⌊n/3⌋ − 1.
    #[error("decrypted value at index {index} overflowed the signed range |v| <= floor(n/3) - 1")]
    SignedOverflow {
        /// Position in the vector.
        index: usize,
    },
    /// Private key material is inconsistent (for example p or q is not prime).
    #[error("invalid private key: {0}")]
    InvalidPrivateKey(&'static str),
    /// The operating system's random number generator failed.
    #[error("the operating system random number generator failed")]
    Randomness,
}

pub(crate) fn malformed(what: &'static str, reason: impl Into<String>) -> Error {
    Error::Malformed { what, reason: reason.into() }
}

pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidParameter { field, reason: reason.into() }
}
