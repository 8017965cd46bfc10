"""Serving the controller: uvicorn over HTTPS with mutual TLS against the federation CA.

The web console (:mod:`confide.web`) is served by the same process, on a second HTTPS port
without client certificates (people sign in with accounts), over the same store and the same
:class:`Controller`: it cannot be up while the controller is down, or the other way round.

HTTP/1.1 is parsed by httptools and the event loop is uvloop (uvicorn's choice when they are
installed, as they are with Confide): with the stock h11 parser and asyncio loop a request cost
the controller about 0.15 ms more CPU (benchmarks/controller_bench.py --capacity). With
``console_address`` both servers share one asyncio loop.

Uvicorn does not pass the peer certificate to the application, so the HTTP protocol class
below does: per connection it reads the verified client certificate from the TLS object and
adds it to every request's scope as the ASGI TLS extension (``scope["extensions"]["tls"]
["client_cert_chain"]``). The handshake itself rejects clients without a certificate from the CA;
the API refuses a certificate on the federation's CRL (``revoked.crl.pem`` in the certificate
directory, or ``crl``), re-read within half a second of a change.

Several workers (``serve(workers=N)``, ``confide controller --workers N``): N processes each
listen on the same port (``SO_REUSEPORT``: the kernel spreads connections over them), each with
its own TLS context, event loop and connection pool, over one PostgreSQL store. The parent
process upgrades the schema once, holds the port, starts the workers, writes the port files once
every worker listens, and stops them all on SIGTERM/SIGINT or when any one of them exits. What
lives in a worker's memory is either a cache of rows that never change (configuration digests,
checked client certificates), a per-process rate limit (at most N refusal audits a minute per
revoked certificate, N last-seen writes per agent per interval), or a file it re-reads (the CRL);
the web console runs in worker 0 only. SQLite admits one writer at a time, so it refuses N > 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import ssl
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    # httptools (a C parser) costs a fraction of h11's pure-Python parsing: about 0.1 ms less
    # controller CPU per request (benchmarks/controller_bench.py --capacity, health 0.54 -> 0.45).
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _HttpProtocol
except ImportError:  # a base dependency; an installation without it still serves, on h11
    _HttpProtocol = H11Protocol

from confide import metrics
from confide.controller.api import create_app
from confide.controller.service import Controller
from confide.controller.store import database_url, open_store
from confide.crypto.identity import CA_CERT_FILE, Identity
from confide.errors import CertificateError, InvalidParameterError
from confide.transport.revocation import RevocationList, crl_path_for

__all__ = ["MAX_WORKERS", "ControllerServer", "check_workers", "serve"]

#: Worker processes one controller may run.
MAX_WORKERS = 64

log = logging.getLogger("confide.controller")


class _PeerCertificateProtocol(_HttpProtocol):
    """HTTP/1.1 protocol (httptools, else h11) that exposes the TLS client certificate to the app (ASGI TLS)."""

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


class _ConsoleServer(uvicorn.Server):
    """The console's server: the controller's server owns the process's signals and stops it."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


class _MainServer(uvicorn.Server):
    """The controller's server: a signal that stops it stops the console with it."""

    companion: uvicorn.Server | None = None

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        if self.companion is not None:
            self.companion.should_exit = True


def _bound_socket(address: str, *, reuse_port: bool = False) -> socket.socket:
    host, _, port = address.rpartition(":")
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets created with it, and
    # without it every response (head and body go as two TLS records) waits ~40 ms for the
    # client's delayed ACK (Nagle). Measured by benchmarks/controller_bench.py.
    bound = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        # Workers of one controller each bind the port; only sockets that listen get connections.
        bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    bound.bind((host.strip("[]") or "127.0.0.1", int(port)))
    return bound


