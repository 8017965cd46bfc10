"""Mutual-TLS channels and servers, and who is calling.

Every connection is mutual TLS against the federation CA (``confide certs init``): a peer
without a certificate from that CA fails the handshake; a peer with one is known by its
certificate's common name, and services compare that name with every identity a message
claims (:func:`require_caller`). A certificate on the federation's revocation list is refused
before any handler runs (:mod:`confide.transport.revocation`).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent import futures

import grpc

from confide.crypto.identity import Identity, name_from_auth_context
from confide.errors import PermissionDeniedError

__all__ = ["MAX_MESSAGE_BYTES", "caller_name", "channel", "require_caller", "server"]

MAX_MESSAGE_BYTES = 64 * 1024 * 1024

_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Receive window per stream: the 64 KiB default makes every new stream of a round crawl
    # through flow-control round trips (and a party on another continent waits one RTT each).
    ("grpc.http2.lookahead_bytes", 8 * 1024 * 1024),
]

#: What a server accepts of its clients' keepalive pings. Without it gRPC's server default (one
#: ping per 5 minutes while no call carries data) answers our 10 s pings with GOAWAY
#: ``too_many_pings`` after two strikes, and every stream idle for half a minute (a party waiting
#: for a slow peer, for admission back into its job) broke and reconnected.
_SERVER_OPTIONS = [
    *_OPTIONS,
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]


def channel(target: str, identity: Identity, options: Sequence[tuple[str, int]] = ()) -> grpc.Channel:
    """A channel to ``target`` ("host:port") that presents ``identity`` and trusts only its CA.

    ``options`` add to or replace the default channel arguments.
    """
    credentials = grpc.ssl_channel_credentials(
        root_certificates=identity.ca_pem, private_key=identity.key_pem, certificate_chain=identity.cert_pem
    )
    merged = dict(
        [*_OPTIONS, ("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 2_000), *options]
    )
    return grpc.secure_channel(target, credentials, options=list(merged.items()))


def server(
    identity: Identity, address: str, *, max_workers: int = 64, interceptors: Sequence[grpc.ServerInterceptor] = ()
) -> tuple[grpc.Server, int]:
    """A gRPC server requiring client certificates from the CA; returns it and the bound port.

    ``interceptors`` see every call first (the revocation check:
    :class:`confide.transport.revocation.RevocationGate`).
    """
    credentials = grpc.ssl_server_credentials(
        [(identity.key_pem, identity.cert_pem)], root_certificates=identity.ca_pem, require_client_auth=True
    )
    grpc_server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers), options=_SERVER_OPTIONS, interceptors=list(interceptors)
    )
    port = grpc_server.add_secure_port(address, credentials)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    return grpc_server, port


def caller_name(context: grpc.ServicerContext) -> str | None:
    """Common name of the caller's verified certificate (None without one)."""
    return name_from_auth_context(context.auth_context())


def require_caller(context: grpc.ServicerContext, claimed: str, field: str) -> str:
    """Raise :class:`PermissionDeniedError` unless the certificate names ``claimed``."""
    return check_caller(caller_name(context), claimed, field)


def check_caller(name: str | None, claimed: str, field: str) -> str:
    """Raise :class:`PermissionDeniedError` unless ``name`` (the certificate's) is ``claimed``."""
    if name is None:
        raise PermissionDeniedError("no client certificate")
    if name != claimed:
        raise PermissionDeniedError(f"{field} is {claimed!r} but the client certificate names {name!r}")
    return name
