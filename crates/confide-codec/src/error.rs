//! The one error type of this crate.

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong while encoding or decoding.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A codec parameter is outside its range.
    #[error("invalid parameter {field}: {reason}")]
    InvalidParameter {
        /// Parameter name.
        field: &'static str,
        /// The rule it broke.
        reason: String,
    },
    /// An input value is NaN or infinite.
    #[error("values[{index}] is not finite (NaN or infinity cannot be quantized)")]
    NotFinite {
        /// Position of the value.
        index: usize,
    },
    /// More summands than the carry bits can hold: slots would spill into each other.
    #[error("sum of {summands} vectors exceeds the codec's capacity of {capacity} summands (padding bits)")]
    TooManySummands {
        /// Vectors summed.
        summands: u64,
        /// Largest count the padding allows.
        capacity: u64,
    },
    /// Packed plaintexts do not have the shape the codec expects.
    #[error("malformed packed data: {0}")]
    Malformed(String),
    /// The operating system's random number generator failed.
    #[error("the operating system random number generator failed")]
    Randomness,
}

pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidParameter { field, reason: reason.into() }
}
