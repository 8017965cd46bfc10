import os
from pathlib import Path

import pytest

from confide.crypto import DecryptionKey
from tests.fixtures import ordering
from tests.fixtures.keys import fixed_key
from tests.groups import EXCLUSIVE_FILES, EXCLUSIVE_IN_PLACE, SERIAL_FILES

# JAX's persistent compilation cache, shared by every process of the run (party processes inherit
# the variables): a Keras-on-JAX party compiles the same train and eval steps as the previous job's,
# and with the cache the 3-party CNN job took 14.6 s instead of 30.9 s on this two-core host (the
# same weights and accuracies). Set here so that the test process's own JAX reads them too.
for _name, _value in {
    "JAX_COMPILATION_CACHE_DIR": str(Path(__file__).resolve().parents[1] / "build" / "jax-cache"),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}.items():
    os.environ.setdefault(_name, _value)


def pytest_addoption(parser):
    parser.addoption(
        "--record-durations",
        action="store_true",
        help="write each file's test time into tests/durations.json (the order `make test` runs files in)",
    )
    parser.addoption(
        "--record-cpu",
        metavar="FOLDER",
        help="write each file's CPU seconds (the test process and its children) into FOLDER/<worker>.json",
    )


def pytest_configure(config):
    # The controller (or a run without workers) sees every report; xdist workers only their own.
    if config.getoption("record_durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(ordering.Recorder(), "confide-durations")
    if config.getoption("record_cpu"):
        worker = getattr(config, "workerinput", {}).get("workerid", "main")
        config.pluginmanager.register(ordering.CpuRecorder(config.getoption("record_cpu"), worker), "confide-cpu")


@pytest.fixture(scope="session")
def key() -> DecryptionKey:
    """The fixed 2048-bit test key (tests/fixtures/keys.py), shared by the session."""
    return fixed_key()


_INTEGRATION = ("integration", "e2e")


def pytest_collection_modifyitems(config, items):
    """Marks the tiers: ``integration`` for tests/integration and tests/e2e, ``serial`` for
    ``SERIAL_FILES``, ``exclusive`` for ``EXCLUSIVE_FILES`` (tests/groups.py).

    ``make test`` distributes whole files over both cores (``--dist loadfile``): a file's tests
    share its module-scoped fixtures (a trained job, a venv, a Ray cluster) on one worker, which
    builds them once. (``--dist loadgroup`` would not do: with pytest 9 the group suffix
    pytest-xdist 3.8 writes into ``item._nodeid`` never reaches the scheduler.) Collection puts the
    files longest first (tests/fixtures/ordering.py); only ``--no-loadscope-reorder`` keeps that
    order, which ``make test`` does not pass (it measured slower, see ordering.py).
    """
    ordering.longest_files_first(items, ordering.load())
    root = Path(__file__).resolve().parent
    for item in items:
        relative = Path(str(item.fspath)).resolve().relative_to(root)
        if relative.parts and relative.parts[0] in _INTEGRATION:
            item.add_marker(pytest.mark.integration)
        if relative.as_posix() in SERIAL_FILES:
            item.add_marker(pytest.mark.serial)
        if relative.as_posix() in EXCLUSIVE_FILES:
            item.add_marker(pytest.mark.exclusive)
        elif item.get_closest_marker("exclusive") and relative.as_posix() not in EXCLUSIVE_IN_PLACE:
            # Phase 1 leaves it out and phase 3 collects only the files tests/groups.py names.
            raise pytest.UsageError(
                f"{item.nodeid} is marked exclusive: name its file in tests/groups.py EXCLUSIVE_IN_PLACE"
            )
