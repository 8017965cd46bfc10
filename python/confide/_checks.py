"""Argument checks shared by the pure-Python modules (messages name the field and the limit)."""

from __future__ import annotations

import numbers
from typing import Any

from confide.errors import InvalidParameterError

__all__ = ["check_int"]


def check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` as an int in [low, high] (no upper limit when ``high`` is None); bools are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidParameterError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        limit = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InvalidParameterError(f"{name} must be {limit}, got {value}")
    return value
