"""Three hospitals with their own CSVs, deployed as separate processes (controller, aggregator, agents).

The walkthrough of examples/hospital_csv: text and missing values in the files, a model each
hospital can use, a data owner's revocation that stops a running job at the next round boundary
(checked at the party), and party failures that reach the developer without a value in them.
"""

from __future__ import annotations

import csv
import json
import shutil
import time
from pathlib import Path

import pytest

from confide.local import LocalDeployment
from tests.fixtures.cli import confide_cli as cli
from tests.fixtures.cli import wait_for as _wait
from tests.fixtures.faults import with_faults

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hospital_csv"
PARTIES = ["hospital-a", "hospital-b", "hospital-c"]


def _copy_sites(root: Path, delimiter_c: str = "auto") -> dict[str, dict]:
    catalogs = {}
    for party in PARTIES:
        shutil.copytree(EXAMPLE / party, root / party)
        entry = {"source": "csv", "path": str(root / party / "patients.csv"), "description": f"{party} patients"}
        if party == "hospital-c":
            entry["delimiter"] = delimiter_c
        catalogs[party] = {"datasets": {"patients": entry}}
    return catalogs


def _job(root: Path, job_id: str, rounds: int, **changes) -> Path:
    text = (EXAMPLE / "job.yaml").read_text()
    text = text.replace("job_id: flc-mortality", f"job_id: {job_id}").replace("rounds: 30", f"rounds: {rounds}")
    for old, new in changes.items():
        text = text.replace(old, new)
    path = root / f"{job_id}.yaml"
    path.write_text(text)
    return path


def _report(deployment: LocalDeployment, party: str, token: str, run: int = 1) -> dict:
    path = deployment.workdir / "parties" / party / "sessions" / token / f"run-{run}" / f"{party}.report.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@pytest.fixture
def hospitals(tmp_path):
    catalogs = _copy_sites(tmp_path)
    # Each round pauses 0.3 s at every party, so a revocation lands mid-job.
    d = LocalDeployment(
        tmp_path / "deploy",
        parties=list(PARTIES),
        developers=["alice"],
        catalogs=catalogs,
        extra_env={**with_faults(round_delay_s=0.3), "CONFIDE_STOP_GRACE_S": "5"},
    )
    d.start()
    try:
        for party in PARTIES:
            granted = cli(d, party, "grant", "add", "--dataset", "patients", "--developer", "alice")
            assert granted.returncode == 0, granted.stderr
        yield d, tmp_path
    finally:
        d.stop()


