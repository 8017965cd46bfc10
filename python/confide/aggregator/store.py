"""Completed rounds on disk, so an aggregator restarted mid-job loses no completed round.

Each completed round attempt is written once, atomically (temporary file, fsync, rename), as
``<state>/<job>/round-<r>-<attempt>.bin`` (``round-<r>-<attempt>-s<share>.bin`` for a share of
a cluster round: a node may serve a lost node's share too): the serialized header, then every
combined slice.
A paillier job's public key is kept in ``<state>/<job>/encryption_key.bin``.
It holds only what the aggregator saw anyway (sums in plain/secagg, ciphertext products or
masked words otherwise). The last ``keep`` rounds per job are kept.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
from pathlib import Path

from google.protobuf.message import DecodeError

from confide.errors import WireFormatError
from confide.v1 import runtime_pb2 as pb

__all__ = ["ResultStore"]

_NAME = re.compile(r"^round-(\d+)-(\d+)(?:-s(\d+))?\.bin$")
_FRAME = struct.Struct("<IQ")


class ResultStore:
    """Completed round attempts of every job under one directory."""

    def __init__(self, directory: str | os.PathLike | None, keep: int = 3) -> None:
        self._directory = Path(directory) if directory is not None else None
        self._keep = keep

    def save(self, header: pb.RoundHeader, done: dict[int, bytes]) -> None:
        """Persist a completed round attempt (no-op without a directory)."""
        if self._directory is None:
            return
        job_dir = self._directory / _safe(header.job_id)
        job_dir.mkdir(parents=True, exist_ok=True)
        suffix = f"-s{header.share}" if header.cluster_nodes > 1 else ""
        path = job_dir / f"round-{header.round}-{header.attempt}{suffix}.bin"
        temporary = path.with_suffix(".tmp")
        stored = pb.RoundHeader()
        stored.CopyFrom(header)
        stored.party_id = ""
        with open(temporary, "wb") as file:
            raw = stored.SerializeToString()
            file.write(_FRAME.pack(len(done), len(raw)))
            file.write(raw)
            for index in sorted(done):
                file.write(_FRAME.pack(index, len(done[index])))
                file.write(done[index])
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
        self._prune(job_dir)

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

    def load(self) -> list[tuple[pb.RoundHeader, dict[int, bytes]]]:
        """Every stored round attempt."""
        if self._directory is None or not self._directory.exists():
            return []
        rounds = []
        for path in sorted(self._directory.glob("*/round-*.bin")):
            try:
                rounds.append(_read_round(path.read_bytes()))
            except (struct.error, ValueError, DecodeError) as error:
                raise WireFormatError(f"stored round {path} is damaged: {error}") from None
        return rounds

    def _prune(self, job_dir: Path) -> None:
        found = []
        for path in job_dir.glob("round-*.bin"):
            match = _NAME.match(path.name)
            if match:
                found.append(((int(match[1]), int(match[2])), path))
        keep = sorted({key for key, _ in found})[-self._keep :]
        for key, path in found:
            if key not in keep:
                path.unlink(missing_ok=True)


def _read_round(data: bytes) -> tuple[pb.RoundHeader, dict[int, bytes]]:
    """The header and combined slices of one stored round attempt (see :meth:`ResultStore.save`)."""
    count, length = _FRAME.unpack_from(data, 0)
    offset = _FRAME.size
    if offset + length > len(data):
        raise ValueError(f"header of {length} bytes overruns the {len(data)}-byte file")
    header = pb.RoundHeader.FromString(data[offset : offset + length])
    offset += length
    done = {}
    for _ in range(count):
        index, size = _FRAME.unpack_from(data, offset)
        offset += _FRAME.size
        if offset + size > len(data):
            raise ValueError(f"slice {index} of {size} bytes overruns the {len(data)}-byte file")
        done[index] = data[offset : offset + size]
        offset += size
    if offset != len(data):
        raise ValueError(f"{len(data) - offset} trailing bytes")
    return header, done


def _safe(job_id: str) -> str:
    """A directory name for ``job_id`` that stays inside the state directory."""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", job_id):
        return job_id
    return "job-" + hashlib.sha256(job_id.encode()).hexdigest()[:32]
