"""The ``confide`` command as a user runs it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from confide.errors import InvalidParameterError
from confide.protect import make_protection


def confide(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "confide", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def test_certs_init_makes_a_federation_and_refuses_to_overwrite_it(tmp_path):
    done = confide("certs", "init", "--dir", str(tmp_path / "certs"), "--parties", "hospital-a,hospital-b")
    assert done.returncode == 0, done.stderr
    for name in ("ca", "hospital-a", "hospital-b", "aggregator", "runner"):
        assert (tmp_path / "certs" / f"{name}.crt").exists()
    again = confide("certs", "init", "--dir", str(tmp_path / "certs"), "--parties", "hospital-a,hospital-b")
    assert again.returncode == 2
    assert "ca.crt" in again.stderr


def test_run_rejects_a_bad_job_file_naming_the_field(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("job_id: bad\nparties: [a, b]\nprotection: {mode: rot13}\nrounds: 0\n")
    done = confide("run", str(job), "--workdir", str(tmp_path / "work"))
    assert done.returncode == 2
    assert "protection.mode" in done.stderr and "rounds" in done.stderr


def test_run_trains_and_prints_the_report(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(
        "job_id: cli\nrounds: 3\nparties: [hospital-a, hospital-b]\n"
        "model: {learning_rate: 0.5, batch_size: 32}\nprotection: {mode: groupmask}\n"
    )
    done = confide("run", str(job), "--workdir", str(tmp_path / "work"), "--mode", "secagg")
    assert done.returncode == 0, done.stderr
    assert "round   3/3" in done.stdout
    assert "protection that ran: secagg" in done.stdout
    assert "sums verified by every party (integer); 0 attempt(s) refused" in done.stdout
    assert (tmp_path / "work" / "report.json").exists() and (tmp_path / "work" / "report.png").exists()


def test_unknown_mode_is_an_error_not_a_fallback():
    with pytest.raises(InvalidParameterError, match="mode must be one of"):
        make_protection("enclave-magic", exchange=None, params=None)


def test_running_the_same_job_twice_in_one_workdir_starts_afresh(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("job_id: twice\nrounds: 2\nparties: [hospital-a, hospital-b]\nprotection: {mode: paillier}\n")
    for _ in range(2):
        done = confide("run", str(job), "--workdir", str(tmp_path / "work"))
        assert done.returncode == 0, done.stderr
        assert "round   2/2" in done.stdout
