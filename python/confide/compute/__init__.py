"""A party's local compute: where its per-row work runs (a party larger than one machine).

======== =================================================================== ==================
engine   where                                                               needs
======== =================================================================== ==================
inline   the party process (the default)                                     nothing extra
ray      Ray actors, one per partition, on the silo's Ray cluster or a        ``confide[ray]``
         local one (:mod:`confide.compute.ray_engine`)
======== =================================================================== ==================

Either way the party process stays the silo's one gRPC endpoint: workers read the party's own
files and answer the party process, never another party, the aggregator or the controller, and
nothing secret reaches them (:func:`~confide.compute.base.check_shippable`). Partitioned data
and what runs on it: :mod:`confide.compute.partitions`; docs/compute.md.

Adding an engine is one file with a :class:`~confide.compute.base.LocalCompute` plus one line
in :data:`ENGINES`.
"""

from __future__ import annotations

import importlib

from confide.compute.base import Holders, LocalCompute, SecretShippingError, check_shippable
from confide.errors import InvalidParameterError

__all__ = ["ENGINES", "Holders", "LocalCompute", "SecretShippingError", "check_shippable", "open_compute"]

#: Engine name -> "module:class".
ENGINES: dict[str, str] = {
    "inline": "confide.compute.inline:InlineCompute",
    "ray": "confide.compute.ray_engine:RayCompute",
}


def open_compute(text: str | None) -> LocalCompute:
    """The engine ``text`` names: ``inline``, ``ray`` (a local Ray instance) or ``ray:ADDRESS``."""
    name, _, address = (text or "inline").partition(":")
    if name not in ENGINES:
        raise InvalidParameterError(f"compute engine must be one of {', '.join(ENGINES)}, got {name!r}")
    module, _, attribute = ENGINES[name].partition(":")
    engine_class = getattr(importlib.import_module(module), attribute)
    if name == "inline":
        if address:
            raise InvalidParameterError(f"compute engine 'inline' takes no address, got {address!r}")
        return engine_class()
    return engine_class(address or None)
