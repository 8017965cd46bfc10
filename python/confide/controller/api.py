"""The controller's REST API (FastAPI; OpenAPI at ``/openapi.json``, docs at ``/docs``).

Served over HTTPS with mutual TLS only (:mod:`confide.controller.server`): every request carries
the caller's certificate, issued by the federation CA, and the certificate's common name and
role are the caller's identity; no request body can claim another. One exception handler maps
the ``ConfideError`` family to HTTP statuses, with a JSON body ``{"error": kind, "detail":
message}``. A client certificate on the federation's revocation list is refused on every route
(403, ``CertificateRevokedError``) and the refusal audited (``certificate.refused``):

=========================  ======
InvalidParameterError      400
PermissionDeniedError      403 (DataAccessDeniedError and CertificateRevokedError included)
RateLimitedError           429
NotFoundError              404
ConflictError              409
request over the size cap  413
malformed body             422 (every bad field named)
=========================  ======
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from cryptography import x509
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from confide import metrics
from confide.controller.service import Caller, Controller, certificate_digest
from confide.crypto.identity import peer_identity
from confide.errors import (
    CertificateRevokedError,
    ConfideError,
    ConflictError,
    InvalidParameterError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitedError,
    ResourceLimitError,
)
from confide.reports import SessionStatus, SessionSummary
from confide.transport.revocation import RevocationList

__all__ = ["HTTP_STATUS", "MAX_REQUEST_BYTES", "BodyLimit", "certificate_caller", "create_app", "http_status"]

#: Requests larger than this are refused with 413 before their body is read.
MAX_REQUEST_BYTES = 4 * 1024 * 1024

HTTP_STATUS = [
    (RateLimitedError, 429),
    (PermissionDeniedError, 403),
    (NotFoundError, 404),
    (ConflictError, 409),
    (ResourceLimitError, 413),
    (InvalidParameterError, 400),
    (ValueError, 400),
]


def http_status(error: Exception) -> int:
    """The HTTP status of an error (the one translator of the ConfideError family to HTTP)."""
    for kind, status in HTTP_STATUS:
        if isinstance(error, kind):
            return status
    return 500


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RegisterRequest(_Body):
    """A party's (or aggregator's) registration: its address and its datasets' metadata."""

    address: str | None = Field(None, max_length=255)
    datasets: list[dict[str, Any]] = Field(default_factory=list, max_length=1000)
    version: str | None = Field(None, max_length=32)


class GrantRequest(_Body):
    """Grant ``developer`` the use of the caller's dataset ``dataset``, optionally scoped.

    ``expires_at``: ISO 8601 with a zone; ``job_id``: only this job; ``approval``: every session
    waits for the owner's approval.
    """

    dataset: str = Field(max_length=64)
    developer: str = Field(max_length=64)
    expires_at: str | None = Field(None, max_length=64)
    job_id: str | None = Field(None, max_length=128)
    approval: bool = False


class SubmitRequest(_Body):
    """A job specification (the YAML/JSON document, as a mapping)."""

    spec: dict[str, Any]


class TuneRequest(_Body):
    """A tuning: settings by dotted path, a new FL_Data, added parties; ``base_seq`` guards races."""

    settings: dict[str, Any] = Field(default_factory=dict)
    fl_data: dict[str, Any] | None = None
    add_parties: dict[str, dict[str, Any]] | None = None
    base_seq: int | None = Field(None, ge=0)


class _Record(BaseModel):
    # Response rows: a field the service adds without adding it here is a 500, not silent drift.
    model_config = ConfigDict(extra="forbid")


class PartyRecord(_Record):
    """``GET /v1/parties``: a registered identity and its liveness."""

    name: str
    role: str
    address: str | None = None
    last_seen_s: float
    online: bool
    cert_expires_at: str | None = None
    version: str | None = None


