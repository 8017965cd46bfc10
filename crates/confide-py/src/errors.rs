//! The one mapping from Rust errors to Python exceptions: every crate's error type
//! converts into [`NativeError`], and [`class_name`] is the single table from its
//! kinds to the `confide.errors` classes. The exception classes live in
//! `confide/errors.py` (so they can also subclass `ValueError` or `OSError`); they
//! are looked up once and cached.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// A native error on its way to Python.
pub enum NativeError {
    Paillier(confide_paillier::Error),
    Codec(confide_codec::Error),
    Psi(confide_psi::Error),
    /// The aggregation data plane.
    Agg(confide_agg::Error),
    /// The data port (its server could not start, or a setting is out of range).
    Net(confide_aggnet::NetError),
    /// An argument the binding itself checks (shape, length, range).
    InvalidArgument {
        field: &'static str,
        reason: String,
    },
    /// A decrypted value is valid but outside int64.
    NotInt64 {
        index: usize,
    },
}

impl From<confide_paillier::Error> for NativeError {
    fn from(error: confide_paillier::Error) -> Self {
        NativeError::Paillier(error)
    }
}
impl From<confide_codec::Error> for NativeError {
    fn from(error: confide_codec::Error) -> Self {
        NativeError::Codec(error)
    }
}

impl From<confide_psi::Error> for NativeError {
    fn from(error: confide_psi::Error) -> Self {
        NativeError::Psi(error)
    }
}

impl From<confide_agg::Error> for NativeError {
    fn from(error: confide_agg::Error) -> Self {
        NativeError::Agg(error)
    }
}

impl From<confide_aggnet::NetError> for NativeError {
    fn from(error: confide_aggnet::NetError) -> Self {
        NativeError::Net(error)
    }
}

pub type NativeResult<T> = Result<T, NativeError>;

fn class_name(error: &NativeError) -> &'static str {
    use confide_codec::Error as C;
    use confide_paillier::Error as P;
    match error {
        NativeError::Paillier(e) => match e {
            P::UnsupportedKeySize { .. } | P::InvalidParameter { .. } | P::LengthMismatch { .. } => "InvalidParameterError",
            P::PlaintextOutOfRange { .. } | P::SignedOverflow { .. } => "EncodingError",
            P::CiphertextOutOfRange { .. } => "InvalidCiphertextError",
            P::KeyMismatch { .. } => "KeyMismatchError",
            P::Malformed { .. } => "WireFormatError",
            P::InvalidPrivateKey(_) => "InvalidKeyError",
            _ => "CryptoError",
        },
        NativeError::Codec(e) => match e {
            C::InvalidParameter { .. } => "InvalidParameterError",
            C::NotFinite { .. } | C::TooManySummands { .. } => "EncodingError",
            C::Malformed(_) => "WireFormatError",
            _ => "CryptoError",
        },
        NativeError::Psi(e) => match e {
            confide_psi::Error::InvalidParameter { .. } => "InvalidParameterError",
            confide_psi::Error::InvalidPoint { .. } => "WireFormatError",
            confide_psi::Error::DuplicateTag { .. } => "ProtocolError",
            _ => "CryptoError",
        },
        NativeError::Agg(e) => {
            use confide_agg::Error as A;
            match e {
                A::InvalidParameter { .. } | A::Slice { .. } | A::UnknownRound { .. } | A::Batch(_) => "InvalidParameterError",
                A::Malformed { .. } | A::Paillier { .. } => "WireFormatError",
                A::Crypto(_) => "CryptoError",
                _ => "ConfideError",
            }
        }
        NativeError::Net(e) => match e {
            confide_aggnet::NetError::InvalidParameter { .. } => "InvalidParameterError",
            confide_aggnet::NetError::Start(_) => "ServerStartError",
        },
        NativeError::InvalidArgument { .. } => "InvalidParameterError",
        NativeError::NotInt64 { .. } => "EncodingError",
    }
}

impl From<NativeError> for PyErr {
    fn from(error: NativeError) -> PyErr {
        let message = match &error {
            NativeError::Paillier(e) => e.to_string(),
            NativeError::Codec(e) => e.to_string(),
            NativeError::Psi(e) => e.to_string(),
            NativeError::Agg(e) => e.to_string(),
            NativeError::Net(e) => e.to_string(),
            NativeError::InvalidArgument { field, reason } => format!("invalid parameter {field}: {reason}"),
            NativeError::NotInt64 { index } => {
                format!("decrypted value at index {index} does not fit in int64: use decrypt_integers for big plaintexts")
            }
        };
        let name = class_name(&error);
        python_error(name, message)
    }
}

/// Any crate's error as the Python exception [`class_name`] picks (`.map_err(to_py)`).
pub(crate) fn to_py(error: impl Into<NativeError>) -> PyErr {
    error.into().into()
}

/// The `confide.errors` class `name` with `message` (RuntimeError if it cannot be imported).
pub(crate) fn python_error(name: &'static str, message: String) -> PyErr {
    Python::attach(|py| {
        static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
        let class = MODULE
            .get_or_try_init(py, || py.import("confide.errors").map(Bound::unbind))
            .and_then(|module| module.bind(py).getattr(name))
            .and_then(|class| class.cast_into::<PyType>().map_err(PyErr::from));
        match class {
            Ok(class) => PyErr::from_type(class, message),
            Err(_) => PyRuntimeError::new_err(format!("{name}: {message}")),
        }
    })
}

/// Shorthand for a Python-side parameter error built in the binding itself.
pub fn invalid(field: &'static str, reason: impl Into<String>) -> PyErr {
    NativeError::InvalidArgument { field, reason: reason.into() }.into()
}