def test_csv_federation_trains_a_usable_model_and_a_revocation_stops_use(hospitals):
    deployment, root = hospitals
    # 1. The walkthrough job: own CSVs (NA / empty / NULL markers, a ';' file, a text column).
    done = cli(deployment, "alice", "job", "submit", str(_job(root, "flc-short", 10)), "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    token = done.stdout.split()[1]
    status = json.loads(cli(deployment, "alice", "job", "status", token, "--json").stdout)
    assert status["state"] == "completed"
    assert all(p["result"]["test_auc"] > 0.65 for p in status["participants"] if p["role"] == "party")
    aggregate = status["evaluation"]["aggregate"]  # the final model on every hospital's held-out rows
    assert aggregate["parties"] == 3 and aggregate["test_samples"] == 1575 and aggregate["test_auc"] > 0.65
    shown = cli(deployment, "alice", "job", "status", token)
    assert "final model on every party's held-out rows: AUC" in shown.stdout
    # The model artifact: where the docs say, bound to the session's recorded checkpoint.
    artifact = deployment.workdir / "parties" / "hospital-a" / "sessions" / token / "run-1" / "hospital-a.model.zip"
    shown = cli(deployment, "hospital-a", "model", "show", str(artifact), "--json")
    manifest = json.loads(shown.stdout)
    assert manifest["session"] == token and manifest["features"][1:3] == ["sex=F", "sex=M"]
    log = json.loads(cli(deployment, "alice", "session", "log", token, "--json").stdout)
    last = [e for e in log if e["checkpoint"]][-1]
    entry = json.loads(cli(deployment, "alice", "session", "log", token, "--entry", str(last["seq"])).stdout)
    leaves = {leaf["name"]: leaf["sha256"] for leaf in entry["checkpoint"]["leaves"]["hospital-a"]}
    assert leaves[manifest["checkpoint"]["name"]] == manifest["checkpoint"]["sha256"]
    scored = cli(deployment, "hospital-a", "model", "predict", str(artifact), str(root / "hospital-a" / "patients.csv"))
    assert scored.returncode == 0 and len(scored.stdout.splitlines()) == 2626  # header + every patient

    # 2. A long job; hospital-b revokes alice's grant while it runs.
    submitted = cli(deployment, "alice", "job", "submit", str(_job(root, "flc-long", 300)))
    assert submitted.returncode == 0, submitted.stderr
    long_token = submitted.stdout.split()[1]
    _wait(lambda: len(_report(deployment, "hospital-b", long_token).get("rounds", [])) >= 3, 120, "round 3")
    revoked = cli(deployment, "hospital-b", "grant", "revoke", "--dataset", "patients", "--developer", "alice")
    at_revoke = len(_report(deployment, "hospital-b", long_token)["rounds"])
    assert revoked.returncode == 0 and long_token in revoked.stdout, revoked.stdout + revoked.stderr
    final = deployment.wait_session(long_token, "alice", timeout_s=60)
    assert final["state"] == "revoked" and "hospital-b revoked alice's grant" in final["message"]

    # Checked at the party: it stopped at a round boundary, by its own check, and trains no more.
    stopped = _wait(
        lambda: (r := _report(deployment, "hospital-b", long_token)).get("status") == "stopped" and r, 30, "stop"
    )
    assert stopped["failure"]["stage"] == "access" and stopped["failure"]["error"] == "DataAccessRevokedError"
    trained = len(stopped["rounds"])
    assert trained <= at_revoke + 2  # the round in flight, and one more before the agent's sync delivered it
    time.sleep(2.0)
    assert len(_report(deployment, "hospital-b", long_token)["rounds"]) == trained
    # Every party of the session ends 'stopped' (at its boundary, or ended mid-round by its agent
    # after the grace when its peers stopped first), none more than a round past the revocation.
    for party in PARTIES:
        ended = _wait(
            lambda p=party: (r := _report(deployment, p, long_token)).get("status") == "stopped" and r, 30, party
        )
        assert len(ended["rounds"]) <= at_revoke + 2 and ended["failure"]["error"] in (
            "DataAccessRevokedError",
            "RunStoppedError",
        )
    assert stopped["rounds"][-1]["round"] == stopped["failed_round"] - 1  # refused before training its next round

    # Resume and tune are refused while the grant is revoked.
    resumed = cli(deployment, "alice", "job", "resume", long_token)
    assert resumed.returncode == 2 and "revoked by hospital-b" in resumed.stderr
    assert not (deployment.workdir / "parties" / "hospital-b" / "sessions" / long_token / "run-2").exists()

    # 3. The owner sees every use of its data, and its audit view shows who asked.
    uses = json.loads(cli(deployment, "hospital-b", "data", "uses", "--json").stdout)
    assert {(u["job_id"], u["developer"], u["state"]) for u in uses} == {
        ("flc-short", "alice", "completed"),
        ("flc-long", "alice", "revoked"),
    }
    assert uses[0]["pipeline"][0] == {"name": "sex", "op": "encode"}
    listed = cli(deployment, "hospital-b", "job", "list")
    assert token in listed.stdout and long_token in listed.stdout
    audit = json.loads(cli(deployment, "hospital-b", "audit", "--json").stdout)
    assert any(e["action"] == "use:resume-access" and e["decision"] == "deny" for e in audit)
    assert any(e["action"] == "stop-session" and e["detail"]["session"] == long_token for e in audit)


def _rewrite(path: Path, change, delimiter: str = ",") -> None:
    with path.open(newline="") as f:
        dialect = csv.Sniffer().sniff(f.read(4096), delimiters=",;")
        f.seek(0)
        rows = list(csv.reader(f, dialect))
    rows = change(rows)
    with path.open("w", newline="") as f:
        csv.writer(f, delimiter=delimiter).writerows(rows)


@pytest.fixture
def strict_c(tmp_path):
    """hospital-c's file comma-separated and declared so; the faults come after its agent published it."""
    catalogs = _copy_sites(tmp_path, delimiter_c=",")
    original = tmp_path / "hospital-c" / "patients.csv"
    _rewrite(original, lambda rows: rows)
    d = LocalDeployment(tmp_path / "deploy", parties=list(PARTIES), developers=["alice"], catalogs=catalogs)
    d.start()
    try:
        for party in PARTIES:
            assert cli(d, party, "grant", "add", "--dataset", "patients", "--developer", "alice").returncode == 0
        yield d, tmp_path
    finally:
        d.stop()


def _text_kappa(rows):
    index = rows[0].index("kappa")
    return [rows[0]] + [[*r[:index], f"SECRET-{i % 3}", *r[index + 1 :]] for i, r in enumerate(rows[1:])]


def _renamed_creatinine(rows):
    return [["creat" if c == "creatinine" else c for c in rows[0]], *rows[1:]]


def _missing_age(rows):
    return [rows[0]] + [["NULL" if i % 7 == 0 else r[0], *r[1:]] for i, r in enumerate(rows[1:])]


CASES = [
    ("text", _text_kappa, ",", "column 'kappa' is text", "add an encode step", ["kappa"]),
    (
        "missing-column",
        _renamed_creatinine,
        ",",
        "column 'creatinine' is not in the table",
        "check the column",
        ["creatinine"],
    ),
    ("nan", _missing_age, ",", "feature column 'age' has 375 missing values", "add an impute step", ["age"]),
    ("semicolon", lambda rows: rows, ";", "looks ';'-separated", "delimiter", []),
]


def test_party_failures_reach_the_developer_with_the_reason_and_no_values(strict_c):
    deployment, root = strict_c
    path = root / "hospital-c" / "patients.csv"
    clean = path.read_bytes()
    for name, change, delimiter, reason, hint, columns in CASES:
        _rewrite(path, change, delimiter)
        # The published schema is the old one: the submit-time check passes, the party finds out.
        submitted = cli(deployment, "alice", "job", "submit", str(_job(root, f"flc-{name}", 5)), "--wait")
        assert submitted.returncode == 1, submitted.stdout + submitted.stderr
        token = submitted.stdout.split()[1]
        shown = cli(deployment, "alice", "job", "status", token)
        assert "failed" in shown.stdout and "hospital-c failed before its first round (data" in shown.stdout
        assert reason in shown.stdout and hint in shown.stdout, shown.stdout
        assert "gone" not in shown.stdout and "exited with code" not in shown.stdout
        logged = cli(deployment, "alice", "session", "log", token)
        assert "failed by controller: hospital-c failed" in logged.stdout and reason in logged.stdout
        status = json.loads(cli(deployment, "alice", "job", "status", token, "--json").stdout)
        [c] = [p for p in status["participants"] if p["name"] == "hospital-c"]
        assert c["failure"]["dataset"] == "patients" and c["failure"]["columns"] == columns
        text = json.dumps(status)
        assert "SECRET" not in text and "1.121" not in text  # no cell of the file travelled
        path.write_bytes(clean)

    # Once the hospital's agent publishes the changed schema, the submission itself is refused.
    _rewrite(path, _text_kappa)
    deployment.children.stop(["agent-hospital-c"])
    since = time.monotonic()
    deployment.start_agent("hospital-c")
    deployment.wait_registered(since=since)
    before = json.loads(cli(deployment, "alice", "job", "list", "--json").stdout)
    refused = cli(deployment, "alice", "job", "submit", str(_job(root, "flc-refused", 5)))
    assert refused.returncode == 2
    assert "hospital-c/patients, step 'logs': column 'kappa' is text" in refused.stderr
    assert json.loads(cli(deployment, "alice", "job", "list", "--json").stdout) == before  # nothing started
