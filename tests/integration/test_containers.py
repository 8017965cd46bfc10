"""The federation as containers: the image (scripts/build-image.sh), compose and the Helm chart.

A controller, two aggregator nodes and three hospitals, each a container of the one image
(read-only, uid 10001, its own identity's secret mounted and nothing else of the operator's):

* ``podman-compose`` runs deploy/compose/compose.yaml: every identity enrolled by its own signing
  request, the hospitals grant, a job completes while the controller's container is killed and
  started again, then the operator revokes a hospital and the services refuse it;
* ``helm template`` renders deploy/helm/confide as the operator's release and one release per
  hospital, ``podman kube play`` runs them, and a job completes while an agent's container is
  killed and started again.

The image must have been built (`make image`, which `make test` runs first). Everything skips,
naming what is missing, where podman cannot run (not root, no podman) or helm was not built.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "build" / "containers" / "containers.conf"
HELM = ROOT / "build" / "helm" / "helm"
IMAGE = "localhost/confide:0.1.0"
HOSPITALS = ("hospital-a", "hospital-b", "hospital-c")
NODES = ("aggregator-1", "aggregator-2")
CONTROLLER = "https://127.0.0.1:8443"
UID = 10001

pytestmark = [pytest.mark.integration]


def _podman_problem() -> str | None:
    if os.geteuid() != 0:
        return "podman runs as root here (runc, cgroupfs) and this run is not root"
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/ensure-podman.sh installs it)"
    if not CONF.exists():
        return f"{CONF} is missing: scripts/ensure-podman.sh writes it"
    return None


PROBLEM = _podman_problem()
if PROBLEM:
    pytest.skip(PROBLEM, allow_module_level=True)


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONTAINERS_CONF": str(CONF)}
    result = subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def confide(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    """The host's CLI: the operator's tools and the developer's (neither runs in the federation's containers)."""
    result = subprocess.run(
        [sys.executable, "-m", "confide", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    if check and result.returncode != 0:
        raise AssertionError(f"confide {' '.join(args)}: {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def image() -> str:
    if podman("image", "exists", IMAGE, check=False).returncode != 0:
        pytest.fail(f"{IMAGE} is not built: run `make image` (make test builds it before the suite)")
    return IMAGE


def _enroll(operator: Path, directory: Path, name: str, role: str, hosts: str | None = None) -> None:
    request = ["certs", "request", "--dir", str(directory), "--name", name]
    if role != "party":
        request += ["--role", role]
    if hosts:
        request += ["--hosts", hosts]
    confide(*request)
    confide("certs", "sign", str(directory / f"{name}.csr"), "--ca-dir", str(operator), "--role", role,
            "--out", str(directory))  # fmt: skip


def _federation(base: Path) -> tuple[Path, Path]:
    """The operator's folder (CA only) and the deployment root compose.yaml describes, every identity enrolled."""
    operator, root = base / "operator", base / "root"
    confide("certs", "init", "--dir", str(operator), "--services", "", "--admins", "")
    for service in ("controller", *NODES):
        _enroll(operator, root / service / "certs", service, "service", hosts="localhost,127.0.0.1")
        (root / service / "state").mkdir(parents=True)
    for hospital in HOSPITALS:
        _enroll(operator, root / hospital / "certs", hospital, "party")
        shutil.copytree(ROOT / "examples" / "hospital_csv" / hospital, root / hospital / "data")
        (root / hospital / "work").mkdir()
    _enroll(operator, base / "alice", "alice", "developer")
    (root / "crl").mkdir()
    for path in [root, *root.rglob("*")]:
        os.chown(path, UID, UID)  # the image's user owns what it mounts
    assert not list(root.rglob("ca.key")), "the CA key must stay in the operator's folder"
    return operator, root


