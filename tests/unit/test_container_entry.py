"""``confide container`` (confide.cli.container) without podman: the secret checks and the health probe.

tests/integration/test_containers.py runs the same entry point inside the image.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from confide.cli.container import AGENT_GRACE_S, check_secrets, refuse_ca_key
from confide.cli.main import main
from confide.errors import InvalidParameterError, MissingFileError
from confide.transport.certs import init_federation


@pytest.fixture
def federation(tmp_path):
    operator = tmp_path / "operator"
    init_federation(operator, parties=["hospital-a"], services=[], admins=[])
    site = tmp_path / "etc" / "certs"
    site.mkdir(parents=True)
    for name in ("hospital-a.crt", "hospital-a.key", "ca.crt"):
        shutil.copy(operator / name, site / name)
    return operator, site


def test_the_identity_and_ca_certificate_must_be_mounted(federation):
    _, site = federation
    check_secrets(site, "hospital-a", "agent")
    (site / "hospital-a.key").unlink()
    with pytest.raises(MissingFileError, match=r"the agent's secret is not mounted: .*hospital-a.key is missing"):
        check_secrets(site, "hospital-a", "agent")


def test_the_ca_key_is_refused_under_any_name_and_the_identitys_own_key_is_not(federation):
    operator, site = federation
    refuse_ca_key(site.parent, site)  # the site's own key is a private key too: not the CA's
    shutil.copy(operator / "ca.key", site.parent / "old-backup.pem")
    with pytest.raises(InvalidParameterError, match=r"CA's private key is mounted at .*old-backup.pem"):
        refuse_ca_key(site.parent, site)


def test_health_reads_what_run_wrote_and_an_agent_is_healthy_while_it_syncs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CONFIDE_RUN_DIR", str(tmp_path))
    assert main(["container", "health"]) == 1
    assert "the role has not started" in capsys.readouterr().err
    alive = tmp_path / "agent-alive"
    (tmp_path / "health.json").write_text(
        json.dumps({"role": "agent", "certs": "x", "name": "hospital-a", "alive_file": str(alive), "interval_s": 1})
    )
    assert main(["container", "health"]) == 1  # never synced
    alive.touch()
    assert main(["container", "health"]) == 0
    old = time.time() - (3 + AGENT_GRACE_S + 5)
    os.utime(alive, (old, old))
    assert main(["container", "health"]) == 1
    assert "no sync with the controller" in capsys.readouterr().err
