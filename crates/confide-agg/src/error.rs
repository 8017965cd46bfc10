//! Errors of the data plane. Every message names the field and the limit.

/// What went wrong.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum Error {
    /// A parameter is out of its range.
    #[error("invalid parameter {field}: {reason}")]
    InvalidParameter {
        /// Which parameter.
        field: &'static str,
        /// Why, with the limit.
        reason: String,
    },
    /// One slice was refused (size, index, participant, non-finite value, authentication).
    #[error("slice {index}: {reason}")]
    Slice {
        /// Slice index.
        index: u32,
        /// Why, with the limit.
        reason: String,
    },
    /// A checkpoint or other serialized blob does not parse or does not fit the round.
    #[error("malformed {what}: {reason}")]
    Malformed {
        /// Which blob.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A received batch does not fit its round (index range, values per slice, share).
    #[error("{0}")]
    Batch(String),
    /// A round id that is not open.
    #[error("round {round_id} is not open")]
    UnknownRound {
        /// The round id.
        round_id: u64,
    },
    /// A Paillier error (payload of a `paillier` round).
    #[error("slice {index}: {source}")]
    Paillier {
        /// Slice index.
        index: u32,
        /// The underlying error.
        source: confide_paillier::Error,
    },
    /// Spill file I/O.
    #[error("spill file {path}: {reason}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        reason: String,
    },
    /// A cryptographic operation failed (key wrapping, sealing, randomness).
    #[error("enclave: {0}")]
    Crypto(String),
    /// The worker threads are gone.
    #[error("data plane worker {worker} has stopped")]
    Stopped {
        /// Worker number.
        worker: usize,
    },
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidParameter { field, reason: reason.into() }
}

pub(crate) fn slice_error(index: u32, reason: impl Into<String>) -> Error {
    Error::Slice { index, reason: reason.into() }
}

pub(crate) fn malformed(what: &'static str, reason: impl Into<String>) -> Error {
    Error::Malformed { what, reason: reason.into() }
}
