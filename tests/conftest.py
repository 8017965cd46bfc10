from pathlib import Path

import pytest

from confide.crypto import DecryptionKey
from tests.fixtures.keys import fixed_key


@pytest.fixture(scope="session")
def key() -> DecryptionKey:
    """The fixed 2048-bit test key (tests/fixtures/keys.py), shared by the session."""
    return fixed_key()


_INTEGRATION = ("integration", "e2e")

#: Test files that run alone, after the parallel run (`make test`): each bounds a wall-clock time or
#: paces rounds against timeouts, or owns a fixed network resource, so a neighbour test on the other
#: core would turn its margin into a flake. The reason is recorded next to each one.
SERIAL_FILES = {
    "integration/test_cluster.py": "times how fast a lost node is noticed",
    "integration/test_supervision.py": "paced rounds against restart and rejoin deadlines",
    "integration/test_wan.py": "one fixed subnet and namespaces; measures shaped-link throughput",
    "integration/test_upload_resets.py": "times uploads across connection resets",
    "integration/test_revocation.py": "revokes in the middle of paced rounds",
    "integration/test_hospitals.py": "paced rounds against a stop grace period",
    "e2e/test_console.py": "a browser watching paced rounds",
    "unit/runtime/test_pool.py": "bounds how long a pool waits",
    "unit/runtime/test_rejoin.py": "bounds how long a rejoin waits",
    "unit/runtime/test_slicing.py": "threads given fixed sleeps to reach a state; pipelined against serial time",
    "unit/crypto/test_native_boundary.py": "counts GIL ticks while native code runs",
    "unit/transport/test_revocation.py": "a refusal within 1 s of revocation",
}


#: Test files whose tests all run on one xdist worker, one after another, while the other worker
#: runs anything else: a Ray test's teardown (``ray stop --force``) stops every Ray cluster on the
#: machine, so two Ray tests must never overlap.
EXCLUSIVE_GROUPS = {
    "integration/test_compute.py": "ray",
    "unit/compute/test_ray.py": "ray",
}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (loadgroup)
def pytest_collection_modifyitems(config, items):
    """Marks tiers and scheduling.

    - ``integration``: the tests of tests/integration and tests/e2e (the tiers in pyproject.toml);
    - ``serial``: the files of ``SERIAL_FILES``;
    - ``xdist_group``: the files of ``EXCLUSIVE_GROUPS`` share a group; tests sharing a
      module-scoped fixture stay on one worker, so the fixture (a trained job, a venv, a model) is
      built once, not once per worker.
    """
    root = Path(__file__).resolve().parent
    for item in items:
        relative = Path(str(item.fspath)).resolve().relative_to(root)
        if relative.parts and relative.parts[0] in _INTEGRATION:
            item.add_marker(pytest.mark.integration)
        if relative.as_posix() in SERIAL_FILES:
            item.add_marker(pytest.mark.serial)
        if relative.as_posix() in EXCLUSIVE_GROUPS:
            item.add_marker(pytest.mark.xdist_group(EXCLUSIVE_GROUPS[relative.as_posix()]))
        info = getattr(item, "_fixtureinfo", None)
        if info is None or item.get_closest_marker("xdist_group"):
            continue
        shared = sorted(
            name
            for name, definitions in info.name2fixturedefs.items()
            if definitions and definitions[-1].scope in ("module", "package", "class")
        )
        if shared:
            item.add_marker(pytest.mark.xdist_group(f"{relative.as_posix()}::{shared[0]}"))
