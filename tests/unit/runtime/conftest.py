"""Fixtures for the runtime unit tests: federation identities (one CA, and a foreign one)."""

from __future__ import annotations

import pytest

from confide.transport.certs import Identity, init_federation

from .harness import PARTIES


@pytest.fixture(scope="session")
def federation(tmp_path_factory) -> dict[str, Identity]:
    """Identities of :data:`PARTIES` under one federation CA."""
    root = tmp_path_factory.mktemp("federation")
    init_federation(root, parties=PARTIES)
    return {name: Identity.load(root, name) for name in PARTIES}


@pytest.fixture(scope="session")
def other_federation(tmp_path_factory) -> dict[str, Identity]:
    """Same party names, a different CA."""
    root = tmp_path_factory.mktemp("other-federation")
    init_federation(root, parties=PARTIES)
    return {name: Identity.load(root, name) for name in PARTIES}
