"""deploy/systemd: the units systemd itself accepts, whose command lines the CLI parses, as a dedicated user."""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from confide.cli.main import _parser

SYSTEMD = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
UNITS = sorted(SYSTEMD.glob("*.service"))
INSTALLED = "/opt/confide/.venv/bin/confide"


def _unit(path: Path) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read_string(path.read_text())
    return unit


def _environment(unit: configparser.ConfigParser) -> dict[str, str]:
    """The variables of the unit's example environment file (deploy/systemd/<role>.env.example)."""
    name = Path(unit["Service"]["EnvironmentFile"]).name
    lines = (SYSTEMD / f"{name}.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_there_is_a_unit_per_service_role():
    assert [u.name for u in UNITS] == [
        "confide-agent.service",
        "confide-aggregator.service",
        "confide-controller.service",
    ]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.stem)
def test_systemd_verifies_the_unit_without_a_warning(tmp_path, path):
    # verify checks the command exists: point it at this environment's confide, nothing else changes
    confide = Path(sys.executable).with_name("confide")
    copy = tmp_path / path.name
    copy.write_text(path.read_text().replace(INSTALLED, str(confide)))
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    # and it would say so: a misspelt key is a warning there, which fails this test
    broken = tmp_path / f"broken-{path.name}"
    broken.write_text(copy.read_text().replace("Restart=", "Restrat="))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(broken)], capture_output=True, text=True)
    assert "Unknown key 'Restrat'" in done.stderr


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.stem)
def test_the_unit_runs_as_the_dedicated_user_after_the_network_and_its_command_parses(path):
    unit = _unit(path)
    assert unit["Service"]["User"] == "confide" and unit["Service"]["Group"] == "confide"
    assert "network-online.target" in unit["Unit"]["After"] and "network-online.target" in unit["Unit"]["Wants"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    assert unit["Service"]["NoNewPrivileges"] == "yes" and unit["Service"]["ProtectSystem"] == "strict"
    command = unit["Service"]["ExecStart"].replace("\\\n", " ")
    environment = _environment(unit)
    used = set(re.findall(r"\$\{([A-Z_]+)\}", command))
    assert used <= set(environment), f"{path.name} uses {sorted(used - set(environment))} its example does not set"
    words = shlex.split(re.sub(r"\$\{([A-Z_]+)\}", lambda m: environment[m.group(1)], command))
    assert words[0] == INSTALLED
    args = _parser().parse_args(words[1:])  # a flag the CLI lacks exits here
    assert args.command == path.stem.removeprefix("confide-")
    assert "CONFIDE_METRICS" in environment, "the example turns the metrics listener on"


def test_the_dedicated_user_is_made_by_sysusers_without_a_login():
    lines = [line for line in (SYSTEMD / "confide.sysusers.conf").read_text().splitlines() if line and line[0] != "#"]
    assert len(lines) == 1
    kind, name, _, _, home, shell = shlex.split(lines[0])
    assert (kind, name, home, shell) == ("u", "confide", "/var/lib/confide", "/usr/sbin/nologin")
