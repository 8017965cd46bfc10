"""The web console over real HTTPS, served by a real ControllerServer (in a thread): security and pages.

Each refusal here is also checked in the audit log: a forged form, another developer's job,
another owner's grant, a stale cookie, brute-force sign-in.
"""

from __future__ import annotations

import json
import re
import ssl
import threading
from datetime import timedelta

import httpx
import pytest
import yaml
from sqlalchemy import select, update

from confide.controller.server import ControllerServer
from confide.controller.service import Caller
from confide.controller.store import WebSession, utcnow
from confide.errors import ConflictError, InvalidParameterError, PermissionDeniedError, RateLimitedError
from confide.transport.certs import init_federation
from confide.web import accounts as accounts_module
from confide.web import create_console_app
from confide.web.accounts import Accounts

from .conftest import Federation, dataset, job

PASSWORD = "correct horse battery staple"


ALIVE_S = 3600.0


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    """A controller with its console on loopback; accounts dev, eve (developers), owners of a and b, an admin."""
    root = tmp_path_factory.mktemp("console")
    init_federation(root / "certs", parties=["hospital-a", "hospital-b"])
    server = ControllerServer(
        certs_dir=root / "certs",
        name="controller",
        database=f"sqlite:///{root / 'controller.db'}",
        console_address="127.0.0.1:0",
        console_app=create_console_app,
        # The module's agents register once and never heartbeat: on a loaded host the module runs
        # past 30 s, and a submit must still find the aggregator alive.
        alive_s=ALIVE_S,
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    fed = Federation(server.controller)
    fed.register_aggregator()
    fed.register_party("hospital-a", [dataset(description="<script>alert('a')</script> records")])
    fed.register_party("hospital-b")
    fed.grant("hospital-b")
    accounts = Accounts(server.store)
    accounts.create("dev", "developer", PASSWORD)
    accounts.create("eve", "developer", PASSWORD)
    accounts.create("owner-a", "owner", PASSWORD, party="hospital-a")
    accounts.create("owner-b", "owner", PASSWORD, party="hospital-b")
    accounts.create("root", "admin", PASSWORD)
    url = f"https://127.0.0.1:{server.console_port}"
    with httpx.Client(
        base_url=url, verify=ssl.create_default_context(cafile=root / "certs" / "ca.crt"), timeout=10
    ) as probe:
        for _ in range(100):
            try:
                probe.get("/signin")
                break
            except httpx.TransportError:
                threading.Event().wait(0.05)
    yield {"url": url, "ca": str(root / "certs" / "ca.crt"), "server": server, "fed": fed, "accounts": accounts}
    server.stop()
    thread.join(10)


_OPEN: list[httpx.Client] = []


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    while _OPEN:
        _OPEN.pop().close()


def browser(console) -> httpx.Client:
    """A fresh "browser" (cookie jar) for the console, closed after the test."""
    _OPEN.append(client := _client(console))
    return client


def _client(console) -> httpx.Client:
    return httpx.Client(
        base_url=console["url"],
        verify=ssl.create_default_context(cafile=console["ca"]),
        timeout=20,
        follow_redirects=False,
    )


def sign_in(console, name: str, password: str = PASSWORD) -> tuple[httpx.Client, str]:
    """A client signed in as ``name`` and its CSRF token."""
    client = browser(console)
    form = client.get("/signin")
    token = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
    reply = client.post("/signin", data={"csrf": token, "name": name, "password": password, "next": "/jobs"})
    assert reply.status_code == 303, reply.text
    page = client.get("/jobs")
    return client, re.search(r'name="csrf-token" content="([^"]+)"', page.text).group(1)


def granted(console) -> None:
    """dev may use both hospitals' records."""
    console["fed"].grant("hospital-a")


def audit(console, **match) -> list[dict]:
    events = console["server"].controller.audit(Caller("root", "admin"), limit=10_000)
    return [e for e in events if all(e.get(k) == v for k, v in match.items())]


def test_pages_redirect_to_sign_in_and_streams_refuse(console):
    with browser(console) as client:
        for path in ("/jobs", "/jobs/new", "/data", "/audit", "/federation", "/audit.csv"):
            reply = client.get(path)
            assert reply.status_code == 303 and reply.headers["location"].startswith("/signin?next=")
        assert client.get("/jobs/abc/events").status_code == 401
        assert client.post("/jobs", data={"spec": "x"}).status_code == 401


def test_sign_in_cookie_and_headers_are_hardened(console):
    with browser(console) as client:
        form = client.get("/signin")
        token = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
        reply = client.post("/signin", data={"csrf": token, "name": "dev", "password": PASSWORD})
        cookie = reply.headers["set-cookie"]
        assert cookie.startswith("__Host-confide_session=")
        for flag in ("HttpOnly", "Secure", "SameSite=strict", "Path=/"):
            assert flag.lower() in cookie.lower()
        page = client.get("/jobs")
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert page.headers["x-frame-options"] == "DENY"
        assert "unsafe-inline" not in policy
        assert not re.search(r"<script>(?!</script>)", page.text)  # no inline script on any page
    assert audit(console, action="sign-in", actor="dev", decision="allow")


def test_sign_in_form_needs_its_own_token(console):
    with browser(console) as client:
        reply = client.post("/signin", data={"csrf": "made-up", "name": "dev", "password": PASSWORD})
        assert reply.status_code == 403
        assert "__Host-confide_session" not in reply.headers.get("set-cookie", "")


def test_brute_force_sign_in_is_rate_limited_and_audited(console):
    console["accounts"].create("target", "developer", PASSWORD)
    with browser(console) as client:
        for _ in range(accounts_module.MAX_FAILURES_PER_NAME):
            form = client.get("/signin")
            token = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
            reply = client.post("/signin", data={"csrf": token, "name": "target", "password": "wrong password!!"})
            assert reply.status_code == 403 and "wrong account name or password" in reply.text
        form = client.get("/signin")
        token = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
        # Even the right password is refused now: the limit counts the name's failures.
        reply = client.post("/signin", data={"csrf": token, "name": "target", "password": PASSWORD})
        assert reply.status_code == 429 and "too many failed sign-ins" in reply.text
        assert "__Host-confide_session" not in reply.headers.get("set-cookie", "")
    denied = audit(console, action="sign-in", actor="target", decision="deny")
    assert len(denied) == accounts_module.MAX_FAILURES_PER_NAME + 1
    assert denied[-1]["detail"]["reason"] == "rate limited"


def test_forged_csrf_post_is_refused_and_audited(console):
    client, _csrf = sign_in(console, "dev")
    reply = client.post("/jobs", data={"csrf": "forged", "spec": yaml.safe_dump(job())})
    assert reply.status_code == 403 and "CSRF" in reply.text
    reply = client.post("/jobs", data={"spec": yaml.safe_dump(job())})
    assert reply.status_code == 403
    denied = audit(console, action="csrf", actor="dev", decision="deny")
    assert len(denied) >= 2 and denied[-1]["target"] == "/jobs"
    assert console["server"].controller.sessions(Caller("dev", "developer")) == []  # nothing submitted


def test_refused_submit_names_the_missing_grant_then_runs_once_granted(console):
    client, csrf = sign_in(console, "dev")
    spec = yaml.safe_dump(job(job_id="console-acl"))
    check = client.post("/jobs/check", data={"csrf": csrf, "spec": spec})
    assert check.status_code == 200
    assert "hospital-a/records" in check.text and "never granted" in check.text
    assert re.search(r"hospital-b/records</td><td class=\"ok\">granted", check.text)
    refused = client.post("/jobs", data={"csrf": csrf, "spec": spec})
    assert refused.status_code == 403
    assert "no grant for dataset hospital-a/records" in refused.text
    assert "console-acl" in refused.text  # the editor keeps the text
    assert audit(console, action="submit", actor="dev", decision="deny")[-1]["detail"]["account"] == "dev"

    owner, owner_csrf = sign_in(console, "owner-a")
    reply = owner.post("/data/grants", data={"csrf": owner_csrf, "dataset": "records", "developer": "dev"})
    assert reply.status_code == 303
    assert "dev" in owner.get("/data").text
    submitted = client.post("/jobs", data={"csrf": csrf, "spec": spec})
    assert submitted.status_code == 303
    page = client.get(submitted.headers["location"])
    assert page.status_code == 200 and "console-acl" in page.text and "Protection that ran" in page.text
    grant = audit(console, action="grant", actor="hospital-a")[-1]
    assert grant["detail"]["account"] == "owner-a"


def test_another_developers_job_is_refused_and_audited(console):
    granted(console)
    token = console["fed"].c.submit(Caller("dev", "developer"), job(job_id="dev-only"))["session"]
    client, csrf = sign_in(console, "eve")
    assert client.get(f"/jobs/{token}").status_code == 403
    refused = audit(console, action="console", actor="eve", decision="deny")
    assert refused[-1]["target"] == f"GET /jobs/{token}" and "belongs to 'dev'" in refused[-1]["detail"]["reason"]
    assert client.get(f"/jobs/{token}/events").status_code == 403
    assert client.get(f"/jobs/{token}/metrics.json").status_code == 403
    assert client.post(f"/jobs/{token}/cancel", data={"csrf": csrf}).status_code == 403
    assert "dev-only" not in client.get("/jobs").text
    mine, _ = sign_in(console, "dev")
    assert "dev-only" in mine.get("/jobs").text


def test_owner_sees_only_its_datasets_and_may_not_revoke_anothers_grant(console):
    client, csrf = sign_in(console, "owner-a")
    page = client.get("/data").text
    assert "hospital-a" in page and "<td>hospital-b</td>" not in page
    # The published description is shown as text, never run.
    assert "&lt;script&gt;alert(&#39;a&#39;)&lt;/script&gt;" in page and "<script>alert" not in page
    reply = client.post("/data/grants/revoke", data={"csrf": csrf, "dataset": "records", "developer": "dev"})
    # hospital-a revoking "records" acts on its own dataset only; hospital-b's grant to dev stays.
    assert reply.status_code in (303, 404)
    b = [g for g in console["server"].controller.grants(Caller("hospital-b", "party")) if g["developer"] == "dev"]
    assert b and b[0]["active"]
    developer, dev_csrf = sign_in(console, "dev")
    reply = developer.post("/data/grants", data={"csrf": dev_csrf, "dataset": "records", "developer": "dev"})
    assert reply.status_code == 403 and "needs role party" in reply.text


def test_script_in_a_job_name_is_escaped(console):
    client, csrf = sign_in(console, "dev")
    spec = yaml.safe_dump(job(job_id="<script>alert(1)</script>"))
    check = client.post("/jobs/check", data={"csrf": csrf, "spec": spec})
    assert "job_id: String should match pattern" in check.text and "<script>" not in check.text
    refused = client.post("/jobs", data={"csrf": csrf, "spec": spec})
    assert refused.status_code == 400
    # The editor gives the text back, as text.
    assert "<script>alert(1)</script>" not in refused.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in refused.text
    assert audit(console, action="csrf", actor="dev", target="/jobs/check") == []


def test_stale_and_signed_out_cookies_are_refused_and_audited(console):
    client, csrf = sign_in(console, "eve")
    cookie = client.cookies.get("__Host-confide_session")
    with console["server"].store.transaction() as db:
        db.execute(
            update(WebSession)
            .where(WebSession.account == "eve", WebSession.ended_at.is_(None))
            .values(last_seen_at=utcnow() - timedelta(seconds=accounts_module.IDLE_TIMEOUT_S + 5))
        )
    reply = client.get("/jobs")
    assert reply.status_code == 303 and "expired=1" in reply.headers["location"]
    assert audit(console, action="session", actor="eve", decision="deny")[-1]["detail"]["reason"].startswith("idle")

    again, csrf = sign_in(console, "eve")
    assert again.post("/signout", data={"csrf": csrf}).status_code == 303
    with browser(console) as replay:
        replay.cookies.set("__Host-confide_session", cookie)
        assert replay.get("/jobs").status_code == 303
        with console["server"].store.transaction() as db:
            ended = db.scalars(select(WebSession).where(WebSession.account == "eve")).all()
        assert all(row.ended_at is not None or row.last_seen_at is not None for row in ended)
    assert audit(console, action="sign-out", actor="eve")


def test_api_token_reaches_the_rest_api_but_not_the_agents_routes(console):
    granted(console)
    token = console["accounts"].issue_token("dev", "ci")
    console["fed"].c.submit(Caller("dev", "developer"), job(job_id="token-job"))
    headers = {"authorization": f"Bearer {token}"}
    with browser(console) as client:
        sessions = client.get("/v1/sessions", headers=headers)
        assert sessions.status_code == 200 and "token-job" in sessions.text
        check = client.post("/v1/jobs/check", headers=headers, json={"spec": job(job_id="x")})
        assert check.status_code == 200 and check.json()["valid"] is True
        assert client.post("/v1/agent/sync", headers=headers, json={"reports": []}).status_code in (404, 405)
        assert client.post("/v1/register", headers=headers, json={}).status_code in (404, 405)
        assert client.get("/v1/sessions").status_code == 403
        assert client.get("/v1/sessions", headers={"authorization": "Bearer cft_forged"}).status_code == 403
        console["accounts"].revoke_tokens("dev", "ci")
        assert client.get("/v1/sessions", headers=headers).status_code == 403
    assert audit(console, action="token", decision="deny")


def test_tune_preview_shows_the_delta_and_stores_nothing(console):
    granted(console)
    controller = console["fed"].c
    token = controller.submit(Caller("dev", "developer"), job(job_id="tune-me"))["session"]
    before = controller.log(Caller("dev", "developer"), token)
    client, csrf = sign_in(console, "dev")
    preview = client.post(f"/jobs/{token}/tune/preview", data={"csrf": csrf, "settings": "rounds=25"})
    assert preview.status_code == 200 and "recipient" in preview.text and "25" in preview.text
    bad = client.post(f"/jobs/{token}/tune/preview", data={"csrf": csrf, "settings": "rounds"})
    assert "PATH=VALUE" in bad.text
    assert controller.log(Caller("dev", "developer"), token) == before
    pushed = client.post(f"/jobs/{token}/tune", data={"csrf": csrf, "settings": "rounds=25"})
    assert pushed.status_code == 303
    log = controller.log(Caller("dev", "developer"), token)
    assert log[-1]["kind"] == "tune" and log[-1]["deltas"]


def test_event_stream_sends_status_and_metrics(console):
    granted(console)
    controller = console["fed"].c
    token = controller.submit(Caller("dev", "developer"), job(job_id="live"))["session"]
    controller.sync(
        Caller("hospital-b", "party"),
        [
            {
                "session": token,
                "run": 1,
                "status": "running",
                "round": 2,
                "metrics": [{"round": 1, "loss": 0.7, "auc": 0.8}, {"round": 2, "loss": 0.5, "bogus": "x"}],
                "protection": {"mode": "secagg", "verification": {"ran": True, "arithmetic": "integer"}},
                "log_tail": ["round 1 done", "<b>round 2</b> done"],
            }
        ],
    )
    client, _ = sign_in(console, "dev")
    with client.stream("GET", f"/jobs/{token}/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        lines = []
        for line in stream.iter_lines():
            lines.append(line)
            if line.startswith("data:"):
                break
    event = json.loads(lines[-1][5:])
    assert event["status"]["state"] == "running"
    (party,) = event["metrics"]
    assert party["name"] == "hospital-b"
    assert [row["round"] for row in party["metrics"]] == [1, 2]
    assert "bogus" not in party["metrics"][1]
    page = client.get(f"/jobs/{token}").text
    # The job asked for plain; the party reports secagg: shown as an anomaly.
    assert "reports running &#39;secagg&#39;, but the job asked for &#39;plain&#39;" in page
    # Whether the parties check the aggregator's sums, in words.
    assert "every party checks every sum (integer)" in page
    # The log lines hospital-b shares, as text.
    assert "&lt;b&gt;round 2&lt;/b&gt; done" in page and "<b>round 2</b>" not in page


def test_federation_page_shows_who_is_down(console):
    client, _ = sign_in(console, "root")
    page = client.get("/federation").text
    assert re.search(r'data-name="hospital-a">.*?online', page, re.S)
    console["server"].controller.alive_s = 0.0
    try:
        page = client.get("/federation").text
    finally:
        console["server"].controller.alive_s = ALIVE_S
    assert re.search(r'data-name="aggregator">.*?down', page, re.S)


def test_audit_filters_and_exports(console):
    client, _ = sign_in(console, "root")
    page = client.get("/audit", params={"action": "sign-in", "decision": "deny"}).text
    table = page.split('<table id="audit">')[1]
    assert "<td>sign-in</td>" in table and '<td class="">allow</td>' not in table
    exported = client.get("/audit.csv", params={"action": "sign-in"})
    assert exported.headers["content-type"].startswith("text/csv")
    rows = exported.text.strip().splitlines()
    assert rows[0].startswith("id,at,actor,action") and all(",sign-in," in row for row in rows[1:])


# ---------------------------------------------------------------------------------------------- accounts


def test_account_inputs_are_checked(store):
    accounts = Accounts(store)
    with pytest.raises(InvalidParameterError, match="role must be one of"):
        accounts.create("x", "root", PASSWORD)
    with pytest.raises(InvalidParameterError, match="password must be 12..1024"):
        accounts.create("x", "developer", "short")
    with pytest.raises(InvalidParameterError, match="party must be"):
        accounts.create("x", "owner", PASSWORD)
    with pytest.raises(InvalidParameterError, match="name must be"):
        accounts.create("Bad Name", "developer", PASSWORD)
    accounts.create("x", "developer", PASSWORD)
    with pytest.raises(ConflictError, match="exists already"):
        accounts.create("x", "developer", PASSWORD)
    assert accounts.list() == [{"name": "x", "role": "developer", "party": None, "disabled": False}]


def test_sign_in_rate_limit_and_disable(store):
    accounts = Accounts(store)
    accounts.create("dev", "developer", PASSWORD)
    cookie, who = accounts.sign_in("dev", PASSWORD, "10.0.0.1")
    assert who.caller == Caller("dev", "developer", account="dev")
    assert accounts.session(cookie).name == "dev"
    with pytest.raises(PermissionDeniedError):
        accounts.sign_in("nobody", PASSWORD, "10.0.0.1")
    for _ in range(accounts_module.MAX_FAILURES_PER_NAME):
        with pytest.raises(PermissionDeniedError):
            accounts.sign_in("dev", "not the password", "10.0.0.2")
    with pytest.raises(RateLimitedError):
        accounts.sign_in("dev", PASSWORD, "10.0.0.3")
    accounts.disable("dev")
    with pytest.raises(PermissionDeniedError, match="sign in again"):
        accounts.session(cookie)
    owner = Accounts(store)
    owner.create("admin-a", "owner", PASSWORD, party="hospital-a")
    _cookie, signed = owner.sign_in("admin-a", PASSWORD, "10.0.0.9")
    assert signed.caller == Caller("hospital-a", "party", account="admin-a")


def test_a_party_shares_only_the_tail_of_its_log_and_only_when_it_changes(tmp_path):
    from confide.agent import Agent
    from confide.party.agent import log_tail

    log = tmp_path / "party.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)) + "x" * 5000 + "\n")
    tail = log_tail(log, 3)
    assert tail[:2] == ["line 98", "line 99"] and len(tail[2]) == 500
    assert log_tail(tmp_path / "missing.log", 3) == []

    class Worker:
        def state(self, session):
            return {"run": 1, "status": "running", "round": 1, "log_tail": ["a", "b"], "protection": {"mode": "plain"}}

    class Client:
        def __init__(self):
            self.sent = []

        def sync(self, reports):
            self.sent.append(reports)
            return {"instructions": []}

    client = Client()
    agent = Agent(client, Worker(), tmp_path)
    agent._save("s1", 1, {"x": 1})
    agent.step()
    agent.step()
    first, second = client.sent
    assert first[0]["log_tail"] == ["a", "b"] and first[0]["protection"] == {"mode": "plain"}
    assert "log_tail" not in second[0] and "protection" not in second[0]


class _FlakyController:
    """A controller client that records each first report and fails while ``fail`` is set."""

    def __init__(self):
        self.sent, self.fail = [], False

    def sync(self, reports):
        if self.fail:
            raise ConnectionError("controller away")
        self.sent.append(reports[0])
        return {"instructions": []}


def test_an_agent_sends_metrics_in_bounded_batches_and_again_for_a_new_run(tmp_path):
    from confide.agent import METRICS_PER_REPORT, Agent

    class Worker:
        run = 1

        def state(self, session):
            rows = [{"round": r, "loss": 1.0} for r in range(1, 2 * METRICS_PER_REPORT + 2)]
            return {"run": self.run, "status": "running", "round": len(rows), "metrics": rows, "protection": {"m": 1}}

    worker, client = Worker(), _FlakyController()
    agent = Agent(client, worker, tmp_path)
    agent._save("s1", 1, {"x": 1})
    agent.step()
    client.fail = True
    with pytest.raises(ConnectionError):
        agent.step()  # not acknowledged: the next heartbeat sends the same batch again
    client.fail = False
    agent.step()
    agent.step()
    batches = [[row["round"] for row in report.get("metrics", [])] for report in client.sent]
    assert [len(b) for b in batches] == [METRICS_PER_REPORT, METRICS_PER_REPORT, 1]
    assert batches[1][0] == METRICS_PER_REPORT + 1 and batches[2] == [2 * METRICS_PER_REPORT + 1]
    worker.run = 2  # a new run reports its protection and its rounds again
    agent.step()
    assert client.sent[-1]["protection"] == {"m": 1} and client.sent[-1]["metrics"][0]["round"] == 1


def test_an_agent_sends_a_checkpoint_again_when_the_sync_carrying_it_failed(tmp_path):
    # The soak found it: a controller killed while a heartbeat carried the last round's
    # checkpoint left the agent believing it delivered, and the session never completed.
    from confide.agent import Agent

    class Worker:
        def state(self, session):
            return {"run": 1, "status": "running", "round": 2}

    client = _FlakyController()
    agent = Agent(client, Worker(), tmp_path)
    agent._save("s1", 1, {"x": 1})

    def write_checkpoint(number: int) -> None:
        directory = agent.checkpoint_dir("s1") / f"round-{number:06d}"
        directory.mkdir(parents=True)
        (directory / "local.npz").write_bytes(bytes([number]))

    write_checkpoint(1)
    agent.step()
    write_checkpoint(2)
    client.fail = True
    with pytest.raises(ConnectionError):
        agent.step()
    client.fail = False
    agent.step()
    agent.step()
    rounds = [[c["round"] for c in report.get("checkpoints", [])] for report in client.sent]
    assert rounds == [[1], [2], []]


def test_audit_filters_run_in_the_database_and_match_literally(fed):
    controller = fed.c
    fed.register_party("site_a")
    fed.register_party("sitexa")
    fed.grant("site_a")
    fed.grant("sitexa")
    admin = Caller("root", "admin")
    grants = controller.audit(admin, action="gra", decision="allow")
    assert [e["target"] for e in grants] == ["site_a/records", "sitexa/records"]
    # "_" in a name is a literal, not LIKE's one-character wildcard.
    assert [e["target"] for e in controller.audit(Caller("site_a", "party"), action="grant")] == ["site_a/records"]
    assert [e["target"] for e in controller.audit(admin, target="e_a/")] == ["site_a/records"]
    assert controller.audit(admin, target="%") == []
    newest = controller.audit(admin, newest_first=True, limit=1)
    assert newest[0]["id"] == max(e["id"] for e in controller.audit(admin, limit=10_000))
    with pytest.raises(InvalidParameterError, match="target must be a string"):
        controller.audit(admin, target="x" * 300)


def test_owner_approves_a_job_that_waits_for_its_approval(console):
    controller = console["fed"].c
    controller.grant(Caller("hospital-a", "party"), dataset="records", developer="eve", approval=True)
    controller.grant(Caller("hospital-b", "party"), dataset="records", developer="eve")
    token = controller.submit(Caller("eve", "developer"), job(job_id="needs-approval"))["session"]
    assert controller.status(Caller("eve", "developer"), token)["state"] == "awaiting"
    owner, csrf = sign_in(console, "owner-a")
    uses = owner.get("/data").text
    assert re.search(r"needs-approval.*?pending.*?Approve", uses, re.S)
    assert owner.post(f"/jobs/{token}/approve", data={"csrf": "forged", "back": "/data"}).status_code == 403
    reply = owner.post(f"/jobs/{token}/approve", data={"csrf": csrf, "back": "//evil.example/"})
    assert reply.status_code == 303 and reply.headers["location"] == "/jobs"  # no open redirect
    assert controller.status(Caller("eve", "developer"), token)["state"] == "running"
    assert audit(console, action="approve", actor="hospital-a")[-1]["detail"]["account"] == "owner-a"


def test_console_commands_manage_accounts_and_tokens(tmp_path, monkeypatch, capsys):
    import io

    from confide.cli.main import main

    database = str(tmp_path / "controller.db")
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    assert (
        main(
            [
                "console",
                "user",
                "add",
                "ward",
                "--role",
                "owner",
                "--party",
                "hospital-a",
                "--password-stdin",
                "--db",
                database,
            ]
        )
        == 0
    )
    assert "account ward (owner of hospital-a) created" in capsys.readouterr().out
    assert main(["console", "user", "add", "ann", "--role", "developer", "--generate", "--db", database]) == 0
    generated = capsys.readouterr().out.split("password: ")[1].split()[0]
    assert main(["console", "token", "ann", "--label", "ci", "--db", database]) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("cft_")
    store = __import__("confide.controller.store", fromlist=["open_store"]).open_store(database)
    try:
        accounts = Accounts(store)
        assert accounts.token(token).caller == Caller("ann", "developer", account="ann")
        _cookie, who = accounts.sign_in("ann", generated, "127.0.0.1")
        assert who.name == "ann"
    finally:
        store.close()
    assert main(["console", "user", "disable", "ann", "--db", database]) == 0
    assert main(["console", "user", "list", "--db", database]) == 0
    listed = capsys.readouterr().out
    assert "ann" in listed and "(disabled)" in listed and "ward" in listed
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    assert main(["console", "user", "add", "bob", "--role", "developer", "--password-stdin", "--db", database]) == 2
    assert "password must be 12..1024 characters" in capsys.readouterr().err


def test_console_port_has_no_api_docs_and_caps_bodies(console):
    client = browser(console)
    for path in ("/docs", "/openapi.json", "/redoc"):
        assert client.get(path).status_code == 404
    reply = client.post("/signin", content=b"x" * (4 * 1024 * 1024 + 1), headers={"content-type": "text/plain"})
    assert reply.status_code == 413


def test_unknown_cookies_and_odd_names_do_not_write_the_audit_log_as_someone(console):
    before = len(audit(console))
    client = browser(console)
    client.cookies.set("__Host-confide_session", "made-up")
    reply = client.get("/jobs")
    assert reply.status_code == 303 and "__Host-confide_session=" in reply.headers.get("set-cookie", "")
    assert client.get("/v1/sessions", headers={"authorization": "Bearer cft_made_up"}).status_code == 403
    assert len(audit(console)) == before  # unknown credentials are refused, not audited
    form = client.get("/signin")
    token = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
    client.post("/signin", data={"csrf": token, "name": "=HYPERLINK(1)", "password": "whatever password"})
    assert audit(console, action="sign-in")[-1]["actor"] == "?"


def test_csv_cells_that_a_spreadsheet_would_run_are_neutralised():
    from confide.web.app import _cell

    assert [_cell(v) for v in ("=1+1", "+x", "-x", "@x", "fine", 7)] == ["'=1+1", "'+x", "'-x", "'@x", "fine", 7]


def test_a_live_stream_ends_when_its_session_does(console, monkeypatch):
    from confide.web import app as app_module

    granted(console)
    monkeypatch.setattr(app_module, "STREAM_RECHECK_S", 0.0)
    token = console["fed"].c.submit(Caller("dev", "developer"), job(job_id="stream-ends"))["session"]
    client, csrf = sign_in(console, "dev")
    other = browser(console)
    other.cookies.set("__Host-confide_session", client.cookies.get("__Host-confide_session"))
    events = []
    with client.stream("GET", f"/jobs/{token}/events") as stream:
        for line in stream.iter_lines():
            if line.startswith("event:"):
                events.append(line[6:].strip())
                if events == ["status"]:
                    assert other.post("/signout", data={"csrf": csrf}).status_code == 303
            if events and events[-1] == "problem":
                break
    assert events[0] == "status" and events[-1] == "problem"


def test_a_partys_shared_log_is_shown_to_the_developer_not_to_other_parties(console):
    granted(console)
    controller = console["fed"].c
    token = controller.submit(Caller("dev", "developer"), job(job_id="log-scope"))["session"]
    report = {"session": token, "run": 1, "status": "running", "round": 1, "log_tail": ["b's own line"]}
    report["protection"] = {"mode": "plain", "padding": "x" * 20_000}  # over the limit: dropped, sync still fine
    assert controller.sync(Caller("hospital-b", "party"), [report]) is not None
    metrics = controller.metrics(Caller("dev", "developer"), token)
    assert {p["name"]: p["protection"] for p in metrics["participants"]}["hospital-b"] is None
    developer, _ = sign_in(console, "dev")
    assert "b&#39;s own line" in developer.get(f"/jobs/{token}").text
    owner_a, _ = sign_in(console, "owner-a")
    assert "b&#39;s own line" not in owner_a.get(f"/jobs/{token}").text
    owner_b, _ = sign_in(console, "owner-b")
    assert "b&#39;s own line" in owner_b.get(f"/jobs/{token}").text


def test_a_console_certificate_that_cannot_be_used_stops_the_controller_from_starting(tmp_path):
    from confide.errors import CertificateError

    init_federation(tmp_path / "certs", parties=["hospital-a"])
    (tmp_path / "bad.crt").write_text("not a certificate")
    with pytest.raises(CertificateError, match="console's TLS certificate"):
        ControllerServer(
            certs_dir=tmp_path / "certs",
            name="controller",
            database=f"sqlite:///{tmp_path / 'c.db'}",
            console_address="127.0.0.1:0",
            console_app=create_console_app,
            console_cert=str(tmp_path / "bad.crt"),
        )


def test_the_unknown_name_stand_in_is_hashed_when_the_console_starts_and_never_by_the_cli(console):
    server = console["server"]
    cli_accounts = Accounts(server.store)  # what `confide console user ...` builds
    assert cli_accounts._dummy_hash is None  # administration pays no argon2id hash
    app_accounts = Accounts(server.store)
    create_console_app(server.controller, app_accounts)
    # Ready before the first request: an unknown name's first sign-in costs what a known one's does.
    assert app_accounts._dummy_hash is not None
    with pytest.raises(PermissionDeniedError, match="wrong account name or password"):
        cli_accounts.sign_in("nobody-here", PASSWORD, "127.0.0.1")
    assert cli_accounts._dummy_hash is not None
