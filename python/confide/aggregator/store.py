"""Completed rounds on disk, read back a slice at a time: no whole aggregate in memory.

An aggregator restarted mid-job loses no completed round.

A round attempt's combined slices are appended to ``<state>/<job>/round-<r>-<attempt>.part`` as
they complete (:class:`RoundWriter`); when the last one is in, the header and a trailer follow,
the file is fsynced and renamed to ``round-<r>-<attempt>.bin`` (``-s<share>`` before ``.bin``
for a share of a cluster round: a node may serve a lost node's share too). Slices are read back
one at a time (:class:`StoredRound`), for a party that lost them or asks for them. Layout::

    "CFRR" 2 0 0 0 | { <IQ index, size> payload }* | header | <IQ count, header size> | "CFRREND" 0

(files of the first layout, header first, still load). Without a state directory the files go
to a temporary directory removed at :meth:`ResultStore.close`. A paillier job's public key is
kept in ``<state>/<job>/encryption_key.bin``. It all holds only what the aggregator saw anyway
(sums in plain/secagg, ciphertext products or masked words otherwise). The last ``keep`` rounds
per job are kept (every attempt of them).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import struct
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from google.protobuf.message import DecodeError

from confide.errors import WireFormatError
from confide.v1 import runtime_pb2 as pb

__all__ = ["MemoryResults", "ResultStore", "RoundWriter", "StoredRound"]

_NAME = re.compile(r"^round-(\d+)-(\d+)(?:-s(\d+))?\.(bin|part)$")
_FRAME = struct.Struct("<IQ")
_MAGIC = b"CFRR\x02\0\0\0"
_END = b"CFRREND\0"


class StoredRound(Mapping):
    """Combined slices of one round attempt in a file: index -> payload, read when asked."""

    def __init__(self, path: Path, offsets: dict[int, tuple[int, int]]) -> None:
        self.path = path
        self._offsets = offsets

    def __getitem__(self, index: int) -> bytes:
        offset, size = self._offsets[index]
        try:
            with open(self.path, "rb") as file:
                file.seek(offset)
                data = file.read(size)
        except FileNotFoundError:
            raise KeyError(index) from None  # pruned: the round is no longer kept
        if len(data) != size:
            raise WireFormatError(f"stored round {self.path}: slice {index} is truncated")
        return data

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._offsets))

    def __len__(self) -> int:
        return len(self._offsets)

    def __contains__(self, index: object) -> bool:
        return index in self._offsets


class MemoryResults:
    """A round's combined slices kept in memory (a round state made without a store: tools, tests)."""

    def __init__(self) -> None:
        self.view: dict[int, bytes] = {}

    def add(self, index: int, payload: bytes) -> None:
        """Keep one combined slice."""
        self.view[index] = payload

    def finish(self, header: pb.RoundHeader) -> Mapping[int, bytes]:
        """The completed round's slices."""
        return self.view

    def discard(self) -> None:
        """Forget them (the attempt did not complete)."""
        self.view = {}


class RoundWriter:
    """Appends one round attempt's combined slices to its ``.part`` file as they complete."""

    def __init__(self, path: Path, store: ResultStore, *, durable: bool) -> None:
        self._final = path
        self._part = path.with_suffix(".part")
        self._store = store
        self._durable = durable
        self._lock = threading.Lock()
        self._size = 0  # bytes in the .part file; 0: not created yet
        self._closed = False
        self._offsets: dict[int, tuple[int, int]] = {}
        #: The slices written so far, readable while the round is still open.
        self.view = StoredRound(self._part, self._offsets)

    def _append(self, *chunks: bytes) -> int:
        """Append to the ``.part`` file (opened per call: an open round holds no descriptor); its offset."""
        with open(self._part, "ab" if self._size else "wb") as file:
            if not self._size:
                file.write(_MAGIC)
                self._size = len(_MAGIC)
            start = self._size
            for chunk in chunks:
                file.write(chunk)
                self._size += len(chunk)
        return start

    def add(self, index: int, payload: bytes) -> None:
        """Append one combined slice (a repeated index is ignored)."""
        with self._lock:
            if index in self._offsets or self._closed:
                return
            start = self._append(_FRAME.pack(index, len(payload)), payload)
            self._offsets[index] = (start + _FRAME.size, len(payload))

    def finish(self, header: pb.RoundHeader) -> StoredRound:
        """Write the header and trailer, make it durable, and name it ``.bin``: the round is stored."""
        stored = pb.RoundHeader()
        stored.CopyFrom(header)
        stored.party_id = ""
        raw = stored.SerializeToString()
        with self._lock:
            self._append(raw, _FRAME.pack(len(self._offsets), len(raw)), _END)
            if self._durable:
                with open(self._part, "rb") as file:
                    os.fsync(file.fileno())
            self._closed = True
            os.replace(self._part, self._final)
        self._store.prune(self._final.parent)
        return StoredRound(self._final, dict(self._offsets))

    def discard(self) -> None:
        """The attempt did not complete: remove its file."""
        with self._lock:
            self._closed = True
            self._part.unlink(missing_ok=True)