class DatasetRecord(_Record):
    """``GET /v1/datasets``: published metadata (never rows) and whether the caller may use it."""

    owner: str
    name: str
    schema_: list[dict[str, Any]] = Field(alias="schema", serialization_alias="schema")
    rows: int
    description: str
    source: str
    granted: bool

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class GrantRecord(_Record):
    """``GET /v1/grants``: who may use which dataset, and whether the grant is still active."""

    dataset: str
    developer: str
    granted_by: str
    granted_at: str
    active: bool
    expires_at: str | None = None
    job_id: str | None = None
    approval: bool = False


class UseRecord(_Record):
    """``GET /v1/uses``: one session's use of one dataset (what its owner sees)."""

    session: str
    job_id: str
    dataset: str
    developer: str
    since: str
    pipeline: list[dict[str, Any]]
    state: str
    run: int
    approval: str


class AuditRecord(_Record):
    """``GET /v1/audit``: one access decision or change."""

    id: int
    at: str
    actor: str
    action: str
    target: str
    decision: str
    detail: dict[str, Any] | None = None


class LogEntryRecord(_Record):
    """``GET /v1/sessions/{token}/log``: one committed entry of a session's log."""

    seq: int
    kind: str
    actor: str
    at: str
    note: str | None = None
    deltas: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None
    config_digests: dict[str, str]


class ParticipantMetrics(_Record):
    """One recipient's per-round metrics and the protection it reports running."""

    name: str
    role: str
    protection: dict[str, Any] | None = None
    log: list[str] = []
    metrics: list[dict[str, float | int]]


class MetricsReply(_Record):
    """``GET /v1/sessions/{token}/metrics``: per-round metrics of every recipient."""

    session: str
    mode_requested: str | None = None
    participants: list[ParticipantMetrics]


class HealthReply(_Record):
    """``GET /v1/health``: liveness and the store's dialect."""

    status: str
    store: str


class WhoamiReply(_Record):
    """``GET /v1/whoami``: the identity in the caller's certificate."""

    name: str
    role: str


class RegisterReply(_Record):
    """``POST /v1/register``: who registered and the datasets now published."""

    name: str
    role: str
    datasets: list[str]


class GrantReply(_Record):
    """``POST /v1/grants``: the grant as it now stands."""

    dataset: str
    developer: str
    active: bool
    expires_at: str | None
    job_id: str | None
    approval: bool


class RevokeReply(_Record):
    """``DELETE /v1/grants/{dataset}/{developer}``: the grant, inactive, and the sessions it stopped."""

    dataset: str
    developer: str
    active: bool
    stopped: list[str]


class ApproveReply(_Record):
    """``POST /v1/sessions/{token}/approve``: the session's state and the approvals still missing."""

    session: str
    state: str
    pending: list[str]


class SubmitReply(_Record):
    """``POST /v1/jobs``: the new session (its log starts at entry 1)."""

    session: str
    job_id: str
    seq: int
    state: str


class PreflightReply(_Record):
    """``POST /v1/jobs/check``: what a submission would meet (nothing stored, nothing audited)."""

    valid: bool
    job_id: str | None = None
    problems: list[str]
    datasets: list[dict[str, Any]]


class TuneReply(_Record):
    """``POST /v1/sessions/{token}/tune``: the tuning entry, its deltas, whether the run restarted."""

    session: str
    seq: int
    deltas: dict[str, Any]
    restarted: bool


class ResumeReply(_Record):
    """``POST /v1/sessions/{token}/resume``: the resume entry and the round the new run starts from."""

    session: str
    seq: int
    run: int
    resume_round: int | None = None
    state: str


class CancelReply(_Record):
    """``POST /v1/sessions/{token}/cancel``: the cancel entry."""

    session: str
    seq: int
    state: str


class EntryRecord(_Record):
    """``GET /v1/sessions/{token}/entries/{seq}``: one log entry in full."""

    seq: int
    kind: str
    spec: dict[str, Any] | None = None
    configs: dict[str, Any] | None = None
    deltas: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None


class SyncReply(_Record):
    """``POST /v1/agent/sync``: the deltas and commands for the calling agent."""

    instructions: list[dict[str, Any]]


class SyncRequest(_Body):
    """An agent's heartbeat with its per-session reports."""

    reports: list[dict[str, Any]] = Field(default_factory=list, max_length=1000)


