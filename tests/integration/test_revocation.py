"""Revocation and rotation with real processes: a party revoked mid-job is cut off by the aggregator
and the controller within a second, the job finishes with the others; a rotated certificate works and
the old one is refused."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import grpc
import pytest

from confide.agent.client import ControllerClient
from confide.errors import CertificateRevokedError
from confide.local import LocalFederation
from confide.local.processes import Processes
from confide.transport import tls
from confide.transport.certs import CRL_FILE, Identity, init_federation
from confide.v1 import runtime_pb2 as pb
from confide.v1 import runtime_pb2_grpc as rpc
from tests.fixtures.faults import with_faults
from tests.fixtures.federation import run_local
from tests.fixtures.waiting import wait_for_round
from tests.integration.conftest import make_spec

#: One heartbeat interval of the agents (agent/follower.py), the bound the issue sets.
HEARTBEAT_S = 1.0


def confide(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "confide", *args], capture_output=True, text=True, timeout=60)


def health(port: int, identity: Identity) -> pb.HealthReply:
    channel = tls.channel(f"127.0.0.1:{port}", identity)
    try:
        return rpc.AggregationStub(channel).Health(pb.HealthRequest(), timeout=10, wait_for_ready=True)
    finally:
        channel.close()


def logged_at(log: Path, pattern: str, timeout_s: float = 10.0) -> float:
    """Wall-clock time of the first log line matching ``pattern`` (the lines start with asctime)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if re.search(pattern, line):
                stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                return stamp.timestamp()
        time.sleep(0.05)
    raise AssertionError(f"no line matching {pattern!r} in {log}")


@pytest.fixture
def controller(tmp_path):
    """A controller process serving the federation in ``tmp_path/job/certs`` (made here, with a controller)."""
    certs = tmp_path / "job" / "certs"
    init_federation(
        certs,
        parties=["hospital-a", "hospital-b", "hospital-c"],
        services=["aggregator", "controller"],
        admins=["runner"],
    )
    children = Processes(tmp_path / "controller-logs")
    children.spawn(
        "controller",
        [
            "controller",
            "--certs",
            str(certs),
            "--db",
            str(tmp_path / "controller.db"),
            "--listen",
            "127.0.0.1:0",
            "--port-file",
            str(tmp_path / "controller.port"),
        ],
    )
    try:
        port = children.wait_port("controller", tmp_path / "controller.port", 60)
        yield f"https://localhost:{port}", certs
    finally:
        children.stop()


