import pytest

from confide.crypto import DecryptionKey
from tests.fixtures.keys import fixed_key


@pytest.fixture(scope="session")
def key() -> DecryptionKey:
    """The fixed 2048-bit test key (tests/fixtures/keys.py), shared by the session."""
    return fixed_key()