def check_workers(database: str, workers: int) -> None:
    """Refuse a worker count the store cannot serve (InvalidParameterError naming ``--workers``)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise InvalidParameterError(f"--workers must be an integer in [1, {MAX_WORKERS}], got {workers!r}")
    if workers > 1 and not database_url(str(database)).startswith("postgresql"):
        raise InvalidParameterError(
            f"--workers {workers} needs a store that takes concurrent writers (PostgreSQL: --db postgresql://...); "
            "SQLite admits one writer at a time, so a controller on SQLite runs with --workers 1"
        )


class ControllerServer:
    """A controller bound to a socket (and the console to another); ``run()`` serves until ``stop()``.

    ``console_address``: serve the web console there (HTTPS with ``console_cert``/``console_key``,
    by default the controller's own certificate, which browsers trust once the federation CA is
    imported); None: no console. ``console_app`` builds the console's ASGI app from the
    controller (``confide.web.create_console_app``): the caller composes the console, so the
    controller never imports the web layer above it.
    """

    def __init__(
        self,
        *,
        certs_dir: str | os.PathLike,
        name: str,
        database: str,
        address: str = "127.0.0.1:0",
        alive_s: float = 30.0,
        console_address: str | None = None,
        console_app: Callable[[Controller], Any] | None = None,
        console_cert: str | None = None,
        console_key: str | None = None,
        crl: str | os.PathLike | None = None,
        reuse_port: bool = False,
        migrate: bool = True,
    ) -> None:
        identity = Identity.load(certs_dir, name)
        # A CRL that is there but not signed by the federation CA stops the start-up (CertificateError).
        self.revocations = RevocationList(crl_path_for(certs_dir, crl), identity.ca_pem)
        self.store = open_store(database, migrate=migrate)
        self.controller = Controller(self.store, alive_s=alive_s, tracking_dir=tracking_dir_for(database))
        metrics.watch(
            self.controller.queue_depths,
            metrics.CONTROLLER_QUEUE,
            "What waits at the controller: active sessions by state, configurations not yet applied by their recipient",
        )
        app = create_app(self.controller, ca_pem=identity.ca_pem, revocations=self.revocations)
        self.socket = _bound_socket(address, reuse_port=reuse_port)
        if reuse_port:
            self.socket.listen(2048)  # a worker takes its share of connections from now on
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
        self.server = _MainServer(config)
        self.console = None
        self.console_port = None
        if console_address is not None:
            if console_app is None:
                raise InvalidParameterError(
                    "console_address needs console_app, the console's app factory (confide.web.create_console_app)"
                )
            self.console_socket = _bound_socket(console_address)
            self.console_port = self.console_socket.getsockname()[1]
            console_config = uvicorn.Config(
                console_app(self.controller),
                ssl_certfile=console_cert or str(root / f"{name}.crt"),
                ssl_keyfile=console_key or str(root / f"{name}.key"),
                log_level="warning",
                access_log=False,
                timeout_keep_alive=30,
                # Live pages hold event streams open: shutting down waits this long for them.
                timeout_graceful_shutdown=2,
                proxy_headers=False,
            )
            try:
                console_config.load()  # a bad certificate or key fails here, before anything serves
            except (OSError, ssl.SSLError) as error:
                self.store.close()
                self.socket.close()
                self.console_socket.close()
                raise CertificateError(f"the console's TLS certificate or key cannot be used: {error}") from None
            self.console = _ConsoleServer(console_config)
            self.server.companion = self.console

    def run(self) -> None:
        """Serve (blocking) until stopped."""
        try:
            if self.console is None:
                self.server.run(sockets=[self.socket])
            else:
                asyncio.run(self._serve_both())
        finally:
            self.store.close()

    async def _serve_both(self) -> None:
        console = asyncio.create_task(self.console.serve(sockets=[self.console_socket]))
        controller = asyncio.create_task(self.server.serve(sockets=[self.socket]))
        # Either ending (the console failing to bind, say) ends both: neither serves alone.
        await asyncio.wait([console, controller], return_when=asyncio.FIRST_COMPLETED)
        self.stop()
        await asyncio.gather(console, controller)

    def stop(self) -> None:
        """Ask the server to finish (from another thread or a signal handler)."""
        self.server.should_exit = True
        if self.console is not None:
            self.console.should_exit = True


def _write_port(path: str, port: int) -> None:
    temporary = Path(f"{path}.tmp")
    temporary.write_text(str(port))
    os.replace(temporary, path)


def tracking_dir_for(database: str) -> Path:
    """Where MLflow records of completed sessions wait for a server that was not reached.

    ``tracking-pending`` beside a SQLite store's file; in the working directory for PostgreSQL.
    """
    if "://" not in database or database.startswith("sqlite:///"):
        return Path(database.removeprefix("sqlite:///")).resolve().parent / "tracking-pending"
    return Path.cwd() / "tracking-pending"


def serve(
    *,
    certs_dir,
    name: str,
    database: str,
    address: str,
    port_file: str | None = None,
    alive_s: float = 30.0,
    console_address: str | None = None,
    console_app: Callable[[Controller], Any] | None = None,
    console_port_file: str | None = None,
    console_cert: str | None = None,
    console_key: str | None = None,
    crl: str | None = None,
    workers: int = 1,
) -> None:
    """Run a controller (and its web console) until interrupted (``confide controller``).

    ``workers`` > 1: that many processes share the port (PostgreSQL only; see the module doc).
    """
    check_workers(database, workers)
    if workers > 1:
        _serve_workers(
            workers,
            port_file=port_file,
            console_port_file=console_port_file,
            options={
                "certs_dir": str(certs_dir),
                "name": name,
                "database": database,
                "address": address,
                "alive_s": alive_s,
                "console_address": console_address,
                "console_app": console_app,
                "console_cert": console_cert,
                "console_key": console_key,
                "crl": crl,
            },
        )
        return
    server = ControllerServer(
        crl=crl,
        certs_dir=certs_dir,
        name=name,
        database=database,
        address=address,
        alive_s=alive_s,
        console_address=console_address,
        console_app=console_app,
        console_cert=console_cert,
        console_key=console_key,
    )
    if console_port_file and server.console_port is not None:
        _write_port(console_port_file, server.console_port)
    if port_file:
        _write_port(port_file, server.port)
    log.info("controller listening on port %d, store %s", server.port, server.store.url)
    if server.console_port is not None:
        log.info("console at https://%s:%d/", console_address.rpartition(":")[0] or "127.0.0.1", server.console_port)
    server.run()


def _die_with_parent() -> None:
    """SIGTERM this worker when the parent dies (even by SIGKILL): no orphan keeps serving the port.

    Linux only (``prctl(PR_SET_PDEATHSIG)``); elsewhere the parent's own stop is all there is.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent died before the call: go now
        os.kill(os.getpid(), signal.SIGTERM)


