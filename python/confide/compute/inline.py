"""``inline``: the holders live in the party process (one after the other, no second process)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from confide.compute.base import Holders, LocalCompute, check_shippable

__all__ = ["InlineCompute"]


class _InlineHolders(Holders):
    def __init__(self, holders: list[Any]) -> None:
        self.holders = holders
        self.count = len(holders)

    def call(self, method: str, *args: Any) -> list[Any]:
        check_shippable(args, f"inline {method}")
        return [getattr(holder, method)(*args) for holder in self.holders]

    def call_each(self, method: str, arguments: list[tuple]) -> list[Any]:
        if len(arguments) != self.count:
            raise ValueError(f"call_each {method}: {len(arguments)} argument tuples for {self.count} holders")
        for args in arguments:
            check_shippable(args, f"inline {method}")
        return [getattr(holder, method)(*args) for holder, args in zip(self.holders, arguments, strict=True)]

    def pids(self) -> list[int]:
        return [os.getpid()] * self.count

    def close(self) -> None:
        self.holders = []


class InlineCompute(LocalCompute):
    """Every partition held and computed in this process, in order."""

    name = "inline"

    def hold(self, holder_class: type, arguments: list[tuple]) -> Holders:
        """Build the holders here."""
        for args in arguments:
            check_shippable(args, f"inline {holder_class.__name__}")
        return _InlineHolders([holder_class(*args) for args in arguments])

    def map(self, function: Callable[..., Any], items: list[tuple]) -> list[Any]:
        """Each item in turn, here."""
        for item in items:
            check_shippable(item, f"inline {function.__name__}")
        return [function(*item) for item in items]
