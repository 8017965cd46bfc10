"""The REST API over real HTTPS with mutual TLS (uvicorn in a thread), on both stores."""

from __future__ import annotations

import socket
import ssl
import threading
import time

import httpx
import pytest

from confide.agent.client import ControllerClient
from confide.controller import api
from confide.controller.server import ControllerServer
from confide.errors import (
    ConflictError,
    DataAccessDeniedError,
    InvalidParameterError,
    NotFoundError,
    PermissionDeniedError,
)
from confide.transport.certs import init_federation

from .conftest import STORES, dataset, job, make_store_url

PARTY_NAMES = ["hospital-a", "hospital-b"]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    root = tmp_path_factory.mktemp("federation")
    init_federation(
        root,
        parties=PARTY_NAMES,
        services=["aggregator", "controller"],
        admins=["runner"],
        developers=["dev", "eve"],
    )
    other = tmp_path_factory.mktemp("other-federation")
    init_federation(other, parties=["hospital-a"], services=[], admins=[], developers=["dev"])
    return root, other


@pytest.fixture(scope="module", params=STORES)
def server(request, certs, tmp_path_factory):
    url, cleanup = make_store_url(request.param, request, tmp_path_factory.mktemp("store"))
    served = ControllerServer(certs_dir=certs[0], name="controller", database=url)
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not served.server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the controller did not start"
        time.sleep(0.02)
    yield served
    served.stop()
    thread.join(timeout=20)
    cleanup()


@pytest.fixture(scope="module")
def clients(server, certs):
    """One client per identity; the parties, aggregator and grants are set up once per store."""
    url = f"https://127.0.0.1:{server.port}"
    opened = {
        name: ControllerClient(url, certs_dir=certs[0], name=name)
        for name in [*PARTY_NAMES, "aggregator", "dev", "eve", "runner"]
    }
    opened["aggregator"].register(address="127.0.0.1:7000")
    for name in PARTY_NAMES:
        opened[name].register(datasets=[dataset()])
        opened[name].grant("records", "dev")
    yield opened
    for client in opened.values():
        client.close()


