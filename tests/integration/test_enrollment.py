"""Per-site enrollment with real processes: a new hospital makes its own key, the operator signs its
request, and it joins the running federation (controller, aggregator, a job) with the CA unchanged.
A site with its own CA, or a forged request, gets nowhere."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from confide.local import LocalDeployment


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "confide", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def as_identity(deployment: LocalDeployment, certs, name: str) -> dict:
    return {"CONFIDE_CONTROLLER": deployment.url, "CONFIDE_CERTS": str(certs), "CONFIDE_IDENTITY": name}


@pytest.fixture
def deployment(tmp_path):
    d = LocalDeployment(tmp_path / "deploy", parties=["hospital-a", "hospital-b"], developers=["alice"])
    d.start()
    try:
        yield d
    finally:
        d.stop()


def test_a_site_enrolled_by_csr_joins_a_running_federation(deployment, tmp_path):
    site = tmp_path / "hospital-d" / "certs"
    ca_before = (deployment.certs / "ca.crt").read_bytes()
    requested = run("certs", "request", "--dir", str(site), "--name", "hospital-d")
    assert requested.returncode == 0, requested.stderr
    assert (site / "hospital-d.key").exists() and not (deployment.certs / "hospital-d.key").exists()

    # The operator signs; a forged copy of the request is refused first.
    pem = (site / "hospital-d.csr").read_bytes()
    der = x509.load_pem_x509_csr(pem).public_bytes(serialization.Encoding.DER).replace(b"hospital-d", b"hospital-a")
    forged = tmp_path / "forged.csr"
    forged.write_bytes(
        b"-----BEGIN CERTIFICATE REQUEST-----\n" + base64.encodebytes(der) + b"-----END CERTIFICATE REQUEST-----\n"
    )
    refused = run("certs", "sign", str(forged), "--ca-dir", str(deployment.certs), "--role", "party", "--out", "x")
    assert refused.returncode == 2 and "forged or altered" in refused.stderr and "Traceback" not in refused.stderr
    signed = run(
        "certs", "sign", str(site / "hospital-d.csr"), "--ca-dir", str(deployment.certs), "--role", "party",
        "--out", str(site),
    )  # fmt: skip
    assert signed.returncode == 0, signed.stderr
    assert (deployment.certs / "ca.crt").read_bytes() == ca_before  # the CA was not replaced

    # The new site's agent, with its own certificate directory, joins the running federation.
    catalog = tmp_path / "hospital-d" / "catalog.yaml"
    catalog.write_text(
        yaml.safe_dump({"datasets": {"breast-cancer": {"source": "breast_cancer", "shard": 1, "of": 2}}})
    )
    since = time.monotonic()
    deployment.children.spawn(
        "agent-hospital-d",
        [
            "agent", "--controller", deployment.url, "--certs", str(site), "--name", "hospital-d",
            "--workdir", str(tmp_path / "hospital-d" / "work"), "--datasets", str(catalog), "--interval", "0.5",
        ],
    )  # fmt: skip
    deployment.parties.append("hospital-d")
    deployment.wait_registered(since=since)
    for party, certs in (("hospital-a", deployment.certs), ("hospital-d", site)):
        granted = run(
            "grant", "add", "--dataset", "breast-cancer", "--developer", "alice",
            env=as_identity(deployment, certs, party),
        )  # fmt: skip
        assert granted.returncode == 0, granted.stderr
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "job_id": "with-d",
                "rounds": 3,
                "fl_data": {
                    "label": "diagnosis",
                    "participants": {p: {"dataset": "breast-cancer"} for p in ("hospital-a", "hospital-d")},
                    "pipeline": [{"name": "scaled", "op": "scale", "params": {"method": "standard"}}],
                },
                "protection": {"mode": "secagg"},
            }
        )
    )
    done = run("job", "submit", str(job), "--wait", env=as_identity(deployment, deployment.certs, "alice"))
    assert done.returncode == 0 and "completed" in done.stdout, done.stdout + done.stderr


def test_a_site_with_its_own_ca_is_refused(deployment, tmp_path):
    rogue = tmp_path / "rogue"
    made = run("certs", "init", "--dir", str(rogue), "--parties", "hospital-a", "--services", "")
    assert made.returncode == 0, made.stderr
    # It claims to be hospital-a, with a certificate its own CA signed.
    listed = run("data", "list", env=as_identity(deployment, rogue, "hospital-a"))
    assert listed.returncode == 2 and "Traceback" not in listed.stderr
    granted = run(
        "grant", "add", "--dataset", "breast-cancer", "--developer", "alice",
        env=as_identity(deployment, rogue, "hospital-a"),
    )  # fmt: skip
    assert granted.returncode == 2
    with deployment.client("runner") as client:
        assert not [g for g in client.grants() if g["developer"] == "alice"]
