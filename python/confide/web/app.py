"""The web console: pages over the controller's own operations, served by the controller process.

Every page and action calls the same :class:`~confide.controller.service.Controller` method as
the REST API, as the controller identity the signed-in account acts as
(:class:`~confide.web.accounts.SignedIn`), so a developer sees only its jobs and an owner only
its datasets and the uses of them, exactly as over mTLS. The REST API itself is served here too
(``/v1/...``, ``/docs``) for scripts holding an API token (``Authorization: Bearer``), without
the agents' routes.

Browser security:

* session cookie ``__Host-confide_session``: HttpOnly, Secure, SameSite=Strict, path ``/``;
* every POST carries the session's CSRF token (form field ``csrf`` or header ``X-CSRF-Token``),
  compared in constant time; the sign-in form uses a double-submit cookie; a forged post is
  refused (403) and audited;
* a Content-Security-Policy of ``'self'`` only (no inline script, nothing from a CDN: the
  front-end libraries are vendored at build time, ``scripts/build-console.sh``), frames denied;
* Jinja2 autoescaping everywhere: a job name with ``<script>`` is shown as text.

Live pages use server-sent events (``/jobs/{token}/events``): the server reads the session's
status and new per-round metrics once a second and sends what changed.
"""

from __future__ import annotations

import asyncio
import csv
import functools
import io
import json
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import yaml
from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markupsafe import escape

from confide.controller.api import MAX_REQUEST_BYTES, BodyLimit, http_status
from confide.controller.api import create_app as create_rest_app
from confide.controller.service import Controller
from confide.errors import ConfideError, InvalidParameterError, PermissionDeniedError, RateLimitedError
from confide.spec import JobSpec
from confide.web.accounts import Accounts, SignedIn

__all__ = ["COOKIE", "create_console_app"]

HERE = Path(__file__).parent
COOKIE = "__Host-confide_session"
PRE_COOKIE = "__Host-confide_signin"
FINAL_STATES = ("completed", "failed", "cancelled", "refused", "revoked")
#: Seconds between two reads of a live session's status for its event stream.
EVENT_INTERVAL_S = 1.0
MAX_SPEC_CHARS = 1_000_000
#: Threads the console's requests use at most (the mTLS API keeps its own).
CONSOLE_THREADS = 8
#: Seconds between two checks, during a live event stream, that its session is still valid.
STREAM_RECHECK_S = 30
#: Audit events shown on the audit page (newest first); the CSV export has every match.
AUDIT_PAGE_ROWS = 500
_SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "strict-transport-security": "max-age=31536000",
    "cache-control": "no-store",
}


