"""Argument checks shared by the pure-Python modules (messages name the field and the limit)."""

from __future__ import annotations

import math
import numbers
from typing import Any, TypeVar

from confide.errors import InvalidParameterError, ProtocolError

__all__ = ["check_int", "check_real", "is_int", "is_real", "require"]

T = TypeVar("T")


def require(value: T | None, what: str) -> T:
    """``value``, or a :class:`ProtocolError` saying which step must come first.

    Protocol state (keys after ``setup``, codecs after ``begin_round``) is checked with this, not
    ``assert``: under ``python -O`` an assert disappears and the failure becomes an
    ``AttributeError`` on ``None`` far from its cause.
    """
    if value is None:
        raise ProtocolError(f"protocol step out of order: {what}")
    return value


def is_int(value: Any) -> bool:
    """Whether ``value`` is a Python int (bools and numpy integers are not: parameters stay JSON-safe)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """Whether ``value`` is a Python int or float (bools are not)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` as an int in [low, high] (no upper limit when ``high`` is None); bools are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidParameterError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        limit = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InvalidParameterError(f"{name} must be {limit}, got {value}")
    return value


def check_real(name: str, value: Any, *, low: float | None = None, strict: bool = False) -> float:
    """``value`` as a finite float; with ``low``, also ``> low`` (``strict``) or ``>= low``. Bools are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidParameterError(
            f"{name} must be a {'real' if low is not None else 'finite real'} number, got {value!r}"
        )
    value = float(value)
    if low is None:
        if not math.isfinite(value):
            raise InvalidParameterError(f"{name} must be a finite real number, got {value!r}")
        return value
    if not math.isfinite(value) or (value <= low if strict else value < low):
        raise InvalidParameterError(f"{name} must be {'>' if strict else '>='} {low:g} and finite, got {value!r}")
    return value
