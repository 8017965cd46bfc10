"""The controller with real processes: controller (HTTPS + mTLS, SQLite), aggregator and party agents.

Covers the issue's end-to-end acceptance: access control through the CLI, tuning that pushes
minimal deltas which the parties apply, resume after every process is killed (same final model
as an uninterrupted run), a tampered checkpoint refused, and a controller restart that loses no
committed log entry.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from confide.controller.sessions import config_digest
from confide.errors import ConflictError, TransportUnavailableError
from confide.local import LocalDeployment
from tests.fixtures.cli import confide_cli as cli
from tests.fixtures.cli import interrupted_session, wait_for

PARTIES = ["hospital-a", "hospital-b", "hospital-c"]


def job(job_id: str, **overrides) -> dict:
    spec = {
        "job_id": job_id,
        "rounds": 8,
        "checkpoint_interval": 2,
        "seed": 11,
        "fl_data": {
            "label": "diagnosis",
            "participants": {p: {"dataset": "breast-cancer", "seed": 3} for p in PARTIES},
            "pipeline": [{"name": "scaled", "op": "scale", "params": {"method": "standard"}}],
        },
        "model": {"learning_rate": 0.3, "local_epochs": 1, "batch_size": 32},
        "protection": {"mode": "secagg", "share_timeout_s": 10.0},
        "transport": {"round_timeout_s": 20.0, "dropout_grace_s": 2.0, "reconnect_timeout_s": 10.0},
    }
    spec.update(overrides)
    return spec


def final_weights(deployment: LocalDeployment, token: str, run: int) -> dict[str, np.ndarray]:
    out = {}
    for party in deployment.parties:
        path = deployment.workdir / "parties" / party / "sessions" / token / f"run-{run}" / f"{party}.report.json"
        report = json.loads(path.read_text())
        assert report["status"] == "completed", report.get("error")
        out[party] = np.asarray(report["weights"])
    return out


@pytest.fixture
def deployment(tmp_path):
    d = LocalDeployment(tmp_path / "deploy", parties=list(PARTIES))
    d.start()
    try:
        yield d
    finally:
        d.stop()


def test_submit_without_grant_is_refused_and_audited_then_runs_once_granted(deployment, tmp_path):
    spec_path = tmp_path / "job.json"
    spec_path.write_text(json.dumps(job("acl-job", rounds=3)))
    refused = cli(deployment, "alice", "job", "submit", str(spec_path))
    assert refused.returncode == 2
    assert "no grant for dataset hospital-a/breast-cancer" in refused.stderr
    assert "alice" in refused.stderr

    audit = cli(deployment, "runner", "audit", "--json")
    events = json.loads(audit.stdout)
    denied = [e for e in events if e["action"] == "submit" and e["decision"] == "deny"]
    assert denied and denied[-1]["actor"] == "alice"
    assert {c["dataset"] for c in denied[-1]["detail"]["checks"]} == {f"{p}/breast-cancer" for p in PARTIES}

    for party in PARTIES:
        granted = cli(deployment, party, "grant", "add", "--dataset", "breast-cancer", "--developer", "alice")
        assert granted.returncode == 0, granted.stderr
    # Another developer still has no access.
    assert cli(deployment, "bob", "job", "submit", str(spec_path)).returncode == 2
    done = cli(deployment, "alice", "job", "submit", str(spec_path), "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "completed" in done.stdout
    listed = cli(deployment, "alice", "data", "list")
    assert "hospital-b" in listed.stdout and "breast-cancer" in listed.stdout
    # The columns and their types, without --json.
    assert "hospital-b/breast-cancer: " in listed.stdout and " float" in listed.stdout


def test_tuning_pushes_only_the_changed_setting_and_parties_apply_it(deployment):
    deployment.grant_all("alice")
    with deployment.client("alice") as alice:
        token = alice.submit(job("tune-job", rounds=6))["session"]
        deployment.wait_session(token, "alice")
        tuned = cli(deployment, "alice", "job", "tune", token, "--set", "model.learning_rate=0.05")
        assert tuned.returncode == 0, tuned.stderr
        assert "pushed to hospital-a (1 change), hospital-b (1 change), hospital-c (1 change)" in tuned.stdout
        entry = alice.log(token)[-1]
        assert entry["kind"] == "tune"
        # Only the parties' configurations changed, each in exactly the tuned leaf; nothing for the aggregator.
        assert sorted(entry["deltas"]) == PARTIES
        for ops in entry["deltas"].values():
            assert ops == [{"op": "set", "path": ["spec", "model", "learning_rate"], "value": 0.05}]
        # More rounds concern the aggregator too (it checkpoints the last round), and only that leaf.
        base = entry["seq"]
        more = alice.tune(token, settings={"rounds": 8}, base_seq=base)
        assert more["deltas"]["aggregator"] == [{"op": "set", "path": ["rounds"], "value": 8}]
        assert all(more["deltas"][p] == [{"op": "set", "path": ["spec", "rounds"], "value": 8}] for p in PARTIES)
        # A tuning based on an older entry lost the race: refused, nothing stored.
        with pytest.raises(ConflictError, match="changed concurrently"):
            alice.tune(token, settings={"model.l2": 0.1}, base_seq=base)
        assert [e["seq"] for e in alice.log(token) if e["kind"] == "tune"] == [base, more["seq"]]
        # The tuned session is completed: resume trains rounds 7-8 with the new settings.
        assert alice.resume(token)["resume_round"] == 6
        status = deployment.wait_session(token, "alice")
        assert status["state"] == "completed", status
        printed = cli(deployment, "alice", "session", "log", token)
        assert "set spec.model.learning_rate 0.05" in printed.stdout
        assert "Merkle root" in printed.stdout
        head = alice.entry(token, status["head_seq"])
    for party in PARTIES:
        stored = json.loads((deployment.workdir / "parties" / party / "sessions" / token / "config.json").read_text())
        assert stored["config"]["spec"]["model"]["learning_rate"] == 0.05
        assert config_digest(stored["config"]) == config_digest(head["configs"][party])
        report = json.loads(
            (deployment.workdir / "parties" / party / "sessions" / token / "run-2" / f"{party}.report.json").read_text()
        )
        assert [r["round"] for r in report["rounds"]] == [7, 8]
    # The aggregator received no delta for this tuning: its configuration is unchanged.
    aggregator = json.loads((deployment.workdir / "aggregator-state" / "sessions" / token / "config.json").read_text())
    assert config_digest(aggregator["config"]) == config_digest(head["configs"]["aggregator"])


def test_resume_after_killing_every_process_reaches_the_uninterrupted_model(deployment):
    deployment.grant_all("alice")
    with deployment.client("alice") as alice:
        reference = alice.submit(job("reference"))["session"]
        assert deployment.wait_session(reference, "alice")["state"] == "completed"
    expected = final_weights(deployment, reference, 1)

    # The same job again, slowed down so that it can be killed mid-way (every process: SIGKILL).
    token = interrupted_session(deployment, "alice", job("interrupted"), after_round=4, delay_s=0.6, timeout_s=120)

    # Tamper with one file of the last recorded checkpoint: the resume must refuse it.
    with deployment.client("alice") as alice:
        recorded = alice.status(token)["checkpoint"]
        round_dir = (
            deployment.workdir
            / "parties"
            / "hospital-b"
            / "sessions"
            / token
            / "checkpoints"
            / f"round-{recorded['round']:06d}"
        )
        original = (round_dir / "weights.npz").read_bytes()
        tampered = bytearray(original)
        tampered[-1] ^= 0x01
        (round_dir / "weights.npz").write_bytes(bytes(tampered))
        alice.resume(token)
        refused = deployment.wait_session(token, "alice", states=("refused", "running", "completed"), timeout_s=60)
        assert refused["state"] == "refused", refused
        assert f"hospital-b/round-{recorded['round']:06d}/weights.npz: changed" in refused["message"]
        assert recorded["root"][:16] in refused["message"]

        # Restored: the resume verifies the root and finishes the job.
        (round_dir / "weights.npz").write_bytes(original)
        resumed = cli(deployment, "alice", "job", "resume", token, "--wait")
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        status = alice.status(token)
        assert status["state"] == "completed"
        run = status["run"]
    got = final_weights(deployment, token, run)
    for party in PARTIES:
        report = json.loads(
            (
                deployment.workdir / "parties" / party / "sessions" / token / f"run-{run}" / f"{party}.report.json"
            ).read_text()
        )
        assert report["resumed_after_round"] == recorded["round"]
        # secagg sums integers exactly: the resumed model is bit-for-bit the uninterrupted one.
        np.testing.assert_array_equal(got[party], expected[party])


def test_controller_killed_mid_tuning_loses_no_acknowledged_entry(deployment):
    deployment.grant_all("alice")
    with deployment.client("alice") as alice:
        token = alice.submit(job("durable", rounds=2))["session"]
        deployment.wait_session(token, "alice")
    acknowledged: list[tuple[int, float]] = []
    stop = threading.Event()

    def tune_forever():
        with deployment.client("alice") as client:
            value = 0.0
            while not stop.is_set():
                value += 0.001
                try:
                    answer = client.tune(token, settings={"model.l2": round(value, 3)})
                    acknowledged.append((answer["seq"], round(value, 3)))
                except (TransportUnavailableError, ConflictError):
                    time.sleep(0.01)

    thread = threading.Thread(target=tune_forever)
    thread.start()
    wait_for(lambda: len(acknowledged) >= 15, 60, "15 acknowledged tunings")
    deployment.children.kill("controller")  # SIGKILL to its process group
    time.sleep(0.5)
    stop.set()
    thread.join()
    deployment.start_controller()
    with deployment.client("alice") as alice:
        log = {e["seq"]: e for e in alice.log(token)}
        for seq, value in acknowledged:
            assert seq in log, f"acknowledged entry {seq} lost"
            assert log[seq]["note"] == f"model.l2={value!r}"
        assert sorted(log) == list(range(1, len(log) + 1))  # no gaps, no duplicates


def test_bad_specs_are_refused_with_the_field_named(deployment, tmp_path):
    deployment.grant_all("alice")
    bad = job("bad", rounds=0)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    refused = cli(deployment, "alice", "job", "submit", str(path))
    assert refused.returncode == 2 and "rounds" in refused.stderr
    unknown = job("unknown-party")
    unknown["fl_data"]["participants"]["clinic-z"] = {"dataset": "breast-cancer"}
    path.write_text(json.dumps(unknown))
    refused = cli(deployment, "alice", "job", "submit", str(path))
    assert refused.returncode == 2 and "clinic-z" in refused.stderr
    assert cli(deployment, "alice", "job", "list").stdout.strip() == "(none)"


def test_a_party_added_by_tuning_joins_from_the_checkpoint(deployment):
    deployment.grant_all("alice")
    # The added party's process starts while the others wait at round 5: on a loaded machine (the
    # parallel phase) it took more than 20 s once to start, connect and send.
    spec = job(
        "grow",
        rounds=4,
        metrics=["loss", "auc", "accuracy"],
        transport={"round_timeout_s": 60.0, "dropout_grace_s": 2.0, "reconnect_timeout_s": 10.0},
    )
    spec["fl_data"]["participants"].pop("hospital-c")
    with deployment.client("alice") as alice:
        token = alice.submit(spec)["session"]
        assert deployment.wait_session(token, "alice")["state"] == "completed"
        tuned = alice.tune(token, settings={"rounds": 6}, add_parties={"hospital-c": {"dataset": "breast-cancer"}})
        # The new party gets its whole configuration; the others only what changed for them.
        assert tuned["deltas"]["hospital-c"][0]["path"] == []
        routing = tuned["deltas"]["hospital-c"][0]["value"]["routing"]
        assert routing == alice.entry(token, 1)["configs"]["hospital-a"]["routing"]  # the same routes
        changed = {tuple(op["path"]) for op in tuned["deltas"]["hospital-a"]}
        assert ("spec", "rounds") in changed and ("spec", "parties") in changed
        assert alice.resume(token)["resume_round"] == 4
        status = deployment.wait_session(token, "alice")
        assert status["state"] == "completed", status
        run = status["run"]
    weights = final_weights(deployment, token, run)
    assert sorted(weights) == PARTIES
    joined = json.loads(
        (
            deployment.workdir / "parties" / "hospital-c" / "sessions" / token / f"run-{run}" / "hospital-c.report.json"
        ).read_text()
    )
    assert joined["bootstrap"]["joining"] == ["hospital-c"]
    # metrics: [loss, auc, accuracy] were asked for; every round reports them.
    assert all("test_auc" in r and 0.5 < r["test_accuracy"] <= 1.0 for r in joined["rounds"])
    assert [r["round"] for r in joined["rounds"]] == [5, 6]
    # The joiner received the checkpointed model through the secagg aggregation (fixed point), so it
    # ends where the others do, to that precision.
    np.testing.assert_allclose(weights["hospital-c"], weights["hospital-a"], atol=1e-6)
    np.testing.assert_array_equal(weights["hospital-a"], weights["hospital-b"])
