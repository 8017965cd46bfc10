"""Fixtures of the compute tests."""

from __future__ import annotations

import pytest

from tests.fixtures.partitions import write_partitions


@pytest.fixture
def partitioned(tmp_path):
    return write_partitions(tmp_path / "rows", [300, 120, 211, 5])
