"""Observers of a party's run, called at fixed points; two seams can change what a party sends.

A deployment can point ``CONFIDE_PARTY_HOOKS`` at an object with any of the methods of
:class:`PartyHooks` (``package.module:attribute`` or ``path/file.py:attribute``, as
``model.entry``) to watch a party from inside its process: monitoring, tracing, or, in the test
suite, fault injection (``tests/fixtures/faults.py`` makes a party die mid-round or pause after
each round). Production modules hold no fault-injection code of their own. Only
:meth:`PartyHooks.slice_encoded` and :meth:`PartyHooks.message_sent` change anything: what a
party's protected slices and relayed messages carry, for the suite's lying party
(``tests/fixtures/lying_party.py``: a lane overflow, a forged range proof); the parties' checks
must not depend on a party being honest, as they must not depend on the aggregator. The module sits at the
package root: the horizontal round loop (confide.party) and the vertical protocols (confide.vertical)
both call it, and neither may import the other.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["AggregatorHooks", "PartyHooks", "load_aggregator_hooks", "load_hooks"]

VARIABLE = "CONFIDE_PARTY_HOOKS"
AGGREGATOR_VARIABLE = "CONFIDE_AGGREGATOR_HOOKS"


class PartyHooks:
    """No-op observers; a hooks object may define any subset of these methods."""

    def round_started(self, round_number: int) -> None:
        """The round began: nothing of it has left the party yet (not even a mode's key shares)."""

    def round_opened(self, round_number: int) -> None:
        """The round's upload stream is open (its header went out)."""

    def round_released(self, round_number: int) -> None:
        """The round's agreements are done (secagg recovery: the shares went out); slices start to flow."""

    def round_summed(self, round_number: int) -> None:
        """The open attempt's first combined slice arrived (before the party decodes or unmasks it)."""

    def round_done(self, round_number: int) -> None:
        """The round completed and the party's report was written."""

    def message_waited(self, round_number: int) -> None:
        """A vertical party is about to wait for a peer's message of ``round_number``."""

    def rejoin_requested(self) -> None:
        """The restarted party asked its peers to take it back (again after each unanswered minute)."""

    def slice_encoded(self, round_number: int, index: int, payload: bytes) -> bytes:
        """Protected slice ``index`` as it leaves for the aggregator (unchanged but for a lying party)."""
        return payload

    def message_sent(self, round_number: int, tag: str, payload: bytes) -> bytes:
        """A message relayed to the peers, as it leaves (unchanged but for a lying party)."""
        return payload


class _Bound(PartyHooks):
    def __init__(self, target: Any) -> None:
        self.target = target

    def round_started(self, round_number: int) -> None:
        getattr(self.target, "round_started", lambda _: None)(round_number)

    def round_opened(self, round_number: int) -> None:
        getattr(self.target, "round_opened", lambda _: None)(round_number)

    def round_released(self, round_number: int) -> None:
        getattr(self.target, "round_released", lambda _: None)(round_number)

    def round_summed(self, round_number: int) -> None:
        getattr(self.target, "round_summed", lambda _: None)(round_number)

    def round_done(self, round_number: int) -> None:
        getattr(self.target, "round_done", lambda _: None)(round_number)

    def message_waited(self, round_number: int) -> None:
        getattr(self.target, "message_waited", lambda _: None)(round_number)

    def rejoin_requested(self) -> None:
        getattr(self.target, "rejoin_requested", lambda: None)()

    def slice_encoded(self, round_number: int, index: int, payload: bytes) -> bytes:
        method = getattr(self.target, "slice_encoded", None)
        return payload if method is None else method(round_number, index, payload)

    def message_sent(self, round_number: int, tag: str, payload: bytes) -> bytes:
        method = getattr(self.target, "message_sent", None)
        return payload if method is None else method(round_number, tag, payload)


def load_hooks() -> PartyHooks:
    """The hooks ``CONFIDE_PARTY_HOOKS`` names, or no-ops."""
    entry = os.environ.get(VARIABLE)
    if not entry:
        return PartyHooks()
    from confide.ml.custom import load_entry

    target = load_entry(entry, who=VARIABLE)
    return _Bound(target() if isinstance(target, type) else target)


class AggregatorHooks:
    """Where an aggregator's fold and delivery can be changed: the suite plays a lying aggregator here.

    The aggregator is untrusted by design (docs/crypto.md, "Verifiable aggregation"): nothing a
    party accepts depends on what these return, since every party checks the sums it is served.
    ``CONFIDE_AGGREGATOR_HOOKS`` names an object with either method (``tests/fixtures/lying.py``
    drops, replays, alters, swaps and equivocates); without it the aggregator runs neither.
    """

    def received(self, header, party: str, indices, lengths, payload: bytes) -> bytes:
        """The slices ``party`` pushed (``indices``, payloads of ``lengths`` bytes back to back), as folded."""
        return payload

    def deliver(self, header, index: int, payload: bytes, recipient: str) -> bytes:
        """Combined slice ``index`` as it goes to ``recipient``."""
        return payload


def load_aggregator_hooks() -> AggregatorHooks | None:
    """The aggregator hooks ``CONFIDE_AGGREGATOR_HOOKS`` names, or None (the data path untouched)."""
    entry = os.environ.get(AGGREGATOR_VARIABLE)
    if not entry:
        return None
    from confide.ml.custom import load_entry

    target = load_entry(entry, who=AGGREGATOR_VARIABLE)
    return target() if isinstance(target, type) else target
