import os
from pathlib import Path

import pytest

from confide.crypto import DecryptionKey
from tests.fixtures import ordering
from tests.fixtures.keys import fixed_key

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


def pytest_configure(config):
    # The controller (or a run without workers) sees every report; xdist workers only their own.
    if config.getoption("record_durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(ordering.Recorder(), "confide-durations")


@pytest.fixture(scope="session")
def key() -> DecryptionKey:
    """The fixed 2048-bit test key (tests/fixtures/keys.py), shared by the session."""
    return fixed_key()


_INTEGRATION = ("integration", "e2e")

#: Test files that run after the parallel run (`make test`), two at a time: each paces rounds against
#: timeouts or bounds a wall-clock time, so a CPU-bound neighbour (a multi-process training job on
#: the other core) would turn its margin into a flake. Beside each other they mostly wait: this
#: phase kept the CPU 31% busy when its files ran one at a time. The reason is next to each one.
SERIAL_FILES = {
    "integration/test_cluster.py": "times how fast a lost node is noticed",
    "integration/test_supervision.py": "paced rounds against restart and rejoin deadlines",
    "integration/test_revocation.py": "revokes in the middle of paced rounds",
    "integration/test_hospitals.py": "paced rounds against a stop grace period",
    # tests/integration/test_compute.py stops its Ray clusters with `ray stop --force`, which stops
    # every Ray cluster on the machine: no other Ray test may run beside it.
    "unit/compute/test_ray.py": "its Ray cluster would be stopped by test_compute.py's teardown on the other worker",
}

#: Test files that run last, alone: they measure time against time (a throughput, GIL ticks,
#: pipelined against serial), own a fixed network resource, or bound a wait at about a second.
EXCLUSIVE_FILES = {
    "integration/test_wan.py": "one fixed subnet and namespaces; measures shaped-link throughput",
    # These two failed beside two serial files at once (-n 3): a resume refused, an upload's
    # slices not delivered within 20 s. They passed beside one, but they are kept alone.
    "integration/test_upload_resets.py": "times uploads across connection resets",
    "e2e/test_console.py": "a browser watching paced rounds and a resume",
    "unit/runtime/test_pool.py": "bounds how long a pool waits",
    "unit/runtime/test_rejoin.py": "bounds how long a rejoin waits",
    "unit/runtime/test_slicing.py": "threads given fixed sleeps to reach a state; pipelined against serial time",
    "unit/crypto/test_native_boundary.py": "counts GIL ticks while native code runs",
    "unit/transport/test_revocation.py": "a refusal within 1 s of revocation",
}


def pytest_collection_modifyitems(config, items):
    """Marks the tiers: ``integration`` for tests/integration and tests/e2e, ``serial`` for
    ``SERIAL_FILES``, ``exclusive`` for ``EXCLUSIVE_FILES``.

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
