"""Shared pieces of the Python fuzz harnesses (not a target itself: its name starts with "_").

Every harness module ``fuzz/python/<target>.py`` defines ``ALLOWED`` (the exception types its
decoder documents) and ``fuzz_one(data)``, which feeds ``data`` to the decoder. :func:`check`
runs ``fuzz_one`` and swallows only ``ALLOWED``: anything else escaping is a finding. Run as a
script, a harness hands :func:`check` to atheris (libFuzzer) with the project's modules
instrumented for coverage; the tests import the same functions and call them directly.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import struct
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"


def instrumented(name: str) -> contextlib.AbstractContextManager:
    """Coverage instrumentation of ``confide`` imports when the harness runs as the fuzzer."""
    if name != "__main__":
        return contextlib.nullcontext()
    import atheris

    return atheris.instrument_imports(include=["confide"])


def check(fuzz_one: Callable[[bytes], object], allowed: tuple[type[BaseException], ...], data: bytes) -> None:
    """Run one input; the decoder's documented errors are fine, everything else propagates."""
    try:
        fuzz_one(data)
    except allowed:
        pass


def main(fuzz_one: Callable[[bytes], object], allowed: tuple[type[BaseException], ...]) -> None:
    """Fuzz ``fuzz_one`` with atheris; libFuzzer options and corpus folders come from argv."""
    import atheris

    atheris.Setup(sys.argv, lambda data: check(fuzz_one, allowed, data))
    atheris.Fuzz()


def frames(data: bytes) -> Iterator[bytes]:
    """Split one input into messages: each a 4-byte big-endian length, then that many bytes.

    A truncated last frame is given as what is left, so every input means something.
    """
    offset = 0
    while offset + 4 <= len(data):
        (length,) = struct.unpack_from(">I", data, offset)
        offset += 4
        yield data[offset : offset + length]
        offset += length


def framed(*messages: bytes) -> bytes:
    """Inverse of :func:`frames` (used by fuzz/make_corpus.py)."""
    return b"".join(struct.pack(">I", len(message)) + message for message in messages)


def fixture(name: str) -> bytes:
    """A committed fixture (the fixed Paillier key the seed corpora were made under)."""
    return (FIXTURES / name).read_bytes()


def scratch(name: str) -> Path:
    """A fresh folder for the files a harness writes.

    It lies under ``$CONFIDE_FUZZ_SCRATCH`` (fuzz/run.py sets it and removes it afterwards), else
    in the temporary folder, removed when the process exits.
    """
    base = os.environ.get("CONFIDE_FUZZ_SCRATCH")
    path = Path(tempfile.mkdtemp(prefix=f"confide-fuzz-{name}-", dir=base))
    if base is None:
        atexit.register(shutil.rmtree, path, True)
    return path


def quiet_threads() -> None:
    """Keep native thread pools small: fuzzing runs one input at a time on a shared machine."""
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
