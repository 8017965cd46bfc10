"""Serving the controller: uvicorn over HTTPS with mutual TLS against the federation CA.

Uvicorn does not pass the peer certificate to the application, so the HTTP protocol class
below does: per connection it reads the verified client certificate from the TLS object and
adds it to every request's scope as the ASGI TLS extension (``scope["extensions"]["tls"]
["client_cert_chain"]``). The handshake itself rejects clients without a certificate from the CA.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
from pathlib import Path

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from confide.controller.api import create_app
from confide.controller.service import Controller
from confide.controller.store import open_store
from confide.transport.certs import CA_CERT_FILE, Identity

__all__ = ["ControllerServer", "serve"]

log = logging.getLogger("confide.controller")


class _PeerCertificateProtocol(H11Protocol):
    """h11 protocol that exposes the TLS client certificate to the app (ASGI TLS extension)."""

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        chain = [ssl.DER_cert_to_PEM_cert(der)] if der else []
        inner = self.app

        async def with_tls(scope, receive, send):
            scope["extensions"] = {**(scope.get("extensions") or {}), "tls": {"client_cert_chain": chain}}
            await inner(scope, receive, send)

        self.app = with_tls


class ControllerServer:
    """A controller bound to a socket; ``run()`` serves until ``stop()``."""

    def __init__(
        self,
        *,
        certs_dir: str | os.PathLike,
        name: str,
        database: str,
        address: str = "127.0.0.1:0",
        alive_s: float = 30.0,
    ) -> None:
        identity = Identity.load(certs_dir, name)
        self.store = open_store(database)
        self.controller = Controller(self.store, alive_s=alive_s)
        app = create_app(self.controller, ca_pem=identity.ca_pem)
        host, _, port = address.rpartition(":")
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets created with it, and
        # without it every response (head and body go as two TLS records) waits ~40 ms for the
        # client's delayed ACK (Nagle). Measured by benchmarks/controller_bench.py.
        self.socket = socket.socket(
            socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
        )
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host.strip("[]") or "127.0.0.1", int(port)))
        self.port = self.socket.getsockname()[1]
        root = Path(certs_dir)
        config = uvicorn.Config(
            app,
            http=_PeerCertificateProtocol,
            ssl_certfile=str(root / f"{name}.crt"),
            ssl_keyfile=str(root / f"{name}.key"),
            ssl_ca_certs=str(root / CA_CERT_FILE),
            ssl_cert_reqs=ssl.CERT_REQUIRED,
            log_level="warning",
            access_log=False,
            timeout_keep_alive=30,
            backlog=2048,
            limit_concurrency=4096,
        )
        self.server = uvicorn.Server(config)

    def run(self) -> None:
        """Serve (blocking) until stopped."""
        try:
            self.server.run(sockets=[self.socket])
        finally:
            self.store.close()

    def stop(self) -> None:
        """Ask the server to finish (from another thread or a signal handler)."""
        self.server.should_exit = True


def serve(*, certs_dir, name: str, database: str, address: str, port_file: str | None = None) -> None:
    """Run a controller until interrupted (``confide controller``)."""
    server = ControllerServer(certs_dir=certs_dir, name=name, database=database, address=address)
    if port_file:
        temporary = Path(f"{port_file}.tmp")
        temporary.write_text(str(server.port))
        os.replace(temporary, port_file)
    log.info("controller listening on port %d, store %s", server.port, server.store.url)
    server.run()
