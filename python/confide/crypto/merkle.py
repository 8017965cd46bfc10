"""A SHA-256 Merkle tree over named files (pure computation, no I/O).

Each leaf describes one file by its name, the SHA-256 of its content and its size.
One root then commits to a whole set of files, and a short proof shows that one
file belongs to the set without revealing the others.

Hashing follows RFC 6962 (Certificate Transparency) with domain separation, so a
leaf can never be read as an inner node or the reverse:

* leaf hash: ``SHA-256(0x00 || leaf_data(name, sha256, size))``
* node hash: ``SHA-256(0x01 || left || right)``
* empty tree: ``SHA-256("")`` (no leaves; differs from every leaf and node hash
  because those always hash a one-byte prefix first)

Leaves are sorted by name (Unicode code point order, which equals UTF-8 byte order),
so the root does not depend on the order the leaves are given in. The tree is built
level by level; when a level has an odd number of nodes the last one is *promoted*
unchanged to the next level, never paired with a copy of itself. Duplicating it
(as Bitcoin does) would let two different leaf lists (``[a, b, c]`` and
``[a, b, c, c]``) share a root; promotion gives the same shape as RFC 6962's
``MTH`` (left subtree = the largest power of two below n) and no such ambiguity.
A promoted node adds no step to a proof, so proofs have at most ceil(log2 n) steps.

A proof is a list of ``(side, sibling_hash_hex)`` pairs from the leaf up to the
root; ``side`` is ``"L"`` when the sibling is the left child (so the parent is
``H(0x01 || sibling || current)``) and ``"R"`` when it is the right child.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Sequence
from typing import Any

from confide._checks import check_int
from confide.errors import InvalidParameterError

__all__ = [
    "EMPTY_ROOT",
    "MerkleTree",
    "leaf_data",
    "leaf_hash",
    "merkle_root",
    "node_hash",
    "verify_proof",
]

_LEAF_PREFIX = b"\x00"
_NODE_PREFIX = b"\x01"
_LEAF_TAG = b"confide-file-v1"
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_MAX_NAME_BYTES = 2**32 - 1
_MAX_SIZE = 2**64 - 1

#: Root of a tree with no leaves: SHA-256 of the empty string.
EMPTY_ROOT: str = hashlib.sha256(b"").hexdigest()


def _name_bytes(name: Any) -> bytes:
    if not isinstance(name, str) or not name:
        raise InvalidParameterError(f"leaf name must be a non-empty str, got {name!r}")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidParameterError(f"leaf name {name!r} is not encodable as UTF-8") from exc
    if len(encoded) > _MAX_NAME_BYTES:
        raise InvalidParameterError(f"leaf name must be at most {_MAX_NAME_BYTES} UTF-8 bytes, got {len(encoded)}")
    return encoded


def _digest_bytes(field: str, value: Any) -> bytes:
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise InvalidParameterError(f"{field} must be 64 hex characters (a SHA-256), got {value!r}")
    return bytes.fromhex(value)


def leaf_data(name: str, file_sha256_hex: str, size: int) -> bytes:
    """Canonical bytes of one leaf.

    Layout: ``b"confide-file-v1"``, the name's UTF-8 length as a 4-byte big-endian
    integer, the name, the 32 raw digest bytes, the size as an 8-byte big-endian
    integer. The length prefix makes the encoding injective: no two distinct
    ``(name, sha256, size)`` triples give the same bytes. Hex digests are accepted
    in either case and encode identically.
    """
    encoded = _name_bytes(name)
    digest = _digest_bytes("sha256", file_sha256_hex)
    size = check_int("size", size, 0, _MAX_SIZE)
    return b"".join((_LEAF_TAG, len(encoded).to_bytes(4, "big"), encoded, digest, size.to_bytes(8, "big")))


def leaf_hash(name: str, file_sha256_hex: str, size: int) -> bytes:
    """Raw leaf hash: ``SHA-256(0x00 || leaf_data(...))``."""
    return hashlib.sha256(_LEAF_PREFIX + leaf_data(name, file_sha256_hex, size)).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """Raw inner-node hash: ``SHA-256(0x01 || left || right)``."""
    return hashlib.sha256(_NODE_PREFIX + left + right).digest()


def _checked_leaves(leaves: Iterable[Any]) -> list[tuple[str, str, int]]:
    checked: list[tuple[str, str, int]] = []
    for index, leaf in enumerate(leaves):
        if isinstance(leaf, (str, bytes)) or not isinstance(leaf, Sequence) or len(leaf) != 3:
            raise InvalidParameterError(f"leaves[{index}] must be a (name, sha256_hex, size) tuple, got {leaf!r}")
        name, digest, size = leaf
        checked.append((name, digest, size))
    return checked


class MerkleTree:
    """Merkle tree over ``(name, sha256_hex, size)`` leaves, sorted by name.

    Parameters
    ----------
    leaves : sequence of (str, str, int)
        One triple per file; names must be unique (a duplicate raises
        :class:`~confide.errors.InvalidParameterError` naming it).
    """

    __slots__ = ("_index", "_levels", "_names")

    def __init__(self, leaves: Sequence[tuple[str, str, int]]) -> None:
        checked = _checked_leaves(leaves)
        for name, _, _ in checked:
            _name_bytes(name)
        checked.sort(key=lambda leaf: leaf[0])
        for previous, current in zip(checked, checked[1:], strict=False):
            if previous[0] == current[0]:
                raise InvalidParameterError(f"duplicate leaf name {current[0]!r}")
        self._names: tuple[str, ...] = tuple(name for name, _, _ in checked)
        self._index: dict[str, int] = {name: i for i, name in enumerate(self._names)}
        level = [leaf_hash(name, digest, size) for name, digest, size in checked]
        self._levels: list[list[bytes]] = [level]
        while len(level) > 1:
            parents = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                parents.append(level[-1])  # promoted, not duplicated
            level = parents
            self._levels.append(level)

    @property
    def root(self) -> str:
        """Root hash as lowercase hex (:data:`EMPTY_ROOT` when there are no leaves)."""
        top = self._levels[-1]
        return top[0].hex() if top else EMPTY_ROOT

    @property
    def names(self) -> tuple[str, ...]:
        """Leaf names in tree order (sorted)."""
        return self._names

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def proof(self, name: str) -> list[tuple[str, str]]:
        """Inclusion proof of leaf ``name``: ``(side, sibling_hash_hex)`` pairs from leaf to root."""
        if name not in self._index:
            raise InvalidParameterError(f"no leaf named {name!r} in the tree")
        position = self._index[name]
        steps: list[tuple[str, str]] = []
        for level in self._levels[:-1]:
            if position % 2:
                steps.append(("L", level[position - 1].hex()))
            elif position + 1 < len(level):
                steps.append(("R", level[position + 1].hex()))
            # else: the last node of an odd level is promoted; no step
            position //= 2
        return steps

    def __repr__(self) -> str:
        return f"MerkleTree(leaves={len(self)}, root={self.root})"

    @staticmethod
    def verify_proof(root_hex: str, name: str, sha256_hex: str, size: int, proof: Sequence[Sequence[str]]) -> bool:
        """Same as the module-level :func:`verify_proof`."""
        return verify_proof(root_hex, name, sha256_hex, size, proof)


def verify_proof(root_hex: str, name: str, sha256_hex: str, size: int, proof: Sequence[Sequence[str]]) -> bool:
    """Whether ``proof`` shows leaf ``(name, sha256_hex, size)`` is in the tree with root ``root_hex``.

    A malformed root or proof (wrong side letter, bad hex, wrong shape) gives
    ``False``; a malformed leaf (bad name, digest or size) raises
    :class:`~confide.errors.InvalidParameterError` like :func:`leaf_data`.
    Proof steps may be tuples or lists (as after a JSON round trip).
    """
    current = leaf_hash(name, sha256_hex, size)
    if not isinstance(root_hex, str) or not _HEX64.fullmatch(root_hex):
        return False
    if isinstance(proof, (str, bytes)):
        return False
    try:
        steps = list(proof)
    except TypeError:
        return False
    for step in steps:
        if isinstance(step, (str, bytes)) or not isinstance(step, Sequence) or len(step) != 2:
            return False
        side, sibling_hex = step
        if not isinstance(sibling_hex, str) or not _HEX64.fullmatch(sibling_hex):
            return False
        sibling = bytes.fromhex(sibling_hex)
        if side == "L":
            current = node_hash(sibling, current)
        elif side == "R":
            current = node_hash(current, sibling)
        else:
            return False
    return hmac.compare_digest(current, bytes.fromhex(root_hex))


def merkle_root(leaves: Sequence[tuple[str, str, int]]) -> str:
    """Root (hex) of the :class:`MerkleTree` over ``leaves``."""
    return MerkleTree(leaves).root
