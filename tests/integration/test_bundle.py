"""The offline bundle (make bundle) installs and runs the demo in a network namespace with no route out.

The namespace has only its loopback (the demo's processes talk over it); a connection to the
package registry is refused there, which the test checks first, so nothing below can have come
from the network. From the unpacked archive: ``install.sh`` checks SHA256SUMS, installs the wheels
with ``pip --no-index`` into a new venv and loads the image with ``podman load``; then the venv's
``confide run`` trains the demo job. A bundle whose file was altered is refused before anything
is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUNDLES = sorted((ROOT / "dist").glob("confide-bundle-*-linux-x86_64.tar"))
CONF = ROOT / "build" / "containers" / "containers.conf"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not BUNDLES, reason="no bundle in dist/: `make bundle` builds it (`make test` does)"),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and ip"),
    pytest.mark.timeout(900),
]


@pytest.fixture
def offline():
    name = f"confide-offline-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        yield ["ip", "netns", "exec", name]
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def _clean_env(storage: Path | None = None) -> dict[str, str]:
    """No venv, no confide settings; podman loads into ``storage`` (its own graph root) when given.

    Loaded into the machine's storage, the archive's image (OCI: no HEALTHCHECK) would replace the
    one ``make image`` built under the same name, which the container tests inspect.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "CONFIDE_", "PIP_"))}
    env |= {"PYTHON": sys.executable, "CONTAINERS_CONF": str(CONF)}
    if storage is not None:
        storage.mkdir(parents=True, exist_ok=True)
        conf = storage / "storage.conf"
        conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{storage}/graph"\nrunroot = "{storage}/run"\n')
        env["CONTAINERS_STORAGE_CONF"] = str(conf)
    return env


def test_the_bundle_installs_with_no_network_and_runs_the_demo(offline, tmp_path):
    with tarfile.open(BUNDLES[-1]) as archive:
        archive.extractall(tmp_path, filter="tar")
    (bundle,) = tmp_path.iterdir()
    probe = subprocess.run(
        [*offline, sys.executable, "-c", "import socket; socket.create_connection(('151.101.0.223', 443), 3)"],
        capture_output=True,
        text=True,
    )
    assert probe.returncode != 0 and "unreachable" in probe.stderr.lower(), probe.stderr

    image = "--image" if shutil.which("podman") and CONF.exists() and any((bundle / "images").iterdir()) else ""
    storage = tmp_path / "podman"
    install = subprocess.run(
        [*offline, "bash", str(bundle / "install.sh"), str(tmp_path / "venv"), *([image] if image else [])],
        capture_output=True,
        text=True,
        env=_clean_env(storage),
        timeout=600,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    if image:
        loaded = subprocess.run(
            ["podman", "image", "exists", "localhost/confide:0.1.0"], env=_clean_env(storage), capture_output=True
        )
        assert loaded.returncode == 0

    demo = subprocess.run(
        [
            *offline,
            str(tmp_path / "venv" / "bin" / "confide"),
            "run",
            str(bundle / "examples" / "breast_cancer.yaml"),
            "--workdir",
            str(tmp_path / "demo"),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        env=_clean_env(),
        cwd=tmp_path,
        timeout=600,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert re.search(r"round +15/15", demo.stdout), demo.stdout[-2000:]


def test_an_altered_bundle_is_refused_before_anything_is_installed(tmp_path):
    with tarfile.open(BUNDLES[-1]) as archive:
        archive.extractall(tmp_path, filter="tar")
    (bundle,) = tmp_path.iterdir()
    (bundle / "examples" / "breast_cancer.yaml").write_text("rounds: 1000000\n")
    install = subprocess.run(
        ["bash", str(bundle / "install.sh"), str(tmp_path / "venv")], capture_output=True, text=True, env=_clean_env()
    )
    assert install.returncode == 2
    assert "SHA256SUMS does not match" in install.stderr, install.stderr
    assert not (tmp_path / "venv").exists()
