"""Checkpoint directories: atomic writes, manifests, verification and one Merkle root.

A checkpoint is a directory of files written by a party or the aggregator at a
round boundary, for example ``<workdir>/checkpoints/round-000012/{model.npz,state.json}``.

* :func:`write_checkpoint` writes it atomically (temporary sibling directory,
  fsync, rename), so a crash leaves either the whole checkpoint or none of it
  (plus at worst a ``<name>.tmp-<random>`` directory that :func:`latest` ignores).
* :func:`manifest` lists its files as leaves ``{"name", "sha256", "size"}``.
* :func:`verify` / :func:`compare` name every missing, changed or extra file.
* :func:`root_of` commits to the checkpoints of several owners (parties and the
  aggregator) with one :mod:`Merkle root <confide.crypto.merkle>`; each leaf name
  is prefixed ``"<owner>/"``, e.g. ``"hospital-a/round-000012/model.npz"`` when the
  owner's manifest was made with ``manifest(round_dir, prefix="round-000012/")``.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import tokenize
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from confide._checks import check_int
from confide.crypto.merkle import merkle_root
from confide.errors import ConfideError, InvalidParameterError

__all__ = [
    "CheckpointError",
    "UNREADABLE_FILE_ERRORS",
    "combine",
    "compare",
    "drop_after",
    "file_sha256",
    "latest",
    "manifest",
    "root_of",
    "round_name",
    "round_of",
    "verify",
    "write_checkpoint",
]

#: What reading a damaged or hostile file (``.npy``, ``.npz``, ``.zip``, JSON) can raise from numpy,
#: zipfile, zlib and json besides ``OSError`` and ``ValueError`` (fuzz/ found each): a loader turns
#: these into one error that names the file. ``RuntimeError`` covers ``RecursionError`` (deep JSON)
#: and ``NotImplementedError`` (an unknown zip compression method).
UNREADABLE_FILE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ValueError,
    KeyError,
    EOFError,
    RuntimeError,
    SyntaxError,
    tokenize.TokenError,
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
)
_CHUNK = 1 << 20
_ROUND = re.compile(r"round-(\d+)")
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_SHOWN_HEX = 12

Leaf = dict[str, Any]
Problem = dict[str, str]


class CheckpointError(ConfideError):
    """A checkpoint cannot be read, written or verified; the message names every problem.

    ``problems`` holds one ``{"name", "problem"}`` dict per file that failed (empty
    when the error is not about individual files, e.g. the directory already exists).
    """

    def __init__(self, message: str, problems: list[Problem] | None = None) -> None:
        super().__init__(message)
        self.problems: list[Problem] = list(problems or [])


def round_name(round_index: int) -> str:
    """Directory name of round ``round_index``: ``"round-000012"`` (six digits, more when needed)."""
    return f"round-{check_int('round_index', round_index, 0):06d}"


def round_of(path: str | os.PathLike[str]) -> int | None:
    """The round of a checkpoint directory named ``round-NNNNNN``; None for any other name."""
    match = _ROUND.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def drop_after(directory: str | os.PathLike[str], round_index: int) -> None:
    """Remove the checkpoints of rounds after ``round_index`` (an abandoned run's), partial ones too.

    A run that resumes from round R, or starts over (R = 0), writes the later rounds afresh; a
    directory a crash left half-written (``round-NNNNNN.*``) goes with its round.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return
    for path in directory.iterdir():
        match = _ROUND.match(path.name)
        if match and path.name[match.end() :][:1] in ("", ".") and int(match.group(1)) > round_index:
            shutil.rmtree(path, ignore_errors=True)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 (lowercase hex) of a file's content, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise CheckpointError(f"cannot read {os.fspath(path)}: {exc.strerror or exc}") from exc
    return digest.hexdigest()


def _scan(directory: Path, prefix: str) -> tuple[list[Leaf], list[Problem]]:
    """Leaves of every regular file under ``directory``, and the entries refused (symlinks, others)."""
    leaves: list[Leaf] = []
    problems: list[Problem] = []

    def walk(folder: Path, relative: str) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError as exc:
            raise CheckpointError(f"cannot list {folder}: {exc.strerror or exc}") from exc
        for entry in entries:
            name = f"{relative}{entry.name}"
            path = folder / entry.name
            if entry.is_symlink():
                problems.append({"name": prefix + name, "problem": f"symlink refused: {path}"})
            elif entry.is_dir(follow_symlinks=False):
                walk(path, f"{name}/")
            elif entry.is_file(follow_symlinks=False):
                try:
                    size = entry.stat(follow_symlinks=False).st_size
                    digest = file_sha256(path)
                except (OSError, CheckpointError) as exc:
                    problems.append({"name": prefix + name, "problem": f"unreadable: {exc}"})
                    continue
                leaves.append({"name": prefix + name, "sha256": digest, "size": size})
            else:
                problems.append({"name": prefix + name, "problem": f"not a regular file: {path}"})

    walk(directory, "")
    leaves.sort(key=lambda leaf: leaf["name"])
    return leaves, problems


def _existing_directory(directory: str | os.PathLike[str]) -> Path:
    path = Path(directory)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist or is not a directory")
    return path


def manifest(directory: str | os.PathLike[str], *, prefix: str = "") -> list[Leaf]:
    """Every regular file under ``directory`` (recursively), sorted by name.

    Each entry is ``{"name": prefix + relative POSIX path, "sha256": hex, "size": int}``.
    Empty sub-directories do not appear. A symlink (to a file or a directory) or any
    other non-regular entry under ``directory`` raises :class:`CheckpointError`
    naming its path; ``directory`` itself may be reached through a symlink.
    """
    if not isinstance(prefix, str):
        raise InvalidParameterError(f"prefix must be a str, got {prefix!r}")
    leaves, problems = _scan(_existing_directory(directory), prefix)
    if problems:
        headline = f"checkpoint {directory} has entries that cannot be listed"
        raise CheckpointError(_describe(headline, problems), problems)
    return leaves


def _check_file_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidParameterError(f"file names must be non-empty str, got {name!r}")
    parts = name.split("/")
    if "\\" in name or "\x00" in name or any(part in ("", ".", "..") for part in parts):
        raise InvalidParameterError(
            f"file name {name!r} must be a relative POSIX path without empty, '.' or '..' parts"
        )
    return name


def _fsync_directory(path: Path) -> None:
    if os.name == "nt":  # directories cannot be opened for fsync on Windows
        return
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


#: What a checkpoint file may be given as: its bytes, or a function that writes it to a binary file
#: (a large model's weights are streamed to disk, never held as one more copy in memory).
Content = bytes | bytearray | memoryview | Callable[[BinaryIO], None]


def _write_file(path: Path, data: Content) -> tuple[str, int]:
    """Write one file, fsynced; its (sha256, size), read back from disk for streamed content."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    if callable(data):
        with os.fdopen(descriptor, "wb") as file:
            data(file)
            file.flush()
            os.fsync(file.fileno())
        return file_sha256(path), path.stat().st_size
    try:
        view = memoryview(data).cast("B")
        while view:
            written = os.write(descriptor, view)
            view = view[written:]
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return hashlib.sha256(data).hexdigest(), memoryview(data).nbytes


def write_checkpoint(directory: str | os.PathLike[str], files: Mapping[str, Content]) -> list[Leaf]:
    """Write ``files`` (relative POSIX name -> content) as checkpoint ``directory``, atomically.

    A content is bytes, or a function that writes the file to the binary file it is given
    (its digest is then read back from disk, so a large file is never held in memory).

    The files go into a sibling ``<directory>.tmp-<random>``; every file and directory
    is fsynced, the temporary directory is renamed to ``directory`` and the parent is
    fsynced. On any failure the temporary directory is removed and ``directory`` does
    not appear. Missing parents of ``directory`` are created. Refuses (with
    :class:`CheckpointError` naming it) when ``directory`` already exists. Returns the
    manifest (as :func:`manifest` would list it, computed from ``files``).

    On POSIX, a concurrent writer that creates an *empty* ``directory`` between the
    existence check and the rename would be replaced; give each writer its own path.
    """
    target = Path(directory)
    if not isinstance(files, Mapping):
        raise InvalidParameterError(f"files must be a mapping of name -> bytes, got {type(files).__name__}")
    names = sorted(_check_file_name(name) for name in files)
    for name in names:
        if not isinstance(files[name], (bytes, bytearray, memoryview)) and not callable(files[name]):
            raise InvalidParameterError(
                f"files[{name!r}] must be bytes or a function writing a file, got {type(files[name]).__name__}"
            )
    name_set = set(names)
    for name in names:
        parts = name.split("/")
        for depth in range(1, len(parts)):
            if "/".join(parts[:depth]) in name_set:
                raise InvalidParameterError(f"file name {'/'.join(parts[:depth])!r} is also a directory in {name!r}")
    if os.path.lexists(target):
        raise CheckpointError(f"checkpoint {target} already exists")
    if not target.name or target.name in (".", ".."):
        raise InvalidParameterError(f"directory must name a new directory, got {os.fspath(directory)!r}")

    leaves: list[Leaf] = []
    parent = target.parent
    temporary = parent / f"{target.name}.tmp-{secrets.token_hex(8)}"
    created = False
    try:
        parent.mkdir(parents=True, exist_ok=True)
        temporary.mkdir()
        created = True
        folders = {temporary}
        for name in names:
            parts = name.split("/")
            path = temporary.joinpath(*parts)
            path.parent.mkdir(parents=True, exist_ok=True)
            folders.update(temporary.joinpath(*parts[:depth]) for depth in range(1, len(parts)))
            digest, size = _write_file(path, files[name])
            leaves.append({"name": name, "sha256": digest, "size": size})
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            _fsync_directory(folder)
        if os.path.lexists(target):
            raise CheckpointError(f"checkpoint {target} already exists")
        os.rename(temporary, target)
    except BaseException as exc:
        if created:  # never remove a directory this call did not make
            shutil.rmtree(temporary, ignore_errors=True)
        if isinstance(exc, OSError):
            raise CheckpointError(f"cannot write checkpoint {target}: {exc.strerror or exc}") from exc
        raise
    try:
        _fsync_directory(parent)
    except OSError as exc:  # the checkpoint is complete; only its durability is in doubt
        raise CheckpointError(f"checkpoint {target} was written but its parent could not be fsynced") from exc
    return leaves


def _short(digest: str) -> str:
    return digest[:_SHOWN_HEX]


def _checked_leaves(field: str, leaves: Any) -> list[tuple[str, str, int]]:
    if isinstance(leaves, (str, bytes, Mapping)) or not isinstance(leaves, Iterable):
        raise InvalidParameterError(f"{field} must be a list of leaf dicts, got {type(leaves).__name__}")
    checked = []
    for index, leaf in enumerate(leaves):
        if not isinstance(leaf, Mapping) or not {"name", "sha256", "size"} <= leaf.keys():
            raise InvalidParameterError(f"{field}[{index}] must be a dict with name, sha256 and size, got {leaf!r}")
        name, digest = leaf["name"], leaf["sha256"]
        if not isinstance(name, str) or not name:
            raise InvalidParameterError(f"{field}[{index}].name must be a non-empty str, got {name!r}")
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise InvalidParameterError(f"{field}[{index}].sha256 must be 64 hex characters, got {digest!r}")
        size = check_int(f"{field}[{index}].size", leaf["size"], 0)
        checked.append((name, digest.lower(), size))
    return checked


def compare(expected_leaves: list[Leaf], actual_leaves: list[Leaf]) -> list[Problem]:
    """Differences between recorded and reported leaves, sorted by name.

    Each problem is ``{"name", "problem"}`` where ``problem`` starts with
    ``"missing"``, ``"changed"`` (with both SHA-256 prefixes and sizes),
    ``"unexpected extra file"`` or ``"duplicate"``. An empty list means they match.
    Malformed leaves raise :class:`~confide.errors.InvalidParameterError`.
    """
    problems: list[Problem] = []
    tables = []
    for field, leaves in (("expected_leaves", expected_leaves), ("actual_leaves", actual_leaves)):
        table: dict[str, tuple[str, int]] = {}
        for name, digest, size in _checked_leaves(field, leaves):
            if name in table:
                problems.append({"name": name, "problem": f"duplicate name in {field}"})
            table[name] = (digest, size)
        tables.append(table)
    expected, actual = tables
    for name in sorted(expected.keys() | actual.keys()):
        if name not in actual:
            problems.append({"name": name, "problem": "missing"})
        elif name not in expected:
            problems.append({"name": name, "problem": "unexpected extra file"})
        elif expected[name] != actual[name]:
            (want_digest, want_size), (got_digest, got_size) = expected[name], actual[name]
            problems.append(
                {
                    "name": name,
                    "problem": (
                        f"changed: expected sha256 {_short(want_digest)}… ({want_size} bytes), "
                        f"actual {_short(got_digest)}… ({got_size} bytes)"
                    ),
                }
            )
    problems.sort(key=lambda problem: problem["name"])
    return problems


def _describe(headline: str, problems: list[Problem]) -> str:
    details = "; ".join(f"{problem['name']}: {problem['problem']}" for problem in problems)
    return f"{headline} ({len(problems)} problem{'s' if len(problems) != 1 else ''}): {details}"


def verify(directory: str | os.PathLike[str], expected: list[Leaf], *, prefix: str = "") -> None:
    """Recompute the hashes under ``directory`` and compare them with ``expected``.

    Raises :class:`CheckpointError` whose message names every problem (missing,
    changed and unexpected extra files, refused symlinks, unreadable files); the same problems are in
    its ``problems`` attribute. A missing ``directory`` reports every expected file
    missing. ``prefix`` is the one the manifest was made with.
    """
    if not isinstance(prefix, str):
        raise InvalidParameterError(f"prefix must be a str, got {prefix!r}")
    path = Path(directory)
    if path.is_dir():
        actual, refused = _scan(path, prefix)
    else:
        actual, refused = [], []
    refused_names = {problem["name"] for problem in refused}
    problems = [
        problem
        for problem in compare(expected, actual)
        if not (problem["name"] in refused_names and problem["problem"] == "missing")
    ]
    problems = sorted(problems + refused, key=lambda problem: problem["name"])
    if problems:
        headline = f"checkpoint {path} does not match its manifest"
        if not path.is_dir():
            headline += " (the directory does not exist)"
        raise CheckpointError(_describe(headline, problems), problems)


def _check_owner(owner: Any) -> str:
    if not isinstance(owner, str) or not owner or "/" in owner:
        raise InvalidParameterError(f"owner names must be non-empty str without '/', got {owner!r}")
    return owner


def combine(manifests: Mapping[str, list[Leaf]]) -> list[Leaf]:
    """Union of several owners' leaves, each name prefixed ``"<owner>/"``, sorted by name."""
    if not isinstance(manifests, Mapping):
        raise InvalidParameterError(f"manifests must map owner -> leaves, got {type(manifests).__name__}")
    union: list[Leaf] = []
    for owner, leaves in manifests.items():
        prefix = f"{_check_owner(owner)}/"
        for name, digest, size in _checked_leaves(f"manifests[{owner!r}]", leaves):
            union.append({"name": prefix + name, "sha256": digest, "size": size})
    union.sort(key=lambda leaf: leaf["name"])
    return union


def root_of(manifests: Mapping[str, list[Leaf]]) -> str:
    """Merkle root (hex) over the leaves of several owners (see :func:`combine`).

    Duplicate names raise :class:`~confide.errors.InvalidParameterError`; no leaves
    at all give :data:`confide.crypto.merkle.EMPTY_ROOT`.
    """
    return merkle_root([(leaf["name"], leaf["sha256"], leaf["size"]) for leaf in combine(manifests)])


def latest(directory_of_checkpoints: str | os.PathLike[str]) -> Path | None:
    """The ``round-NNNNNN`` sub-directory with the highest round number, or None.

    Temporary ``*.tmp-*`` directories, symlinks, files and other names are ignored;
    a missing ``directory_of_checkpoints`` gives None.
    """
    base = Path(directory_of_checkpoints)
    best: tuple[int, str] | None = None
    try:
        entries = list(os.scandir(base))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"cannot list {base}: {exc.strerror or exc}") from exc
    for entry in entries:
        match = _ROUND.fullmatch(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        key = (int(match.group(1)), entry.name)
        if best is None or key > best:
            best = key
    return None if best is None else base / best[1]