class _SignInRequired(Exception):
    """No valid session: pages redirect to the sign-in form."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def create_console_app(controller: Controller, accounts: Accounts | None = None) -> FastAPI:
    """The console's ASGI application over ``controller`` (and its store's accounts)."""
    accounts = accounts or Accounts(controller.store)
    accounts.prepare_sign_in()
    app = FastAPI(title="Confide console", docs_url=None, redoc_url=None, openapi_url=None)
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["tojson_compact"] = lambda value: json.dumps(value, sort_keys=True, separators=(",", ":"))
    templates.env.globals["vendor_ready"] = (HERE / "static" / "vendor" / "uPlot.iife.min.js").exists()
    app.state.accounts = accounts

    # The console's own worker threads: a flood of page views or sign-ins waits here, and the
    # agents' heartbeats on the mTLS port keep the process's shared pool.
    limiter = anyio.CapacityLimiter(CONSOLE_THREADS)

    async def call(function, *args, **kwargs):
        return await anyio.to_thread.run_sync(functools.partial(function, *args, **kwargs), limiter=limiter)

    async def who(request: Request) -> SignedIn:
        cookie = request.cookies.get(COOKIE)
        if not cookie:
            raise _SignInRequired("")
        try:
            return await call(accounts.session, cookie)
        except PermissionDeniedError as error:
            raise _SignInRequired(str(error)) from None

    async def checked(request: Request) -> tuple[SignedIn, dict]:
        """The signed-in account of a POST whose CSRF token matches, and the form."""
        signed = await who(request)
        form = dict(await request.form())
        given = form.get("csrf") or request.headers.get("x-csrf-token") or ""
        if not secrets.compare_digest(str(given), signed.csrf or ""):
            await call(accounts.refused, signed, "csrf", request.url.path, "missing or wrong CSRF token")
            raise PermissionDeniedError("the form's CSRF token is missing or wrong; reload the page and try again")
        return signed, form

    def page(
        request: Request, template: str, signed: SignedIn | None, status_code: int = 200, **context
    ) -> HTMLResponse:
        return templates.TemplateResponse(
            request, template, {"me": signed, "path": request.url.path, **context}, status_code=status_code
        )

    @app.middleware("http")
    async def security_headers(request: Request, call_next):
        response = await call_next(request)
        for key, value in _SECURITY_HEADERS.items():
            if key == "cache-control" and request.url.path.startswith("/static/"):
                continue
            response.headers.setdefault(key, value)
        return response

    @app.exception_handler(_SignInRequired)
    async def _to_sign_in(request: Request, error: _SignInRequired):
        if request.method != "GET" or request.url.path.endswith("/events"):
            return JSONResponse({"error": "PermissionDeniedError", "detail": "sign in first"}, status_code=401)
        target = "/signin?next=" + quote(request.url.path)
        if error.reason:
            target += "&expired=1"
        response = RedirectResponse(target, status_code=303)
        if request.cookies.get(COOKIE):
            response.delete_cookie(COOKIE, path="/", secure=True, httponly=True, samesite="strict")
        return response

    @app.exception_handler(ConfideError)
    async def _error_page(request: Request, error: ConfideError):
        status = http_status(error)
        if request.headers.get("hx-request"):
            return HTMLResponse(f'<p class="error" role="alert">{escape(str(error))}</p>', status_code=status)
        signed = None
        cookie = request.cookies.get(COOKIE)
        if cookie:
            try:
                signed = await call(accounts.session, cookie)
            except ConfideError:
                signed = None
        if signed is not None and isinstance(error, PermissionDeniedError) and "CSRF" not in str(error):
            # A signed-in person refused by the controller's rules (another developer's job,
            # another owner's dataset): the refusal is audited with the account and the page.
            await call(accounts.refused, signed, "console", f"{request.method} {request.url.path}", str(error)[:500])
        return page(request, "error.html", signed, status, error=str(error), kind=type(error).__name__)

    # ------------------------------------------------------------------ sign-in

    @app.get("/signin", response_class=HTMLResponse)
    async def sign_in_form(request: Request, next: str = "/jobs", expired: int = 0):
        token = secrets.token_urlsafe(24)
        response = page(request, "signin.html", None, form_token=token, next=_local(next), expired=bool(expired))
        response.set_cookie(PRE_COOKIE, token, httponly=True, secure=True, samesite="strict", path="/", max_age=3600)
        return response

    @app.post("/signin")
    async def sign_in(request: Request):
        form = dict(await request.form())
        pre = request.cookies.get(PRE_COOKIE) or ""
        if not pre or not secrets.compare_digest(str(form.get("csrf", "")), pre):
            raise PermissionDeniedError("the sign-in form expired or was not this console's; reload it")
        address = request.client.host if request.client else "unknown"
        try:
            cookie, _signed = await call(
                accounts.sign_in, str(form.get("name", "")), str(form.get("password", "")), address
            )
        except (PermissionDeniedError, RateLimitedError) as error:
            token = secrets.token_urlsafe(24)
            response = page(
                request,
                "signin.html",
                None,
                http_status(error),
                form_token=token,
                next=_local(str(form.get("next", "/jobs"))),
                error=str(error),
                name=str(form.get("name", ""))[:64],
            )
            response.set_cookie(
                PRE_COOKIE, token, httponly=True, secure=True, samesite="strict", path="/", max_age=3600
            )
            return response
        response = RedirectResponse(_local(str(form.get("next", "/jobs"))), status_code=303)
        response.set_cookie(COOKIE, cookie, httponly=True, secure=True, samesite="strict", path="/")
        response.delete_cookie(PRE_COOKIE, path="/", secure=True, httponly=True, samesite="strict")
        return response

    @app.post("/signout")
    async def sign_out(request: Request):
        await checked(request)
        await call(accounts.sign_out, request.cookies.get(COOKIE, ""))
        response = RedirectResponse("/signin", status_code=303)
        response.delete_cookie(COOKIE, path="/", secure=True, httponly=True, samesite="strict")
        return response

    # ------------------------------------------------------------------ jobs

    @app.get("/")
    async def home():
        return RedirectResponse("/jobs", status_code=303)

    @app.get("/jobs", response_class=HTMLResponse)
    async def jobs(request: Request):
        signed = await who(request)
        rows = await call(controller.sessions, signed.caller)
        return page(request, "jobs.html", signed, sessions=list(reversed(rows)))

    @app.get("/jobs/new", response_class=HTMLResponse)
    async def editor(request: Request, source: str = Query("", alias="from")):
        signed = await who(request)
        text = _EXAMPLE_SPEC
        if source:
            status = await call(controller.status, signed.caller, source)
            entry = await call(controller.entry, signed.caller, source, status["head_seq"])
            text = yaml.safe_dump(entry["spec"], sort_keys=False)
        return page(request, "editor.html", signed, text=text, check=None)

    @app.get("/schema/job.json")
    async def job_schema(request: Request):
        await who(request)
        return JSONResponse(JobSpec.model_json_schema())

    @app.post("/jobs/check", response_class=HTMLResponse)
    async def check(request: Request):
        signed, form = await checked(request)
        result = await call(controller.preflight, signed.caller, _spec_of(form))
        return page(request, "_check.html", signed, check=result)

    @app.post("/jobs")
    async def submit(request: Request):
        signed, form = await checked(request)
        text = str(form.get("spec", ""))
        try:
            reply = await call(controller.submit, signed.caller, _spec_of(form))
        except ConfideError as error:
            result = await call(_safe_preflight, controller, signed, form)
            return page(request, "editor.html", signed, http_status(error), text=text, check=result, error=str(error))
        return RedirectResponse(f"/jobs/{reply['session']}", status_code=303)

    @app.get("/jobs/{token}", response_class=HTMLResponse)
    async def job(request: Request, token: str):
        signed = await who(request)
        status = await call(controller.status, signed.caller, token)
        metrics = await call(controller.metrics, signed.caller, token)
        log = await call(controller.log, signed.caller, token)
        lineage = await call(controller.lineage, signed.caller, token)
        return page(
            request,
            "job.html",
            signed,
            status=status,
            metrics=metrics,
            curves={
                "participants": [
                    {"name": p["name"], "metrics": _current(p["metrics"], status)} for p in metrics["participants"]
                ]
            },
            # A party's shared log lines: to the job's developer and admins, and to that party only.
            logs=[
                p for p in metrics["participants"] if p["log"] and (signed.role != "owner" or p["name"] == signed.party)
            ],
            log=log,
            protection=_protection(metrics),
            final=status["state"] in FINAL_STATES,
            graph=_lineage_graph(lineage),
        )

    @app.get("/jobs/{token}/metrics.json")
    async def job_metrics(request: Request, token: str, after: int = -1):
        signed = await who(request)
        return JSONResponse(await call(controller.metrics, signed.caller, token, after=after))

    @app.get("/jobs/{token}/events")
    async def job_events(request: Request, token: str):
        signed = await who(request)
        await call(controller.status, signed.caller, token)  # refused here, before the stream starts

        cookie = request.cookies.get(COOKIE, "")

        async def stream():
            last_status, after, idle, run = None, {}, 0, None
            checked_at = asyncio.get_running_loop().time()
            while not await request.is_disconnected():
                try:
                    if asyncio.get_running_loop().time() - checked_at > STREAM_RECHECK_S:
                        await call(accounts.session, cookie)  # signed out, expired or disabled: the stream ends
                        checked_at = asyncio.get_running_loop().time()
                    status = await call(controller.status, signed.caller, token)
                    reset = status["run"] != run
                    if reset:  # a new run replaces the rounds after its resume point: send them all again
                        after, run = {}, status["run"]
                    metrics = await call(
                        controller.metrics, signed.caller, token, after=min(after.values(), default=-1), logs=False
                    )
                except ConfideError as error:
                    yield _event("problem", {"error": str(error)})
                    return
                fresh = []
                for participant in metrics["participants"]:
                    seen = after.get(participant["name"], -1)
                    rows = [row for row in _current(participant["metrics"], status) if row["round"] > seen]
                    if rows:
                        after[participant["name"]] = rows[-1]["round"]
                        fresh.append({"name": participant["name"], "metrics": rows})
                    after.setdefault(participant["name"], seen)
                shown = {**_shown(status), "protection": _protection(metrics)}
                if shown != last_status or fresh or reset:
                    last_status = shown
                    yield _event("status", {"status": shown, "metrics": fresh, "reset": reset})
                    idle = 0
                else:
                    idle += 1
                    if idle % 15 == 0:
                        yield ": keep-alive\n\n"
                if status["state"] in FINAL_STATES and not fresh:
                    yield _event("end", {"state": status["state"]})
                    return
                await asyncio.sleep(EVENT_INTERVAL_S)

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"x-accel-buffering": "no"})

    @app.post("/jobs/{token}/cancel")
    async def cancel(request: Request, token: str):
        signed, _ = await checked(request)
        await call(controller.cancel, signed.caller, token)
        return RedirectResponse(f"/jobs/{token}", status_code=303)

    @app.post("/jobs/{token}/resume")
    async def resume(request: Request, token: str):
        signed, _ = await checked(request)
        await call(controller.resume, signed.caller, token)
        return RedirectResponse(f"/jobs/{token}", status_code=303)

    @app.post("/jobs/{token}/approve")
    async def approve(request: Request, token: str):
        signed, form = await checked(request)
        await call(controller.approve, signed.caller, token)
        return RedirectResponse(_local(str(form.get("back", "/data"))), status_code=303)

    @app.post("/jobs/{token}/tune/preview", response_class=HTMLResponse)
    async def tune_preview(request: Request, token: str):
        signed, form = await checked(request)
        try:
            preview = await call(
                controller.preview_tune, signed.caller, token, settings=_settings_of(str(form.get("settings", "")))
            )
        except InvalidParameterError as error:
            return page(request, "_tune_preview.html", signed, preview=None, error=str(error))
        return page(request, "_tune_preview.html", signed, preview=preview, error=None)

    @app.post("/jobs/{token}/tune")
    async def tune(request: Request, token: str):
        signed, form = await checked(request)
        settings = _settings_of(str(form.get("settings", "")))
        base = form.get("base_seq")
        await call(
            controller.tune,
            signed.caller,
            token,
            settings=settings,
            base_seq=int(base) if str(base).isdigit() else None,
        )
        return RedirectResponse(f"/jobs/{token}", status_code=303)

    # ------------------------------------------------------------------ data, audit, federation

    @app.get("/data", response_class=HTMLResponse)
    async def data(request: Request):
        signed = await who(request)
        datasets = await call(controller.datasets, signed.caller)
        if signed.role == "owner":
            datasets = [d for d in datasets if d["owner"] == signed.party]
        grants = await call(controller.grants, signed.caller)
        uses = await call(controller.uses, signed.caller)
        return page(request, "data.html", signed, datasets=datasets, grants=grants, uses=uses)

    @app.post("/data/grants")
    async def grant(request: Request):
        signed, form = await checked(request)
        await call(
            controller.grant,
            signed.caller,
            dataset=str(form.get("dataset", "")),
            developer=str(form.get("developer", "")),
            expires_at=str(form.get("expires_at") or "") or None,
            job_id=str(form.get("job_id") or "") or None,
            approval=form.get("approval") == "on",
        )
        return RedirectResponse("/data", status_code=303)

    @app.post("/data/grants/revoke")
    async def revoke(request: Request):
        signed, form = await checked(request)
        await call(
            controller.revoke,
            signed.caller,
            dataset=str(form.get("dataset", "")),
            developer=str(form.get("developer", "")),
        )
        return RedirectResponse("/data", status_code=303)

    @app.get("/audit", response_class=HTMLResponse)
    async def audit(request: Request, action: str = "", decision: str = "", actor: str = "", target: str = ""):
        signed = await who(request)
        filters = {"action": action, "decision": decision, "actor": actor, "target": target}
        events = await call(controller.audit, signed.caller, limit=AUDIT_PAGE_ROWS, newest_first=True, **_set(filters))
        return page(request, "audit.html", signed, events=events, filters=filters, shown=AUDIT_PAGE_ROWS)

    @app.get("/audit.csv")
    async def audit_csv(request: Request, action: str = "", decision: str = "", actor: str = "", target: str = ""):
        signed = await who(request)
        filters = _set({"action": action, "decision": decision, "actor": actor, "target": target})
        await call(controller.audit, signed.caller, limit=1, **filters)  # a bad filter is refused before streaming

        async def rows():
            out = io.StringIO()
            writer = csv.writer(out)
            writer.writerow(["id", "at", "actor", "action", "target", "decision", "detail"])
            after = 0
            while True:
                batch = await call(controller.audit, signed.caller, after=after, limit=5_000, **filters)
                for e in batch:
                    detail = json.dumps(e["detail"], sort_keys=True)
                    cells = [e["id"], e["at"], e["actor"], e["action"], e["target"], e["decision"], detail]
                    writer.writerow([_cell(value) for value in cells])
                yield out.getvalue()
                out.seek(0)
                out.truncate()
                if len(batch) < 5_000:
                    return
                after = batch[-1]["id"]

        return StreamingResponse(
            rows(), media_type="text/csv", headers={"content-disposition": 'attachment; filename="confide-audit.csv"'}
        )

    @app.get("/federation", response_class=HTMLResponse)
    async def federation(request: Request):
        signed = await who(request)
        parties = await call(controller.parties, signed.caller)
        return page(request, "federation.html", signed, parties=parties, alive_s=controller.alive_s)

    # The REST API, for scripts with an API token (no agent routes: those need certificates).
    def token_caller(request: Request):
        header = request.headers.get("authorization", "")
        if not header.lower().startswith("bearer "):
            raise PermissionDeniedError("send an API token: 'Authorization: Bearer <token>' (confide console token)")
        return accounts.token(header[7:].strip()).caller

    app.add_middleware(BodyLimit, limit=MAX_REQUEST_BYTES)
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    app.mount("/", create_rest_app(controller, identify=token_caller, agent_routes=False))
    return app


def _local(target: str) -> str:
    """Only a path on this console (an open redirect otherwise)."""
    return target if target.startswith("/") and not target.startswith("//") and "\\" not in target else "/jobs"


def _event(name: str, data: Any) -> str:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _current(rows: list[dict], status: dict) -> list[dict]:
    """Rows of the current run's history: an older run's rounds after the resume point were redone."""
    return [
        row
        for row in rows
        if row.get("run", status["run"]) >= status["run"] or row["round"] <= (status.get("resume_round") or 0)
    ]


def _shown(status: dict) -> dict:
    """What the job page shows live (the status minus what never changes)."""
    return {
        "state": status["state"],
        "message": status["message"],
        "run": status["run"],
        "checkpoint": status["checkpoint"],
        "evaluation": status.get("evaluation"),
        "participants": [
            {k: p.get(k) for k in ("name", "role", "status", "run", "round", "error")} for p in status["participants"]
        ],
    }


def _spec_of(form: dict) -> Any:
    text = str(form.get("spec", ""))
    if len(text) > MAX_SPEC_CHARS:
        raise InvalidParameterError(f"spec: at most {MAX_SPEC_CHARS} characters, got {len(text)}")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise InvalidParameterError(f"spec: not valid YAML/JSON: {error}") from None


def _settings_of(text: str) -> dict:
    """``path=value`` lines (values in YAML: numbers, booleans, lists) as tuning settings."""
    settings: dict[str, Any] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        path, sep, value = line.partition("=")
        if not sep or not path.strip():
            raise InvalidParameterError(f"settings line {number}: write PATH=VALUE, e.g. model.learning_rate=0.05")
        try:
            settings[path.strip()] = yaml.safe_load(value.strip())
        except yaml.YAMLError as error:
            raise InvalidParameterError(f"settings line {number}: the value is not YAML: {error}") from None
    if not settings:
        raise InvalidParameterError("settings: give at least one PATH=VALUE line")
    return settings


def _safe_preflight(controller: Controller, signed: SignedIn, form: dict) -> dict | None:
    try:
        return controller.preflight(signed.caller, _spec_of(form))
    except ConfideError:
        return None


def _cell(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text (a leading =, +, -, @ would make it a formula)."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def _set(filters: dict[str, str]) -> dict[str, str]:
    """The filters given (an empty form field means no filter)."""
    return {key: value for key, value in filters.items() if value}


def _lineage_graph(lineage: dict) -> dict:
    """Nodes and edges of a session's data flow, and the FL_Data's versions (drawn with cytoscape).

    Each party's dataset flows through the pipeline steps into the model.
    """
    exported = lineage.get("fl_data")
    if not exported:
        return {"nodes": [], "edges": [], "versions": []}
    state = exported["state"]
    nodes, edges = [], []
    steps = [f"step-{index}" for index in range(len(state["pipeline"]))]
    for step, node in zip(state["pipeline"], steps, strict=True):
        nodes.append({"id": node, "label": f"{step['name']} ({step['op']})", "kind": "step"})
    model = "model"
    nodes.append({"id": model, "label": f"model: {lineage['algorithm']}", "kind": "model"})
    for index, (party, participant) in enumerate(sorted(state["participants"].items())):
        node = f"dataset-{index}"
        nodes.append({"id": node, "label": f"{party}/{participant['dataset']}", "kind": "dataset"})
        edges.append({"source": node, "target": steps[0] if steps else model})
    chain = [*steps, model]
    edges.extend({"source": source, "target": target} for source, target in zip(chain, chain[1:], strict=False))
    versions = [
        {"version": entry["version"], "operation": entry["operation"], "fingerprint": entry["fingerprint"][:12]}
        for entry in exported["lineage"]
    ]
    return {"nodes": nodes, "edges": edges, "versions": versions}


def _protection(metrics: dict) -> dict:
    """The protection each party reports running, and what differs between them (an anomaly)."""
    reports = {p["name"]: p["protection"] for p in metrics["participants"] if p.get("protection")}
    requested = metrics.get("mode_requested")
    anomalies = []
    for name, report in sorted(reports.items()):
        ran = report.get("mode") or report.get("ran")
        if requested and ran != requested:
            anomalies.append(f"{name} reports running {ran!r}, but the job asked for {requested!r}")
    modes = {report.get("mode") or report.get("ran") for report in reports.values()}
    if len(modes) > 1:
        anomalies.append("parties report different protection: " + ", ".join(sorted(str(m) for m in modes)))
    first = next(iter(reports.values()), None)
    return {"parties": reports, "summary": first, "requested": requested, "anomalies": anomalies}


_EXAMPLE_SPEC = """\
job_id: my-first-job
rounds: 10
checkpoint_interval: 2
fl_data:
  label: diagnosis
  participants:
    hospital-a: {dataset: breast-cancer}
    hospital-b: {dataset: breast-cancer}
    hospital-c: {dataset: breast-cancer}
  pipeline:
    - {name: scaled, op: scale, params: {method: standard}}
model: {algorithm: homo_lr, learning_rate: 0.3, local_epochs: 1, batch_size: 32}
protection: {mode: paillier}
"""
