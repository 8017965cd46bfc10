"""Fuzz target: the aggregator's ``PushSlices`` handler, fed one party's stream of raw messages.

The input is a stream (4-byte length frames): the first message should be a ``PushMessage``
with a ``RoundHeader``, the next ones slices or slice batches, parsed in place by the native
``agg_parse_batch`` and folded by the data plane. Whatever the bytes, the handler must end the
call with a gRPC status (``context.abort``) or a reply; any other exception escaping it is a
finding (gRPC would answer UNKNOWN and log a traceback).
"""

from __future__ import annotations

import _common

_common.quiet_threads()
with _common.instrumented(__name__):
    from confide.aggregator.service import AggregationServicer, AggregatorConfig, AggregatorCore

ALLOWED: tuple[type[BaseException], ...] = ()
PARTY = "a"


class Aborted(Exception):
    """``context.abort`` was called: the call ended with a status (the documented outcome)."""


class FakeContext:
    """The parts of a ``grpc.ServicerContext`` the handler uses; the caller's certificate names ``party``."""

    def __init__(self, party: str) -> None:
        self._party = party
        self.code = None

    def auth_context(self) -> dict:
        """The verified certificate's common name, as gRPC reports it."""
        return {"x509_common_name": [self._party.encode()]}

    def abort(self, code, details: str):
        """End the call with a status (raises, like gRPC's)."""
        self.code = code
        raise Aborted(f"{code}: {details}")

    def is_active(self) -> bool:
        """The call is over once the handler returns."""
        return False


ALLOWED = (Aborted,)
_core: list[AggregatorCore] = []


def _fresh_core() -> AggregatorCore:
    """A core without state from earlier inputs (the previous one is closed)."""
    if _core:
        _core.pop().close()
    core = AggregatorCore(AggregatorConfig(workers=1, data_port=None, round_timeout_s=3600.0))
    _core.append(core)
    return core


def fuzz_one(data: bytes) -> None:
    """Push the input's messages as one stream from party ``a``."""
    servicer = AggregationServicer(_fresh_core(), "aggregator")
    reply = servicer.PushSlices(iter(list(_common.frames(data))), FakeContext(PARTY))
    assert reply.accepted >= 0


if __name__ == "__main__":
    _common.main(fuzz_one, ALLOWED)
