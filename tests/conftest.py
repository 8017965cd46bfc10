from pathlib import Path

import pytest

from confide.crypto import DecryptionKey
from tests.fixtures.keys import fixed_key


@pytest.fixture(scope="session")
def key() -> DecryptionKey:
    """The fixed 2048-bit test key (tests/fixtures/keys.py), shared by the session."""
    return fixed_key()


_INTEGRATION = ("integration", "e2e")


def pytest_collection_modifyitems(config, items):
    """Marks the tests of tests/integration and tests/e2e ``integration`` (the tiers in pyproject.toml)."""
    root = Path(__file__).resolve().parent
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(root).parts
        if parts and parts[0] in _INTEGRATION:
            item.add_marker(pytest.mark.integration)