def _raw_exchange(port: int, context: ssl.SSLContext) -> bytes:
    """Handshake, send one request, return what came back (empty if the server hung up)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"GET /v1/whoami HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return tls.recv(4096)


def _context(certs_dir, name=None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs_dir / "ca.crt"))
    if name:
        context.load_cert_chain(str(certs_dir / f"{name}.crt"), str(certs_dir / f"{name}.key"))
    return context


def test_without_client_certificate_the_handshake_fails(server, certs):
    with pytest.raises((ssl.SSLError, ConnectionError)):
        answer = _raw_exchange(server.port, _context(certs[0]))
        assert answer == b""  # TLS 1.3: the server's alert may come as a hang-up
        raise ConnectionError("server closed the connection")


def test_certificate_from_another_ca_fails(server, certs):
    context = _context(certs[0])
    context.load_cert_chain(str(certs[1] / "dev.crt"), str(certs[1] / "dev.key"))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        answer = _raw_exchange(server.port, context)
        assert answer == b""
        raise ConnectionError("server closed the connection")


def test_a_valid_certificate_gets_an_answer(server, certs):
    assert _raw_exchange(server.port, _context(certs[0], "dev")).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize(("name", "role"), [("dev", "developer"), ("hospital-a", "party"), ("runner", "admin")])
def test_whoami_is_the_certificate(clients, name, role):
    assert clients[name].whoami() == {"name": name, "role": role}


def test_health_names_the_store(clients, server):
    assert clients["dev"].request("GET", "/v1/health") == {"status": "ok", "store": server.store.dialect}


def test_body_over_the_limit_is_413_and_stores_nothing(clients):
    before = [p["name"] for p in clients["runner"].parties()]
    oversized = b'{"address": "' + b"x" * api.MAX_REQUEST_BYTES + b'"}'
    response = clients["eve"]._http.post(
        "/v1/register", content=oversized, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["error"] == "ResourceLimitError"
    assert str(api.MAX_REQUEST_BYTES) in response.json()["detail"]
    assert [p["name"] for p in clients["runner"].parties()] == before
    assert "eve" not in before


def test_streamed_body_over_the_limit_is_413(clients):
    def chunks():
        yield b'{"address": "'
        for _ in range(api.MAX_REQUEST_BYTES // 65536 + 1):
            yield b"x" * 65536
        yield b'"}'

    response = clients["eve"]._http.post("/v1/register", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413


def test_malformed_json_is_422(clients):
    response = clients["dev"]._http.post("/v1/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["error"] == "InvalidParameterError"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/grants", {"dataset": 5, "developer": "dev"}, "dataset"),
        ("/v1/grants", {"dataset": "records"}, "developer"),
        ("/v1/jobs", {"spec": "job"}, "spec"),
        ("/v1/jobs", {"spec": {}, "extra": 1}, "extra"),
        ("/v1/register", {"datasets": "records"}, "datasets"),
        ("/v1/sessions/x/tune", {"base_seq": -1}, "base_seq"),
    ],
)
def test_wrong_types_are_422_naming_the_field(clients, path, body, field):
    response = clients["hospital-a"]._http.post(path, json=body)
    assert response.status_code == 422
    payload = response.json()
    assert payload["error"] == "InvalidParameterError" and field in payload["detail"]


def test_openapi_lists_the_endpoints(clients):
    paths = clients["dev"].request("GET", "/openapi.json")["paths"]
    for path in (
        "/v1/whoami",
        "/v1/register",
        "/v1/grants",
        "/v1/jobs",
        "/v1/sessions/{token}",
        "/v1/sessions/{token}/log",
        "/v1/sessions/{token}/tune",
        "/v1/sessions/{token}/resume",
        "/v1/sessions/{token}/cancel",
        "/v1/agent/sync",
    ):
        assert path in paths


def test_openapi_describes_session_status_with_the_typed_report_models(clients):
    document = clients["dev"].request("GET", "/openapi.json")
    answer = document["paths"]["/v1/sessions/{token}"]["get"]["responses"]["200"]["content"]["application/json"]
    assert answer["schema"] == {"$ref": "#/components/schemas/SessionStatus"}
    for path, record in (
        ("/v1/sessions", "SessionSummary"),
        ("/v1/parties", "PartyRecord"),
        ("/v1/datasets", "DatasetRecord"),
        ("/v1/grants", "GrantRecord"),
        ("/v1/audit", "AuditRecord"),
        ("/v1/sessions/{token}/log", "LogEntryRecord"),
    ):
        listing = document["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
        assert listing["schema"]["items"] == {"$ref": f"#/components/schemas/{record}"}, path
    assert "schema" in document["components"]["schemas"]["DatasetRecord"]["properties"]
    schemas = document["components"]["schemas"]
    assert {"SessionStatus", "ParticipantStatus", "PartyResult"} <= set(schemas)
    assert {"rounds", "train_loss", "test_auc", "test_accuracy", "protection", "model"} <= set(
        schemas["PartyResult"]["properties"]
    )
    token = clients["dev"].submit(job())["session"]
    status = clients["dev"].status(token)
    assert status["session"] == token and set(PARTY_NAMES) <= {p["name"] for p in status["participants"]}
    assert any(row["session"] == token and row["state"] == status["state"] for row in clients["dev"].sessions())
    assert all({"owner", "name", "schema", "rows", "granted"} <= set(d) for d in clients["dev"].datasets())
    assert [e["kind"] for e in clients["dev"].log(token)] == ["submit"]


def _status_of(client, method, path, body=None):
    response = client._http.request(method, path, json=body)
    return response.status_code, response.json()


def test_errors_map_to_statuses(clients):
    status, body = _status_of(clients["eve"], "POST", "/v1/jobs", {"spec": job()})
    assert status == 403 and body["error"] == "DataAccessDeniedError" and "eve" in body["detail"]
    status, body = _status_of(clients["dev"], "POST", "/v1/jobs", {"spec": {"job_id": "x"}})
    assert status == 400 and body["error"] == "InvalidParameterError" and "parties" in body["detail"]
    status, body = _status_of(clients["dev"], "GET", "/v1/sessions/nope")
    assert status == 404 and body["error"] == "NotFoundError"
    token = clients["dev"].submit(job())["session"]
    clients["dev"].tune(token, settings={"model.learning_rate": 0.05}, base_seq=1)
    status, body = _status_of(
        clients["dev"], "POST", f"/v1/sessions/{token}/tune", {"settings": {"rounds": 3}, "base_seq": 1}
    )
    assert status == 409 and body["error"] == "ConflictError"
    status, body = _status_of(clients["dev"], "POST", "/v1/grants", {"dataset": "records", "developer": "eve"})
    assert status == 403 and body["error"] == "PermissionDeniedError"


def test_client_raises_the_controller_errors(clients):
    with pytest.raises(DataAccessDeniedError):
        clients["eve"].submit(job())
    with pytest.raises(NotFoundError):
        clients["dev"].status("nope")
    with pytest.raises(PermissionDeniedError):
        clients["dev"].grant("records", "eve")
    with pytest.raises(InvalidParameterError):
        clients["hospital-a"].register(datasets=[dataset(rows_data=[[1]])])
    token = clients["dev"].submit(job())["session"]
    with pytest.raises(ConflictError):
        clients["dev"].tune(token, settings={"rounds": 3}, base_seq=0)
    with pytest.raises(PermissionDeniedError):
        clients["eve"].log(token)


def test_a_session_end_to_end_over_https(clients):
    token = clients["dev"].submit(job())["session"]
    instructions = clients["hospital-a"].sync([])["instructions"]
    mine = [i for i in instructions if i["session"] == token]
    assert mine and mine[0]["delta"][0]["path"] == [] and mine[0]["command"] == "none"
    answer = clients["dev"].tune(token, settings={"model.learning_rate": 0.05})
    assert set(answer["deltas"]) == set(PARTY_NAMES)
    assert [e["kind"] for e in clients["dev"].log(token)] == ["submit", "tune"]
    assert clients["dev"].entry(token, 2)["spec"]["model"]["learning_rate"] == 0.05
    assert clients["dev"].cancel(token)["state"] == "cancelled"
    assert any(s["session"] == token for s in clients["dev"].sessions())
    assert [g["dataset"] for g in clients["dev"].grants()] == ["hospital-a/records", "hospital-b/records"]
    assert all(e["actor"] == "dev" for e in clients["dev"].audit())


def test_revoke_over_https(clients):
    clients["hospital-a"].grant("records", "eve")
    assert clients["hospital-a"].revoke("records", "eve")["active"] is False
    with pytest.raises(NotFoundError):
        clients["hospital-a"].revoke("records", "eve")


def test_unreachable_controller(certs):
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    from confide.errors import TransportUnavailableError

    with ControllerClient(f"https://127.0.0.1:{port}", certs_dir=certs[0], name="dev", timeout_s=5) as client:
        with pytest.raises(TransportUnavailableError):
            client.whoami()


def test_httpx_without_certificate_is_refused(server, certs):
    with httpx.Client(verify=_context(certs[0]), timeout=5) as client:
        with pytest.raises(httpx.HTTPError):
            client.get(f"https://127.0.0.1:{server.port}/v1/whoami")


def test_every_endpoint_declares_its_reply_model(clients):
    """No route answers with an undeclared mapping: /openapi.json describes every 200 body."""
    document = clients["dev"].request("GET", "/openapi.json")
    undeclared = []
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
            ref = schema.get("$ref") or schema.get("items", {}).get("$ref")
            if not ref:
                undeclared.append(f"{method.upper()} {path}")
    assert undeclared == []
    replies = {
        ("post", "/v1/jobs"): "SubmitReply",
        ("post", "/v1/grants"): "GrantReply",
        ("delete", "/v1/grants/{dataset}/{developer}"): "RevokeReply",
        ("post", "/v1/sessions/{token}/tune"): "TuneReply",
        ("post", "/v1/sessions/{token}/resume"): "ResumeReply",
        ("post", "/v1/sessions/{token}/cancel"): "CancelReply",
        ("post", "/v1/agent/sync"): "SyncReply",
    }
    for (method, path), model in replies.items():
        schema = document["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{model}"}, path