def _worker(options: dict, index: int, ready) -> None:
    """One worker process: serve on the shared port until SIGTERM (worker 0 also serves the console)."""
    logging.basicConfig(level=options.pop("log_level"), format=f"%(asctime)s worker {index} %(name)s %(message)s")
    _die_with_parent()
    if index != 0:
        options["console_address"] = None
    try:
        server = ControllerServer(**options, reuse_port=True, migrate=False)
    except BaseException as error:
        ready.send((index, None, f"{type(error).__name__}: {error}"))
        raise
    ready.send((index, server.console_port, None))
    ready.close()
    server.run()


def _serve_workers(workers: int, *, port_file: str | None, console_port_file: str | None, options: dict) -> None:
    """Start ``workers`` processes on one port, write the port files, supervise; stop all on a signal."""
    store = open_store(options["database"])  # the schema is upgraded once, here, before any worker opens it
    url = store.url
    store.close()
    # Held (bound, never listening) for the workers' lifetime: port 0 becomes one port they all share.
    reserved = _bound_socket(options["address"], reuse_port=True)
    port = reserved.getsockname()[1]
    host = options["address"].rpartition(":")[0]
    context = multiprocessing.get_context("spawn")  # fresh interpreters: no engine, thread or loop inherited
    receive, send = context.Pipe(duplex=False)
    shared = {**options, "address": f"{host}:{port}", "log_level": logging.getLogger().level or logging.WARNING}
    processes = []
    stopping = False

    def stop(*_args) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for index in range(workers):
            process = context.Process(target=_worker, args=(dict(shared), index, send), name=f"controller-{index}")
            process.start()
            processes.append(process)
        console_port = None
        for _ in range(workers):
            while not receive.poll(0.2):
                if stopping or any(p.exitcode is not None for p in processes):
                    raise InvalidParameterError("a controller worker exited while starting; its log says why")
            index, console, problem = receive.recv()
            if problem is not None:
                raise InvalidParameterError(f"controller worker {index} did not start: {problem}")
            console_port = console if index == 0 else console_port
        if console_port_file and console_port is not None:
            _write_port(console_port_file, console_port)
        if port_file:
            _write_port(port_file, port)
        log.info("controller listening on port %d with %d workers, store %s", port, workers, url)
        while not stopping:
            ended = wait([p.sentinel for p in processes], timeout=0.5)
            if ended and not stopping:
                died = [p for p in processes if p.exitcode is not None]
                log.error(
                    "controller worker %s exited (code %s): stopping the others",
                    ", ".join(p.name for p in died),
                    ", ".join(str(p.exitcode) for p in died),
                )
                raise SystemExit(1)
    finally:
        for process in processes:
            if process.exitcode is None:
                process.terminate()  # SIGTERM: uvicorn finishes the requests in flight
        deadline = time.monotonic() + 15
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                process.kill()
                process.join()
        reserved.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
