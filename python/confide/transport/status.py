"""The one translation between ``ConfideError`` and gRPC status codes, both ways.

UNAUTHENTICATED is kept for one meaning: the caller's certificate is revoked
(:class:`CertificateRevokedError`), so a client stops at once instead of retrying; every other
refusal of an identity is PERMISSION_DENIED.
"""

from __future__ import annotations

import functools
from typing import NoReturn

import grpc

from confide.errors import (
    CertificateRevokedError,
    ConfideError,
    PermissionDeniedError,
    ProtocolError,
    ResourceLimitError,
    RoundClosedError,
    TransportError,
    TransportUnavailableError,
)

__all__ = ["abort", "code_of", "from_rpc_error", "guarded"]

_TO_CODE: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (CertificateRevokedError, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (RoundClosedError, grpc.StatusCode.FAILED_PRECONDITION),
    (ResourceLimitError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),
]

_FROM_CODE: dict[grpc.StatusCode, type[ConfideError]] = {
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: CertificateRevokedError,
    grpc.StatusCode.FAILED_PRECONDITION: RoundClosedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceLimitError,
    grpc.StatusCode.INVALID_ARGUMENT: ProtocolError,
    grpc.StatusCode.UNAVAILABLE: TransportUnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: TransportUnavailableError,
    grpc.StatusCode.CANCELLED: TransportUnavailableError,
}


def code_of(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status and message that ``error`` ends a call with (INTERNAL for anything unexpected)."""
    for kind, code in _TO_CODE:
        if isinstance(error, kind):
            return code, str(error)
    return grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}"


def abort(context: grpc.ServicerContext, error: BaseException) -> NoReturn:
    """End the call with the status that matches ``error``."""
    context.abort(*code_of(error))


def guarded(method):
    """Decorate a unary servicer method: a raised error becomes its gRPC status."""

    @functools.wraps(method)
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except ConfideError as error:
            abort(context, error)
        except ValueError as error:
            abort(context, error)

    return wrapper


def from_rpc_error(error: grpc.RpcError, action: str) -> ConfideError:
    """The ``ConfideError`` for a failed call; the message says what was being done."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    kind = _FROM_CODE.get(code, TransportError)
    name = code.name if code is not None else "UNKNOWN"
    return kind(f"{action}: {name}: {details}")