def test_a_party_revoked_mid_job_is_dropped_and_refused_everywhere(tmp_path, controller):
    url, certs = controller
    workdir = certs.parent
    spec = make_spec(
        job_id="revoked-mid-job",
        rounds=12,
        protection={"mode": "secagg", "on_dropout": "retry", "min_parties": 2},
    )
    paced = with_faults(round_delay_s=0.4)  # rounds slow enough to revoke in the middle of the job
    outcome: dict = {}

    def job() -> None:
        try:
            outcome["report"] = run_local(
                spec, workdir, progress=False, echo=lambda *_: None, party_env=dict.fromkeys(spec.parties, paced)
            )
        except BaseException as error:  # noqa: BLE001 - re-raised by the test thread
            outcome["error"] = error

    runner = threading.Thread(target=job)
    runner.start()
    try:
        report_a = workdir / "parties" / "hospital-a.report.json"
        wait_for_round(report_a, 3, 40, alive=runner.is_alive)
        port = int((workdir / "aggregator.port").read_text())
        old_identity = Identity.load(certs, "hospital-c")
        with ControllerClient(url, certs_dir=certs, name="hospital-c") as client:
            assert client.whoami()["name"] == "hospital-c"

        revoked = confide("certs", "revoke", "--dir", str(certs), "hospital-c", "--reason", "site closed")
        assert revoked.returncode == 0, revoked.stderr
        assert re.search(r"revoked party hospital-c: serial [0-9a-f]+", revoked.stdout)
        crl_written = os.stat(certs / CRL_FILE).st_mtime

        # The controller refuses it (every route) within one heartbeat interval, and audits that.
        with ControllerClient(url, certs_dir=certs, name="hospital-c") as client:
            while True:
                try:
                    client.whoami()
                except CertificateRevokedError as error:
                    controller_refused = time.time() - crl_written
                    assert "hospital-c" in str(error) and "revoked" in str(error)
                    break
                assert time.time() - crl_written < 5, "the controller still accepts the revoked certificate"
                time.sleep(0.02)
        # New calls to the aggregator: refused with UNAUTHENTICATED (CertificateRevokedError at a client).
        while True:
            try:
                health(port, old_identity)
            except grpc.RpcError as error:
                aggregator_refused = time.time() - crl_written
                assert error.code() == grpc.StatusCode.UNAUTHENTICATED and "revoked" in error.details()
                break
            assert time.time() - crl_written < 5, "the aggregator still accepts the revoked certificate"
            time.sleep(0.02)
        assert health(port, Identity.load(certs, "hospital-a")).name == "aggregator"
    finally:
        runner.join(timeout=120)
    assert "error" not in outcome, outcome.get("error")
    report = outcome["report"]

    # The job finished with the other two; the revoked party is a dropout, with the reason.
    rounds = report["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, 13))
    assert rounds[0]["participants"] == ["hospital-a", "hospital-b", "hospital-c"]
    assert rounds[-1]["participants"] == ["hospital-a", "hospital-b"]
    assert "CertificateRevokedError" in report["dropped"]["hospital-c"]
    assert "revoked" in report["dropped"]["hospital-c"]
    assert report["final_auc"] > 0.95

    # The aggregator cut its open calls within one heartbeat interval of the CRL being written.
    aggregator_log = workdir / "logs" / "aggregator.log"
    cut = logged_at(aggregator_log, r"cut the open calls of hospital-c \(serial [0-9a-f]+\)") - crl_written
    assert cut < HEARTBEAT_S, f"aggregator cut hospital-c {cut:.2f} s after the CRL was written"
    assert controller_refused < HEARTBEAT_S, f"controller refused hospital-c {controller_refused:.2f} s after"
    assert aggregator_refused < HEARTBEAT_S, f"aggregator refused a new call {aggregator_refused:.2f} s after"
    logged_at(aggregator_log, r"refused hospital-c \(serial [0-9a-f]+\): certificate revoked")
    print(
        f"\nCRL written -> open calls cut by the aggregator {cut:.3f} s; new call refused by the aggregator "
        f"{aggregator_refused:.3f} s, by the controller {controller_refused:.3f} s"
    )

    with ControllerClient(url, certs_dir=certs, name="runner") as admin:
        events = admin.audit(limit=1000)
    refusals = [e for e in events if e["action"] == "certificate.refused" and e["actor"] == "hospital-c"]
    assert refusals and refusals[0]["decision"] == "denied" and refusals[0]["detail"]["serial"]


def test_after_rotation_the_new_certificate_is_accepted_and_the_old_refused(tmp_path):
    spec = make_spec(job_id="rotation")
    federation = LocalFederation(spec, tmp_path)
    federation.prepare()
    try:
        port = federation.start_aggregator()
        old = Identity.load(federation.certs, "hospital-a")
        assert health(port, old).name == "aggregator"
        rotated = confide("certs", "rotate", "--dir", str(federation.certs), "--name", "hospital-a")
        assert rotated.returncode == 0, rotated.stderr
        assert (
            "issued a new certificate for hospital-a" in rotated.stdout and "revoked party hospital-a" in rotated.stdout
        )
        new = Identity.load(federation.certs, "hospital-a")
        assert new.cert_pem != old.cert_pem
        deadline = time.monotonic() + 5
        while True:
            try:
                health(port, old)
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.UNAUTHENTICATED and "superseded" in error.details()
                break
            assert time.monotonic() < deadline, "the old certificate is still accepted"
            time.sleep(0.05)
        assert health(port, new).name == "aggregator"
        unknown = confide("certs", "revoke", "--dir", str(federation.certs), "hospital-z")
        assert unknown.returncode == 2 and "name 'hospital-z' is not an identity this CA issued" in unknown.stderr
    finally:
        federation.stop()
