"""The wheel other machines install: into a clean venv, then the demo job from it.

``make wheel`` (run by ``make test`` before this file) builds ``dist/confide-*.whl`` with a
portable GMP; here it is installed into a new venv that sees nothing of this checkout (another
working directory, no ``PYTHONPATH``), with its dependencies at the versions the suite pins,
and runs ``confide run examples/breast_cancer.yaml`` as a user would. Then the same with the
AVX-512 IFMA engine switched off, the path a CPU without it takes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHEELS = sorted((ROOT / "dist").glob("confide-*.whl"))

pytestmark = [
    pytest.mark.skipif(not WHEELS, reason="no wheel in dist/: `make wheel` builds it (`make test` does)"),
    # Installing the dependencies (the registry, or uv's cache), and two demo jobs.
    pytest.mark.timeout(900),
]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "CONFIDE_"))}


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("wheel-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    # The suite's pins as constraints (no extras there): the same versions make setup installed.
    pins = where.parent / "constraints.txt"
    pins.write_text(re.sub(r"\[[^\]]*\]", "", (ROOT / "requirements-dev.txt").read_text()))
    # uv, which `make setup` installs, from its cache: pip took 38 s of the file's 97 (resolving,
    # unpacking and compiling every dependency again). What is tested is the wheel, not the installer.
    install = subprocess.run(
        [
            str(Path(sys.executable).parent / "uv"),
            "pip",
            "install",
            "-q",
            "--python",
            str(where / "bin" / "python"),
            "--constraint",
            str(pins),
            str(WHEELS[-1]),
        ],
        capture_output=True,
        text=True,
        env=_clean_env(),
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    return where


def test_wheel_holds_the_generated_grpc_modules_and_a_manylinux_tag():
    wheel = WHEELS[-1]
    assert "manylinux" in wheel.name, wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert "confide/v1/runtime_pb2_grpc.py" in names and "confide/_native.abi3.so" in names


@pytest.mark.parametrize("ifma", ["auto", "disabled"])
def test_demo_job_runs_from_the_installed_wheel(venv, tmp_path, ifma):
    env = _clean_env()
    if ifma == "disabled":
        env["CONFIDE_DISABLE_IFMA"] = "1"
    where = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import confide, confide._native as n; print(confide.__file__, n.engine())",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert where.returncode == 0, where.stderr
    path, engine = where.stdout.split()
    assert path.startswith(str(venv)), "confide is imported from the venv, not the checkout"
    assert engine == "gmp" if ifma == "disabled" else engine in ("avx512-ifma", "gmp")
    job = ROOT / "examples" / "breast_cancer.yaml"
    launcher = subprocess.Popen(
        [str(venv / "bin" / "confide"), "run", str(job), "--workdir", str(tmp_path / "demo"), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env=env,
        start_new_session=True,  # its aggregator and parties go with it if the test gives up
    )
    try:
        output, _ = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert launcher.returncode == 0, output[-3000:]
    assert "protection that ran: paillier" in output
    report = json.loads((tmp_path / "demo" / "report.json").read_text())
    assert report["mode"] == "paillier" and report["final_auc"] > 0.98


def _glibc(tag: str) -> tuple[int, int] | None:
    """The glibc a platform tag needs (manylinux_2_28_x86_64 -> (2, 28)); None for a pure wheel."""
    legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
    if tag == "any":
        return None
    if tag.split("_x86_64")[0] in legacy:
        return legacy[tag.split("_x86_64")[0]]
    found = re.match(r"manylinux_(\d+)_(\d+)_x86_64$", tag)
    assert found, f"not a manylinux tag: {tag}"
    return int(found[1]), int(found[2])


def test_the_wheel_and_its_dependencies_need_glibc_2_28_at_most():
    """RHEL/Rocky 8 (glibc 2.28): the tag, the symbol versions the extension binds, the wheelhouse."""
    wheel = WHEELS[-1]
    tags = wheel.name.removesuffix(".whl").split("-")[-1].split(".")
    assert max(_glibc(t) for t in tags) <= (2, 28), wheel.name
    with zipfile.ZipFile(wheel) as archive, archive.open("confide/_native.abi3.so") as native:
        data = native.read()
    needs = {tuple(map(int, v.split(b"."))) for v in re.findall(rb"GLIBC_(\d+\.\d+(?:\.\d+)?)", data)}
    assert needs and max(needs) <= (2, 28), sorted(needs)[-3:]
    house = sorted((ROOT / "build" / "wheelhouse").glob("*.whl"))
    if not house:
        pytest.skip("no build/wheelhouse (make image or make bundle builds it)")
    too_new = [w.name for w in house if max((_glibc(t) or (0, 0)) for t in w.stem.split("-")[-1].split(".")) > (2, 28)]
    assert not too_new, too_new
