"""The ``ConfideError`` family.

Native errors are mapped to these classes in one place (``crates/confide-py/src/errors.rs``).
Input errors also subclass :class:`ValueError`, so ``except ValueError`` keeps working.
Messages name the field and the limit and never contain secret values.
"""

__all__ = [
    "CertificateError",
    "CertificateRevokedError",
    "ConfideError",
    "ConflictError",
    "CryptoError",
    "DataAccessDeniedError",
    "DataProblemError",
    "DataAccessRevokedError",
    "EncodingError",
    "MissingFileError",
    "InvalidCiphertextError",
    "InvalidKeyError",
    "InvalidParameterError",
    "JobFailedError",
    "KeyMismatchError",
    "MessageTimeoutError",
    "NotFoundError",
    "PermissionDeniedError",
    "ServerStartError",
    "ProtocolError",
    "RateLimitedError",
    "ResourceLimitError",
    "RoundAbortedError",
    "RoundClosedError",
    "RunStoppedError",
    "TransportError",
    "TransportUnavailableError",
    "WireFormatError",
]


class ConfideError(Exception):
    """Root of every error raised by Confide."""


class CryptoError(ConfideError):
    """A cryptographic operation failed (for example the OS random generator)."""


class InvalidParameterError(ConfideError, ValueError):
    """A parameter is outside its allowed range; the message names it and the limit."""


class DataProblemError(InvalidParameterError):
    """A party's rows do not fit the job's FL_Data pipeline or model.

    Carries what a failure report may say across sites: the step, the columns and the next step
    to take (``hint``). The message names columns and counts, never a cell's value.
    """

    def __init__(self, message: str, *, step: str | None = None, columns=(), hint: str | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.columns = list(columns)
        self.hint = hint


class MissingFileError(ConfideError, FileNotFoundError):
    """A file Confide needs (a certificate, a key, a catalog) is not there; the message names it."""


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


class CertificateError(ConfideError, ValueError):
    """A certificate is invalid or untrusted, or an identity does not match what was claimed."""


class ProtocolError(ConfideError, ValueError):
    """A message breaks the runtime protocol (wrong length, inconsistent header...); it names the field."""


class TransportError(ConfideError):
    """A call to another process failed."""


class TransportUnavailableError(TransportError):
    """The peer cannot be reached now (down, restarting, network); retrying may succeed."""


class ServerStartError(TransportError, OSError):
    """A server could not start (its address is taken, TLS setup failed, its process exited first); an OSError too."""


class PermissionDeniedError(TransportError):
    """The peer refused the caller's identity (certificate missing, untrusted or naming someone else)."""


class CertificateRevokedError(PermissionDeniedError):
    """The caller's certificate is on the federation's revocation list; retrying cannot succeed.

    ``name`` and ``serial`` (hex) say which identity and which certificate, where known (a
    client learns them only from the message).
    """

    def __init__(self, message: str, *, name: str | None = None, serial: str | None = None) -> None:
        super().__init__(message)
        self.name = name
        self.serial = serial

    def __reduce__(self):
        return _revoked_error, (str(self), self.name, self.serial)


def _revoked_error(message: str, name: str | None, serial: str | None) -> CertificateRevokedError:
    return CertificateRevokedError(message, name=name, serial=serial)


class ResourceLimitError(ConfideError):
    """A bounded resource (mailbox bytes, message size...) would pass its limit; the message names it."""


class RateLimitedError(ConfideError):
    """Too many attempts (sign-ins) in a window; the message says the limit. HTTP 429."""


class RoundClosedError(ConfideError):
    """A message arrived for a round attempt that is no longer open (late, aborted or superseded)."""


class RoundAbortedError(ConfideError):
    """The aggregator aborted a round attempt because participants dropped out."""

    def __init__(self, message: str, dropped: list[str], survivors: list[str]) -> None:
        super().__init__(message)
        self.dropped = list(dropped)
        self.survivors = list(survivors)


class JobFailedError(ConfideError):
    """A job cannot go on (dropout with on_dropout=fail, too few parties left, setup failure...)."""


class MessageTimeoutError(ConfideError, TimeoutError):
    """An expected message did not arrive in time; the message names it and the timeout."""


class NotFoundError(ConfideError, LookupError):
    """A named thing (party, dataset, session, grant) does not exist; the message names it."""


class ConflictError(ConfideError):
    """A change lost a race with another one (e.g. two tunings of one session); nothing was stored."""


class DataAccessDeniedError(PermissionDeniedError):
    """A job uses a dataset that its developer has no grant for; the message names both."""


class DataAccessRevokedError(DataAccessDeniedError):
    """The data owner revoked (or let expire) the grant a running session used; the party stopped."""


class RunStoppedError(ConfideError):
    """A party's run was ended from outside (its agent, on the controller's word) before it finished."""