class BodyLimit:
    """ASGI middleware: refuse bodies over ``limit`` bytes (declared or streamed) with 413."""

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        """Pass the request on with its body read, or answer 413."""
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await _too_large(send, self.limit, int(declared))
        # Read the whole body first (it is at most ``limit`` bytes), so a streamed body over the
        # limit is answered 413 before the application sees any of it.
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None  # the client went away
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.limit:
                return await _too_large(send, self.limit, seen)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


async def _too_large(send, limit: int, size: int) -> None:
    body = JSONResponse(
        {"error": "ResourceLimitError", "detail": f"request body of {size} bytes exceeds the limit of {limit} bytes"},
        status_code=413,
    ).body
    await send({"type": "http.response.start", "status": 413, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


async def _caller(request: Request) -> Caller:
    identify = request.app.state.identify
    if identify is certificate_caller:
        return certificate_caller(request)  # in memory once the certificate was checked: no thread hop
    return await run_in_threadpool(identify, request)  # the console's tokens: a store read


@dataclass(frozen=True)
class _Peer:
    """A client certificate checked against the CA: who it names, its digest, until when it holds."""

    name: str
    role: str
    cert_sha256: str
    pem: bytes
    valid_until: float  # the earlier of the certificate's and the CA's not-after (POSIX seconds)


#: Distinct client certificates whose check is remembered (a federation has far fewer).
MAX_PEERS = 100_000


def certificate_caller(request: Request) -> Caller:
    """The caller named by the request's verified TLS client certificate (the federation's identities).

    A certificate's check (CA signature, validity, subject) is remembered per application until
    the certificate or the CA expires, so an agent's heartbeat does not verify a signature every
    second; revocation is checked on every request regardless (``create_app``).
    """
    tls = (request.scope.get("extensions") or {}).get("tls") or {}
    chain = tls.get("client_cert_chain") or []
    if not chain:
        raise PermissionDeniedError("no client certificate: the controller accepts mutual TLS only")
    peers: dict[str, _Peer] | None = getattr(request.app.state, "peers", None)
    peer = peers.get(chain[0]) if peers is not None else None
    if peer is None or time.time() >= peer.valid_until:
        pem = chain[0].encode()
        ca_pem = request.app.state.ca_pem
        name, role = peer_identity(pem, ca_pem)
        valid_until = min(
            x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp(),
            x509.load_pem_x509_certificate(ca_pem).not_valid_after_utc.timestamp(),
        )
        peer = _Peer(name, role, certificate_digest(pem), pem, valid_until)
        if peers is not None:
            if len(peers) >= MAX_PEERS:
                peers.clear()
            peers[chain[0]] = peer
    request.state.cert_sha256 = peer.cert_sha256
    request.state.cert_pem = peer.pem
    return Caller(peer.name, peer.role)


#: The caller's verified identity, as a FastAPI dependency.
Who = Annotated[Caller, Depends(_caller)]


def create_app(
    controller: Controller,
    *,
    ca_pem: bytes | None = None,
    max_request_bytes: int = MAX_REQUEST_BYTES,
    identify: Callable[[Request], Caller] | None = None,
    agent_routes: bool = True,
    revocations: RevocationList | None = None,
) -> FastAPI:
    """The ASGI application for ``controller``.

    Callers are identified by their TLS client certificate (checked against ``ca_pem``), or by
    ``identify`` (the console's API tokens: :mod:`confide.web`). ``agent_routes``: serve
    ``/v1/register`` and ``/v1/agent/sync``, which only agents with certificates may call.
    ``revocations``: the federation's CRL; a revoked client certificate is refused on every route.
    """
    pages = {} if identify is None else {"docs_url": None, "redoc_url": None, "openapi_url": None}

    async def admitted(request: Request) -> None:
        # Every route, /v1/health included: a revoked certificate opens no call here.
        chain = ((request.scope.get("extensions") or {}).get("tls") or {}).get("client_cert_chain") or []
        if revocations is None or not chain:
            return
        certificate = chain[0].encode()
        try:
            revocations.check(certificate)
        except CertificateRevokedError as error:
            peer = revocations.peer(certificate, pem=True)
            await run_in_threadpool(
                controller.certificate_refused, Caller(peer.name, peer.role), peer.serial, request.url.path
            )
            raise error from None

    app = FastAPI(
        title="Confide controller",
        version="1",
        description="Parties, dataset metadata, data-access grants, jobs as stateful sessions, checkpoints.",
        dependencies=[Depends(admitted)],
        **pages,
    )

    app.state.ca_pem = ca_pem
    app.state.identify = identify or certificate_caller
    app.state.peers = {}

    @app.exception_handler(ConfideError)
    async def _confide_error(_request: Request, error: ConfideError) -> JSONResponse:
        return JSONResponse({"error": type(error).__name__, "detail": str(error)}, status_code=http_status(error))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
        problems = []
        for item in error.errors():
            where = ".".join(str(part) for part in item["loc"] if part != "body") or "body"
            problems.append(f"{where}: {item['msg']}")
        return JSONResponse({"error": "InvalidParameterError", "detail": "; ".join(problems)}, status_code=422)

    async def call(function, *args, **kwargs):
        # The store is synchronous (SQLAlchemy); keep the event loop free.
        return await run_in_threadpool(function, *args, **kwargs)

    @app.get("/v1/health", tags=["meta"], response_model=HealthReply)
    async def health() -> dict:
        """Liveness and the store's dialect."""
        return {"status": "ok", "store": controller.store.dialect}

    @app.get("/v1/whoami", tags=["meta"], response_model=WhoamiReply)
    async def whoami(who: Who) -> dict:
        """The identity the controller sees in the caller's certificate."""
        return {"name": who.name, "role": who.role}

    if agent_routes:

        @app.post("/v1/register", tags=["parties"], response_model=RegisterReply)
        async def register(body: RegisterRequest, request: Request, who: Who) -> dict:
            """Register the caller; a party publishes its datasets' metadata (never rows)."""
            return await call(
                controller.register,
                who,
                address=body.address,
                datasets=body.datasets,
                cert_sha256=request.state.cert_sha256,
                cert_expires_at=x509.load_pem_x509_certificate(request.state.cert_pem).not_valid_after_utc,
                version=body.version,
            )

        @app.post("/v1/agent/sync", tags=["agents"], response_model=SyncReply)
        async def sync(body: SyncRequest, who: Who) -> dict:
            """An agent's heartbeat and reports; returns deltas and commands for it."""
            metrics.HEARTBEATS.labels("controller", "received").inc()
            # A heartbeat that writes nothing is one short read: on the event loop, no thread hop.
            answer = controller.sync_read_only(who, body.reports)
            return answer if answer is not None else await call(controller.sync, who, body.reports)

    @app.get("/v1/parties", tags=["parties"], response_model=list[PartyRecord], response_model_by_alias=True)
    async def parties(who: Who) -> list[dict]:
        """Registered parties, aggregators and developers, with liveness."""
        return await call(controller.parties, who)

    @app.get("/v1/datasets", tags=["data"], response_model=list[DatasetRecord], response_model_by_alias=True)
    async def datasets(who: Who) -> list[dict]:
        """Published dataset metadata and whether the caller may use each."""
        return await call(controller.datasets, who)

    @app.post("/v1/grants", tags=["data"], response_model=GrantReply)
    async def grant(body: GrantRequest, who: Who) -> dict:
        """The owner grants a developer the use of one of its datasets (optionally scoped, expiring)."""
        return await call(
            controller.grant,
            who,
            dataset=body.dataset,
            developer=body.developer,
            expires_at=body.expires_at,
            job_id=body.job_id,
            approval=body.approval,
        )

    @app.delete("/v1/grants/{dataset}/{developer}", tags=["data"], response_model=RevokeReply)
    async def revoke(dataset: str, developer: str, who: Who) -> dict:
        """The owner revokes a grant; sessions using it stop at the next round boundary."""
        return await call(controller.revoke, who, dataset=dataset, developer=developer)

    @app.get("/v1/uses", tags=["data"], response_model=list[UseRecord])
    async def uses(who: Who) -> list[dict]:
        """Sessions using the caller's datasets (party), the caller's own (developer), or all (admin)."""
        return await call(controller.uses, who)

    @app.post("/v1/sessions/{token}/approve", tags=["data"], response_model=ApproveReply)
    async def approve(token: str, who: Who) -> dict:
        """The owner approves a session's use of its datasets (grants given with approval)."""
        return await call(controller.approve, who, token)

    @app.get("/v1/grants", tags=["data"], response_model=list[GrantRecord])
    async def grants(who: Who) -> list[dict]:
        """Grants given (party), received (developer) or all (admin)."""
        return await call(controller.grants, who)

    @app.get("/v1/audit", tags=["data"], response_model=list[AuditRecord])
    async def audit(
        who: Who,
        after: int = 0,
        limit: int = 200,
        action: str | None = None,
        decision: str | None = None,
        actor: str | None = None,
        target: str | None = None,
    ) -> list[dict]:
        """Access decisions and changes, oldest first (``action``: a prefix; ``target``: a substring)."""
        return await call(
            controller.audit,
            who,
            after=after,
            limit=limit,
            action=action,
            decision=decision,
            actor=actor,
            target=target,
        )

    @app.post("/v1/jobs/check", tags=["sessions"], response_model=PreflightReply)
    async def check(body: SubmitRequest, who: Who) -> dict:
        """Validate a job and show each dataset's access decision without submitting it."""
        return await call(controller.preflight, who, body.spec)

    @app.post("/v1/jobs", tags=["sessions"], response_model=SubmitReply)
    async def submit(body: SubmitRequest, who: Who) -> dict:
        """Validate a job, check its data access, start it as a session."""
        return await call(controller.submit, who, body.spec)

    @app.get("/v1/sessions", tags=["sessions"], response_model=list[SessionSummary])
    async def sessions(who: Who) -> list[dict]:
        """The caller's sessions."""
        return await call(controller.sessions, who)

    @app.get("/v1/sessions/{token}", tags=["sessions"], response_model=SessionStatus)
    async def status(token: str, who: Who) -> dict:
        """A session's state, run, progress and last checkpoint."""
        return await call(controller.status, who, token)

    @app.get("/v1/sessions/{token}/log", tags=["sessions"], response_model=list[LogEntryRecord])
    async def session_log(token: str, who: Who) -> list[dict]:
        """The committed log with deltas and checkpoint roots."""
        return await call(controller.log, who, token)

    @app.get("/v1/sessions/{token}/metrics", tags=["sessions"], response_model=MetricsReply)
    async def session_metrics(token: str, who: Who, after: int = -1) -> dict:
        """Per-round metrics (loss, AUC/accuracy, seconds, crypto time, bytes) after round ``after``."""
        return await call(controller.metrics, who, token, after=after)

    @app.get("/v1/sessions/{token}/entries/{seq}", tags=["sessions"], response_model=EntryRecord)
    async def session_entry(token: str, seq: int, who: Who) -> dict:
        """One log entry in full."""
        return await call(controller.entry, who, token, seq)

    @app.post("/v1/sessions/{token}/tune", tags=["sessions"], response_model=TuneReply)
    async def tune(token: str, body: TuneRequest, who: Who) -> dict:
        """Append a tuning entry; the deltas go to the recipients whose configuration changed."""
        return await call(
            controller.tune,
            who,
            token,
            settings=body.settings,
            fl_data=body.fl_data,
            add_parties=body.add_parties,
            base_seq=body.base_seq,
        )

    @app.post("/v1/sessions/{token}/resume", tags=["sessions"], response_model=ResumeReply)
    async def resume(token: str, who: Who) -> dict:
        """Continue from the last checkpoint once every file matches its recorded Merkle root."""
        return await call(controller.resume, who, token)

    @app.post("/v1/sessions/{token}/cancel", tags=["sessions"], response_model=CancelReply)
    async def cancel(token: str, who: Who) -> dict:
        """Stop the session's processes (resumable)."""
        return await call(controller.cancel, who, token)

    app.add_middleware(BodyLimit, limit=max_request_bytes)
    return app
