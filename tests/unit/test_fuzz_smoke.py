"""The short fuzz run that ``make test`` includes (the long one is ``make fuzz``).

Every seed of every Python fuzz target is replayed in-process first (the committed corpora must
keep decoding as documented), then each target is fuzzed by atheris for a bounded number of
inputs in its own process, two at a time. A crash fails the test and names the reproducer that
``fuzz/run.py`` wrote under build/fuzz/artifacts/.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[2] / "fuzz"
sys.path.insert(0, str(FUZZ / "python"))

import _common  # noqa: E402

TARGETS = sorted(p.stem for p in (FUZZ / "python").glob("*.py") if not p.stem.startswith("_"))
#: Generated inputs per target in the short run (besides the corpus); the run stays well under a minute.
SHORT_RUNS = 2000


def test_every_python_target_has_seeds():
    assert len(TARGETS) >= 10
    for target in TARGETS:
        assert any((FUZZ / "corpus" / target).iterdir()), f"fuzz/corpus/{target}/ is empty"


@pytest.mark.parametrize("target", TARGETS)
def test_seed_corpus_decodes_as_documented(target):
    module = __import__(target)
    for seed in sorted((FUZZ / "corpus" / target).iterdir()):
        _common.check(module.fuzz_one, module.ALLOWED, seed.read_bytes())


@pytest.mark.slow
def test_short_fuzz_run_of_every_python_target(tmp_path):
    pytest.importorskip("atheris")
    command = [sys.executable, str(FUZZ / "run.py"), "--python", "--runs", str(SHORT_RUNS), "--jobs", "2"]
    # From the committed seeds only (whatever earlier runs found), with one random seed: the same inputs each run.
    command += ["--found", str(tmp_path), "--seed", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-4000:]
    assert f"{len(TARGETS)} passed, 0 failed" in done.stdout, done.stdout
