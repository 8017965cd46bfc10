"""The seam between a party process and where its per-row work runs.

A :class:`LocalCompute` engine places one :class:`~confide.compute.partitions.PartitionRows`
holder per partition (in this process for ``inline``, in a Ray actor for ``ray``) and answers
:meth:`Holders.call`: the same method on every holder, the results in partition order. Holders
read their partition from the party's own disk and keep it; what comes back is sums and counts.

Everything a holder receives goes through :func:`check_shippable` first, so no engine can carry
a secret: Paillier secret keys, the protection modes' group and pair keys are refused by type,
whatever the engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from confide.errors import InvalidParameterError

__all__ = ["Holders", "LocalCompute", "SecretShippingError", "check_shippable", "peak_rss_mb"]


class SecretShippingError(InvalidParameterError):
    """A secret was about to leave the party process for a compute worker."""


#: Types that never cross to a worker (matched by module and class name, so this module imports
#: none of them): the Paillier secret key, the protection modes' pair and group keys, a PSI key,
#: the party's TLS identity.
_SECRET_TYPES = {
    ("confide.crypto", "DecryptionKey"),
    ("confide._native", "DecryptionKey"),
    ("confide._native", "PsiKey"),
    ("confide.protect.keys", "PeerKeys"),
    ("confide.protect.keys", "GroupCipher"),
    ("confide.transport.certs", "Identity"),
}


def check_shippable(values: Sequence[Any], where: str) -> None:
    """Raise :class:`SecretShippingError` if any of ``values`` is a secret.

    Looks inside lists, tuples, sets, dict values and dataclass fields, at any depth (each object
    once); other objects are judged by their type alone.
    """
    import dataclasses

    stack, seen = list(values), set()
    while stack:
        value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        kind = type(value)
        if (kind.__module__, kind.__qualname__) in _SECRET_TYPES:
            raise SecretShippingError(
                f"{where}: a {kind.__qualname__} must stay in the party process; compute workers get public "
                "material only"
            )
        if isinstance(value, list | tuple | set | frozenset):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            stack.extend(getattr(value, f.name) for f in dataclasses.fields(value))


class Holders(ABC):
    """The partition holders of one dataset on one engine."""

    #: Partitions, in order.
    count: int

    @abstractmethod
    def call(self, method: str, *args: Any) -> list[Any]:
        """``holder.method(*args)`` on every holder; results in partition order."""

    @abstractmethod
    def call_each(self, method: str, arguments: list[tuple]) -> list[Any]:
        """``holder_i.method(*arguments[i])`` on every holder i (its own slice of the work)."""

    @abstractmethod
    def pids(self) -> list[int]:
        """The process id of each holder (this process's for ``inline``)."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release the holders."""


class LocalCompute(ABC):
    """Where a party's per-partition work runs."""

    name: ClassVar[str]

    @abstractmethod
    def hold(self, holder_class: type, arguments: list[tuple]) -> Holders:
        """One ``holder_class(*arguments[i])`` per partition i, placed where this engine runs work."""

    @abstractmethod
    def map(self, function: Callable[..., Any], items: list[tuple]) -> list[Any]:
        """``function(*item)`` for every item, where this engine runs work; results in order.

        ``function`` must be a module-level function of ``confide`` (workers import it by name).
        """

    @property
    def workers(self) -> int:
        """How many items :meth:`map` runs at once (what a caller splits its work into)."""
        return 1

    def ranges(self, count: int, *, min_chunk: int = 1, parts: int | None = None) -> list[tuple[int, int]]:
        """``count`` items cut into contiguous ``(start, stop)`` ranges for :meth:`map` or :meth:`hold`.

        About two ranges per worker (``parts`` overrides) but never more than
        ``ceil(count / min_chunk)``, so small work is not scattered; as even as integer edges
        allow, in order, none empty.
        The one rule every split of a party's work follows (PSI blinding, encryption, histograms).
        """
        cuts = max(1, min(parts or 2 * self.workers, -(-count // max(1, min_chunk))))
        edges = [count * i // cuts for i in range(cuts + 1)]
        return [(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]

    def describe(self) -> dict[str, Any]:
        """What ran, for the party's report."""
        return {"engine": self.name}

    def close(self) -> None:  # noqa: B027 - optional
        """Stop what this engine started."""


def peak_rss_mb() -> float:
    """The most resident memory this process has held (VmHWM), in MiB.

    Not ``getrusage``'s ``ru_maxrss``: Linux carries that across ``exec``, so a party started by a
    big launcher would report the launcher's memory at fork.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
