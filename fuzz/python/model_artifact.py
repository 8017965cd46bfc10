"""Fuzz target: model files read from disk.

``ModelArtifact.load`` (a ``.model.zip``) and ``HomoLR.load`` (an ``.npz``); the first byte
picks which, the rest is the file.

A damaged or foreign file must be an :class:`InvalidParameterError` naming it, never an
exception from ``zipfile``, ``zlib``, ``json`` or ``numpy``.
"""

from __future__ import annotations

from pathlib import Path

import _common

with _common.instrumented(__name__):
    from confide.artifact import ModelArtifact
    from confide.errors import InvalidParameterError
    from confide.ml.homo_lr import HomoLR

ALLOWED = (InvalidParameterError,)
_path: list[Path] = []


def fuzz_one(data: bytes) -> None:
    """Write ``data[1:]`` to a file and load it as an artifact (even first byte) or a Homo LR model."""
    if not data:
        return
    if not _path:
        _path.append(_common.scratch("model") / "fuzz.model.zip")
    path = _path[0]
    path.write_bytes(data[1:])
    if data[0] % 2 == 0:
        artifact = ModelArtifact.load(path)
        assert isinstance(artifact.manifest, dict)
    else:
        HomoLR.load(path)


if __name__ == "__main__":
    _common.main(fuzz_one, ALLOWED)
