import pytest

from confide.crypto import DecryptionKey


@pytest.fixture(scope="session")
def key() -> DecryptionKey:
    """One 2048-bit key for the whole session (generation and tables cost ~1 s)."""
    return DecryptionKey.generate(2048)
