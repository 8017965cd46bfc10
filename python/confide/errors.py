"""The ``ConfideError`` family.

Native errors are mapped to these classes in one place (``crates/confide-py/src/errors.rs``).
Input errors also subclass :class:`ValueError`, so ``except ValueError`` keeps working.
Messages name the field and the limit and never contain secret values.
"""

__all__ = [
    "ConfideError",
    "CryptoError",
    "EncodingError",
    "InvalidCiphertextError",
    "InvalidKeyError",
    "InvalidParameterError",
    "KeyMismatchError",
    "WireFormatError",
]


class ConfideError(Exception):
    """Root of every error raised by Confide."""


class CryptoError(ConfideError):
    """A cryptographic operation failed (for example the OS random generator)."""


class InvalidParameterError(ConfideError, ValueError):
    """A parameter is outside its allowed range; the message names it and the limit."""


class EncodingError(ConfideError, ValueError):
    """A value cannot be encoded or decoded (out of range, not finite, too many summands)."""


class InvalidCiphertextError(CryptoError, ValueError):
    """A ciphertext is not in (0, n^2) for its key."""


class InvalidKeyError(CryptoError, ValueError):
    """Key material is inconsistent (for example p or q not prime)."""


class KeyMismatchError(CryptoError, ValueError):
    """Objects under different keys were combined."""


class WireFormatError(ConfideError, ValueError):
    """Bytes are not a valid encoding (truncated, wrong magic, wrong length...)."""
