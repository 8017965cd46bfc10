"""A message format for the vertical protocols, without pickle (a peer's bytes are never executed).

Messages are nested mappings of numbers, strings, bytes and numpy arrays.

Layout: ``b"CVW1"``, a 4-byte big-endian header length, a UTF-8 JSON header, then the raw
buffers back to back. In the header a ``bytes`` value is ``{"$b": [offset, length]}`` and an
array is ``{"$a": [offset, length], "dtype": "<f8", "shape": [..]}``. Decoding checks every
offset, length, dtype and shape against the message, so a malformed or hostile message is a
:class:`ProtocolError` naming what is wrong.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np

from confide.errors import ProtocolError

__all__ = ["MAX_DEPTH", "decode", "encode"]

MAGIC = b"CVW1"
MAX_DEPTH = 16
#: dtypes a message may carry (numeric only: object arrays would need pickle).
DTYPES = frozenset(
    np.dtype(name).str
    for name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64")
)


def encode(message: dict) -> bytes:
    """Serialize ``message`` (a dict with str keys)."""
    if not isinstance(message, dict):
        raise TypeError(f"a message must be a dict, got {type(message).__name__}")
    buffers: list[bytes] = []
    offset = [0]

    def add(data: bytes) -> list[int]:
        start = offset[0]
        buffers.append(data)
        offset[0] += len(data)
        return [start, len(data)]

    def walk(value: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise TypeError(f"message nested deeper than {MAX_DEPTH}")
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, (int, np.integer)):
            return int(value)
        if isinstance(value, (float, np.floating)):
            value = float(value)
            if value != value or value in (float("inf"), float("-inf")):
                return {"$f": repr(value)}
            return value
        if isinstance(value, (bytes, bytearray, memoryview)):
            return {"$b": add(bytes(value))}
        if isinstance(value, np.ndarray):
            array = np.ascontiguousarray(value)
            if array.dtype.str not in DTYPES:
                raise TypeError(f"arrays of dtype {array.dtype} cannot travel in a message")
            return {"$a": add(array.tobytes()), "dtype": array.dtype.str, "shape": list(array.shape)}
        if isinstance(value, (list, tuple)):
            return [walk(item, depth + 1) for item in value]
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if not isinstance(key, str) or key.startswith("$"):
                    raise TypeError(f"message keys must be strings not starting with '$', got {key!r}")
                out[key] = walk(item, depth + 1)
            return out
        raise TypeError(f"a {type(value).__name__} cannot travel in a message")

    header = json.dumps(walk(message, 0), separators=(",", ":"), allow_nan=False).encode()
    return b"".join([MAGIC, struct.pack(">I", len(header)), header, *buffers])


def decode(data: bytes) -> dict:
    """Parse a message made by :func:`encode`; raises :class:`ProtocolError` if malformed."""
    view = memoryview(data)
    if len(view) < 8 or bytes(view[:4]) != MAGIC:
        raise ProtocolError("message: missing the CVW1 magic")
    (header_length,) = struct.unpack(">I", view[4:8])
    if 8 + header_length > len(view):
        raise ProtocolError(f"message: header of {header_length} bytes overruns a {len(view)}-byte message")
    try:
        header = json.loads(bytes(view[8 : 8 + header_length]))
    except (ValueError, RecursionError) as error:
        raise ProtocolError(f"message: header is not JSON or nested too deeply ({error})") from None
    body = view[8 + header_length :]

    def span(ref: Any, where: str) -> memoryview:
        if not (isinstance(ref, list) and len(ref) == 2 and all(type(x) is int and x >= 0 for x in ref)):
            raise ProtocolError(f"message: {where}: bad buffer reference {ref!r}")
        start, length = ref
        if start + length > len(body):
            raise ProtocolError(f"message: {where}: buffer [{start}, {start + length}) beyond {len(body)} bytes")
        return body[start : start + length]

    def walk(value: Any, where: str, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise ProtocolError(f"message: {where}: nested deeper than {MAX_DEPTH}")
        if isinstance(value, list):
            return [walk(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
        if not isinstance(value, dict):
            return value
        if "$b" in value:
            return bytes(span(value["$b"], where))
        if "$f" in value:
            text = value["$f"]
            if text not in ("nan", "inf", "-inf"):
                raise ProtocolError(f"message: {where}: bad float {text!r}")
            return float(text)
        if "$a" in value:
            dtype, shape = value.get("dtype"), value.get("shape")
            if not isinstance(dtype, str) or dtype not in DTYPES:
                raise ProtocolError(f"message: {where}: dtype {dtype!r} is not allowed")
            if not (isinstance(shape, list) and all(type(s) is int and s >= 0 for s in shape)):
                raise ProtocolError(f"message: {where}: bad shape {shape!r}")
            raw = span(value["$a"], where)
            expected = math.prod(shape) * np.dtype(dtype).itemsize  # Python ints: no overflow
            if expected != len(raw):
                raise ProtocolError(
                    f"message: {where}: shape {shape} of {dtype} needs {expected} bytes, has {len(raw)}"
                )
            return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        return {key: walk(item, f"{where}.{key}", depth + 1) for key, item in value.items()}

    message = walk(header, "message", 0)
    if not isinstance(message, dict):
        raise ProtocolError("message: the top level must be a mapping")
    return message
