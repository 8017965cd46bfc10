"""Fuzz target: checkpoint manifests as parties report them (``confide.checkpoints``).

Parties send their checkpoints' leaves (JSON) to the controller, which compares them with
what it recorded and computes one Merkle root. Any JSON value must give a result or an
:class:`InvalidParameterError` naming the bad leaf: never a ``TypeError`` or ``KeyError``.
"""

from __future__ import annotations

import json

import _common

with _common.instrumented(__name__):
    from confide import checkpoints
    from confide.errors import InvalidParameterError

ALLOWED = (InvalidParameterError,)


def fuzz_one(data: bytes) -> None:
    """Parse ``data`` as JSON (bytes that are not JSON are the parser's business) and check it."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return
    if isinstance(value, dict):
        root = checkpoints.root_of(value)
        assert isinstance(root, str) and len(root) == 64
    else:
        problems = checkpoints.compare(value, value)
        assert all(problem["problem"].startswith("duplicate") for problem in problems)


if __name__ == "__main__":
    _common.main(fuzz_one, ALLOWED)
