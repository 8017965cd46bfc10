"""Fuzz target: the aggregator's completed rounds on disk (``ResultStore.load`` and ``load_keys``).

A restarted aggregator reads every stored round attempt and job key back. The input holds the
two files in 4-byte length frames: a round file (``round-1-0.bin``) and a key file
(``encryption_key.bin``). A damaged file must be a :class:`WireFormatError` naming it.
"""

from __future__ import annotations

from pathlib import Path

import _common

with _common.instrumented(__name__):
    from confide.aggregator.store import ResultStore
    from confide.errors import WireFormatError

ALLOWED = (WireFormatError,)
_directory: list[Path] = []


def fuzz_one(data: bytes) -> None:
    """Write the input's files into a state directory and load it."""
    if not _directory:
        _directory.append(_common.scratch("store"))
    job = _directory[0] / "fuzz"
    job.mkdir(exist_ok=True)
    for path in job.iterdir():
        path.unlink()
    for name, content in zip(("round-1-0.bin", "encryption_key.bin"), _common.frames(data), strict=False):
        (job / name).write_bytes(content)
    store = ResultStore(_directory[0])
    for header, done in store.load():
        assert all(isinstance(index, int) for index in done) and header.ByteSize() >= 0
    assert all(isinstance(job_id, str) for job_id in store.load_keys())


if __name__ == "__main__":
    _common.main(fuzz_one, ALLOWED)