def _as(base: Path, name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    certs = base / "alice" if name == "alice" else base / "root" / name / "certs"
    return confide(*args, "--controller", CONTROLLER, "--certs", str(certs), "--as", name, check=check)


def _wait(what: str, ready, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(1.0)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def _healthy(container: str) -> bool:
    return podman("healthcheck", "run", container, check=False).returncode == 0


def _logs(containers) -> str:
    return "\n".join(f"--- {c}\n{podman('logs', '--tail', '30', c, check=False).stdout[-3000:]}" for c in containers)


def _run_job(base: Path, containers: list[str], kill: str) -> dict:
    """Grants, a job, ``kill`` killed and started again at round 2; returns the final status."""
    _wait("every container healthy", lambda: all(_healthy(c) for c in containers))

    def published() -> set[str]:
        listed = _as(base, "alice", "data", "list", "--json", check=False)
        return {d["owner"] for d in json.loads(listed.stdout)} if listed.returncode == 0 else set()

    _wait("the hospitals' datasets published", lambda: published() == set(HOSPITALS))
    for hospital in HOSPITALS:
        _as(base, hospital, "grant", "add", "--dataset", "patients", "--developer", "alice")
    job = base / "job.yaml"
    job.write_text(
        (ROOT / "examples" / "hospital_csv" / "job.yaml")
        .read_text()
        .replace("rounds: 30", "rounds: 8")
        .replace("checkpoint_interval: 10", "checkpoint_interval: 2")
    )
    session = json.loads(_as(base, "alice", "job", "submit", str(job), "--json").stdout)["session"]

    def status() -> dict | None:
        answer = _as(base, "alice", "job", "status", session, "--json", check=False)
        return json.loads(answer.stdout) if answer.returncode == 0 else None

    def progress() -> int:
        current = status()
        if not current:
            return 0
        return max((p["round"] for p in current["participants"] if p["role"] == "party"), default=0)

    _wait("round 2", lambda: progress() >= 2)
    podman("kill", kill)
    podman("start", kill)
    try:
        final = _wait(
            "the job's end",
            lambda: (s := status()) and s["state"] not in ("running", "verifying", "awaiting") and s,
            timeout=240,
        )
    except AssertionError as error:
        raise AssertionError(f"{error}\n{_logs(containers)}") from None
    assert final["state"] == "completed", f"{json.dumps(final)[:3000]}\n{_logs(containers)}"
    return final


def test_the_image_runs_as_a_user_with_labels_a_health_check_and_an_sbom(image):
    config = json.loads(podman("image", "inspect", image).stdout)[0]
    assert config["Config"]["User"] == "10001:10001"
    labels = config["Config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert len(labels["org.opencontainers.image.revision"]) == 40
    assert config["Healthcheck"]["Test"] == ["CMD", "/usr/bin/python3", "-m", "confide", "container", "health"]
    sbom = json.loads(
        podman(
            "run",
            "--rm",
            "--read-only",
            "--entrypoint",
            "/usr/bin/python3",
            image,
            "-c",
            "import sys; sys.stdout.write(open('/usr/share/confide/sbom.cdx.json').read())",
        ).stdout  # fmt: skip
    )
    purls = {c["purl"].split("@")[0] for c in sbom["components"]}
    assert {"pkg:pypi/confide", "pkg:pypi/grpcio", "pkg:deb/debian/python3", "pkg:deb/debian/libc6"} <= purls
    passwd = podman("run", "--rm", "--read-only", "--entrypoint", "/usr/bin/python3", image, "-c",
                    "import os, pwd; print(os.getuid(), pwd.getpwuid(os.getuid()).pw_shell)").stdout  # fmt: skip
    assert passwd.split() == ["10001", "/usr/sbin/nologin"]


def test_a_container_without_its_secret_or_holding_the_ca_key_refuses_to_start(image, tmp_path):
    base = tmp_path
    operator = base / "operator"
    confide("certs", "init", "--dir", str(operator), "--services", "", "--admins", "")
    node = base / "node"
    _enroll(operator, node, "aggregator-1", "service", hosts="localhost")
    args = ["run", "aggregator", "--certs=/etc/confide/certs", "--name=aggregator-1", "--listen=0.0.0.0:0"]

    empty = podman("run", "--rm", "--read-only", image, *args, check=False)
    assert empty.returncode == 2, empty.stderr
    assert "/etc/confide/certs/aggregator-1.crt is missing" in empty.stderr

    shutil.copy(operator / "ca.key", node / "ca.key")  # the operator's folder copied whole: the mistake
    for path in [node, *node.iterdir()]:
        os.chown(path, UID, UID)
    holding = podman("run", "--rm", "--read-only", "-v", f"{node}:/etc/confide/certs:ro", image, *args, check=False)
    assert holding.returncode == 2, holding.stderr
    assert "the federation CA's private key is mounted at /etc/confide/certs/ca.key" in holding.stderr

    (node / "ca.key").rename(node / "backup.pem")  # renamed: recognised by what it is, not its name
    renamed = podman("run", "--rm", "--read-only", "-v", f"{node}:/etc/confide/certs:ro", image, *args, check=False)
    assert renamed.returncode == 2 and "/etc/confide/certs/backup.pem" in renamed.stderr, renamed.stderr


def test_compose_runs_a_federation_that_survives_a_controller_kill_and_refuses_a_revoked_hospital(image, tmp_path):
    if shutil.which("podman-compose") is None and not (Path(sys.executable).parent / "podman-compose").exists():
        pytest.skip("podman-compose is not installed (requirements-dev.txt)")
    compose = str(shutil.which("podman-compose") or Path(sys.executable).parent / "podman-compose")
    operator, root = _federation(tmp_path)
    env = {**os.environ, "CONTAINERS_CONF": str(CONF), "CONFIDE_ROOT": str(root), "CONFIDE_IMAGE": image}
    file = str(ROOT / "deploy" / "compose" / "compose.yaml")
    containers = [f"confide-{n}" for n in ("controller", *NODES, *HOSPITALS)]
    up = subprocess.run([compose, "-f", file, "up", "-d"], env=env, capture_output=True, text=True, timeout=300)
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        final = _run_job(tmp_path, containers, kill="confide-controller")
        assert {p["name"] for p in final["participants"] if p["role"] == "party"} == set(HOSPITALS)
        scraped = subprocess.run(["curl", "-sf", "http://127.0.0.1:9101/metrics"], capture_output=True, text=True)
        assert "confide_rounds_total" in scraped.stdout or "confide_heartbeats_total" in scraped.stdout

        # The operator revokes hospital-c and publishes the list; the controller refuses it at once.
        confide("certs", "revoke", "hospital-c", "--dir", str(operator))
        shutil.copy(operator / "revoked.crl.pem", root / "crl" / "revoked.crl.pem")
        os.chown(root / "crl" / "revoked.crl.pem", UID, UID)
        refused = _wait(
            "hospital-c refused",
            lambda: (r := _as(tmp_path, "hospital-c", "data", "list", check=False)).returncode != 0 and r,
            timeout=60,
        )
        assert "revoked" in (refused.stderr + refused.stdout).lower(), refused.stderr
        assert _as(tmp_path, "hospital-a", "data", "list").returncode == 0
    finally:
        subprocess.run([compose, "-f", file, "down", "-t", "5"], env=env, capture_output=True, timeout=300)
    assert list(tmp_path.rglob("ca.key")) == [tmp_path / "operator" / "ca.key"]


def _helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)}: {result.stderr}")
    return result


CHART = str(ROOT / "deploy" / "helm" / "confide")


def _operator_values(root: Path) -> list[str]:
    values = [
        "--set", "hostNetwork=true", "--set", "operator.enabled=true",
        "--set", f"crl.hostPath={root / 'crl'}",
        "--set", "operator.controller.url=https://localhost:8443",
        "--set", f"operator.controller.certs.hostPath={root / 'controller' / 'certs'}",
        "--set", f"operator.controller.state.hostPath={root / 'controller' / 'state'}",
    ]  # fmt: skip
    for i, node in enumerate(NODES):
        values += [
            "--set", f"operator.aggregators[{i}].identity={node}",
            "--set", f"operator.aggregators[{i}].port={50051 + 10 * i}",
            "--set", f"operator.aggregators[{i}].dataPort={50052 + 10 * i}",
            "--set", f"operator.aggregators[{i}].metricsPort={9101 + i}",
            "--set", f"operator.aggregators[{i}].advertise=localhost:{50051 + 10 * i}",
            "--set", f"operator.aggregators[{i}].certs.hostPath={root / node / 'certs'}",
            "--set", f"operator.aggregators[{i}].state.hostPath={root / node / 'state'}",
        ]  # fmt: skip
    return values


def _site_values(root: Path, hospital: str, index: int) -> list[str]:
    return [
        "--set", "hostNetwork=true", "--set", "site.enabled=true", "--set", f"site.name={hospital}",
        "--set", "site.controllerUrl=https://localhost:8443", "--set", f"site.metricsPort={9103 + index}",
        "--set", f"site.certs.hostPath={root / hospital / 'certs'}",
        "--set", f"site.data.hostPath={root / hospital / 'data'}",
        "--set", f"site.work.hostPath={root / hospital / 'work'}",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def helm() -> Path:
    if not HELM.exists():
        pytest.skip("helm is not built (scripts/ensure-helm.sh builds it from the Go module proxy)")
    return HELM


def test_the_chart_names_a_missing_value(helm):
    missing = _helm("template", "site-a", CHART, "--set", "site.enabled=true", check=False)
    assert missing.returncode != 0 and "site.name is required" in missing.stderr, missing.stderr
    no_certs = _helm("template", "site-a", CHART, "--set", "site.enabled=true", "--set", "site.name=hospital-a",
                     "--set", "site.controllerUrl=https://c:8443", check=False)  # fmt: skip
    assert no_certs.returncode != 0 and "site.certs is required" in no_certs.stderr, no_certs.stderr
    operator = _helm("template", "op", CHART, "--set", "operator.enabled=true", check=False)
    assert operator.returncode != 0 and "operator.controller.url is required" in operator.stderr, operator.stderr
    rendered = _helm("template", "op", CHART, *_operator_values(Path("/srv/fed"))).stdout
    assert "ca.key" not in rendered and "readOnlyRootFilesystem: true" in rendered
    assert rendered.count("kind: Deployment") == 1 + len(NODES)


def test_the_helm_chart_under_kube_play_completes_a_job_through_an_agent_kill(image, helm, tmp_path):
    operator, root = _federation(tmp_path)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "operator.yaml").write_text(_helm("template", "op", CHART, *_operator_values(root)).stdout)
    for i, hospital in enumerate(HOSPITALS):
        (manifests / f"{hospital}.yaml").write_text(
            _helm("template", hospital, CHART, *_site_values(root, hospital, i)).stdout
        )
    played = []
    try:
        for name in ("operator", *HOSPITALS):
            played.append(name)
            podman("kube", "play", str(manifests / f"{name}.yaml"), timeout=180)
        # podman names a Deployment's container <deployment>-pod-0-<container>.
        containers = ["op-controller-pod-0-controller", *(f"op-{n}-pod-0-aggregator" for n in NODES)]
        containers += [f"{h}-agent-pod-0-agent" for h in HOSPITALS]
        listed = set(podman("ps", "--format", "{{.Names}}").stdout.split())
        assert set(containers) <= listed, sorted(listed)
        final = _run_job(tmp_path, containers, kill="hospital-b-agent-pod-0-agent")
        assert {p["name"] for p in final["participants"] if p["role"] == "party"} == set(HOSPITALS)
    finally:
        for name in reversed(played):
            podman("kube", "down", str(manifests / f"{name}.yaml"), check=False, timeout=180)