class ResultStore:
    """Completed round attempts of every job under one directory."""

    def __init__(self, directory: str | os.PathLike | None, keep: int = 3) -> None:
        self._directory = Path(directory) if directory is not None else None
        self._keep = keep
        self._temporary: Path | None = None

    def writer(self, header: pb.RoundHeader) -> RoundWriter:
        """A writer for the combined slices of the attempt ``header`` opens (its ``.part`` file)."""
        root = self._directory
        if root is None:
            if self._temporary is None:
                self._temporary = Path(tempfile.mkdtemp(prefix="confide-results-"))
            root = self._temporary
        job_dir = root / _safe(header.job_id)
        job_dir.mkdir(parents=True, exist_ok=True)
        suffix = f"-s{header.share}" if header.cluster_nodes > 1 else ""
        path = job_dir / f"round-{header.round}-{header.attempt}{suffix}.bin"
        return RoundWriter(path, self, durable=self._directory is not None)

    def save(self, header: pb.RoundHeader, done: Mapping[int, bytes]) -> StoredRound:
        """Store a completed round attempt at once (what :class:`RoundWriter` does slice by slice)."""
        writer = self.writer(header)
        for index in sorted(done):
            writer.add(index, done[index])
        return writer.finish(header)

    def close(self) -> None:
        """Remove the temporary directory (a store without a state directory)."""
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)
            self._temporary = None

    def save_key(self, job_id: str, key: bytes) -> None:
        """Persist a job's Paillier public key (headers may then leave it out)."""
        if self._directory is None:
            return
        job_dir = self._directory / _safe(job_id)
        job_dir.mkdir(parents=True, exist_ok=True)
        temporary = job_dir / "encryption_key.tmp"
        temporary.write_bytes(len(job_id.encode()).to_bytes(2, "little") + job_id.encode() + key)
        os.replace(temporary, job_dir / "encryption_key.bin")

    def load_keys(self) -> dict[str, bytes]:
        """Every stored job's public key."""
        if self._directory is None or not self._directory.exists():
            return {}
        keys = {}
        for path in self._directory.glob("*/encryption_key.bin"):
            data = path.read_bytes()
            size = int.from_bytes(data[:2], "little")
            try:
                if len(data) < 2 + size:
                    raise ValueError(f"job id of {size} bytes overruns the {len(data)}-byte file")
                keys[data[2 : 2 + size].decode()] = data[2 + size :]
            except ValueError as error:
                raise WireFormatError(f"stored key {path} is damaged: {error}") from None
        return keys

    def load(self) -> list[tuple[pb.RoundHeader, StoredRound]]:
        """Every stored round attempt (its slices stay on disk); unfinished ``.part`` files are removed."""
        if self._directory is None or not self._directory.exists():
            return []
        for path in self._directory.glob("*/round-*.part"):
            path.unlink(missing_ok=True)  # an attempt that was open when the aggregator stopped
        rounds = []
        for path in sorted(self._directory.glob("*/round-*.bin")):
            try:
                rounds.append(_read_round(path))
            except (struct.error, ValueError, DecodeError) as error:
                raise WireFormatError(f"stored round {path} is damaged: {error}") from None
        return rounds

    def prune(self, job_dir: Path) -> None:
        """Keep every attempt of the job's last ``keep`` rounds."""
        found = []
        for path in job_dir.glob("round-*.bin"):
            match = _NAME.match(path.name)
            if match:
                found.append((int(match[1]), path))
        keep = sorted({number for number, _ in found})[-self._keep :]
        for number, path in found:
            if number not in keep:
                path.unlink(missing_ok=True)


def _read_round(path: Path) -> tuple[pb.RoundHeader, StoredRound]:
    """The header and slice offsets of one stored round attempt (both layouts; see the module)."""
    total = path.stat().st_size
    offsets: dict[int, tuple[int, int]] = {}
    with open(path, "rb") as file:
        if file.read(len(_MAGIC)) == _MAGIC:
            tail = len(_END) + _FRAME.size
            if total < len(_MAGIC) + tail:
                raise ValueError(f"{total} bytes cannot hold the trailer")
            file.seek(total - tail)
            count, length = _FRAME.unpack(file.read(_FRAME.size))
            if file.read(len(_END)) != _END:
                raise ValueError("the trailer is missing (the file was not finished)")
            end = total - tail - length
            if end < len(_MAGIC):
                raise ValueError(f"header of {length} bytes overruns the {total}-byte file")
            file.seek(end)
            header = pb.RoundHeader.FromString(file.read(length))
            offset = len(_MAGIC)
        else:  # the first layout: <count, header size> header, then the slices
            file.seek(0)
            count, length = _FRAME.unpack(file.read(_FRAME.size))
            if _FRAME.size + length > total:
                raise ValueError(f"header of {length} bytes overruns the {total}-byte file")
            header = pb.RoundHeader.FromString(file.read(length))
            offset, end = _FRAME.size + length, total
        for _ in range(count):
            file.seek(offset)
            frame = file.read(_FRAME.size)
            if len(frame) != _FRAME.size:
                raise ValueError(f"slice frame at offset {offset} is truncated")
            index, size = _FRAME.unpack(frame)
            offset += _FRAME.size
            if offset + size > end:
                raise ValueError(f"slice {index} of {size} bytes overruns the {total}-byte file")
            offsets[index] = (offset, size)
            offset += size
        if offset != end:
            raise ValueError(f"{end - offset} trailing bytes")
    return header, StoredRound(path, offsets)


def _safe(job_id: str) -> str:
    """A directory name for ``job_id`` that stays inside the state directory."""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", job_id):
        return job_id
    return "job-" + hashlib.sha256(job_id.encode()).hexdigest()[:32]
