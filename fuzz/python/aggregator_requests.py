"""Fuzz target: the aggregator's unary and server-streaming requests (``Relay.Send``, ``FetchResult``).

gRPC parses these messages before the handler runs (bytes protobuf cannot parse are gRPC's to
refuse); the first byte picks the request type, the rest is its serialized form. Whatever the
fields hold, the handler must end with a reply or a status (``context.abort``), nothing else.
"""

from __future__ import annotations

import _common
from google.protobuf.message import DecodeError

_common.quiet_threads()
with _common.instrumented(__name__):
    from confide.aggregator.service import AggregationServicer, AggregatorConfig, AggregatorCore, RelayServicer
    from confide.v1 import runtime_pb2 as pb

from push_stream import Aborted, FakeContext  # noqa: E402 - after the instrumented imports

ALLOWED = (Aborted,)
PARTY = "a"
_core: list[AggregatorCore] = []


def fuzz_one(data: bytes) -> None:
    """Hand ``data[1:]`` to ``Send`` (even first byte) or ``FetchResult`` (odd)."""
    if not data:
        return
    if _core:
        _core.pop().close()
    core = AggregatorCore(AggregatorConfig(workers=1, data_port=None))
    _core.append(core)
    context = FakeContext(PARTY)
    try:
        if data[0] % 2 == 0:
            request = pb.Envelope.FromString(data[1:])
        else:
            request = pb.FetchRequest.FromString(data[1:])
    except DecodeError:
        return
    if data[0] % 2 == 0:
        reply = RelayServicer(core).Send(request, context)
        assert reply.delivered == len(request.recipients)
    else:
        for item in AggregationServicer(core, "aggregator").FetchResult(request, context):
            assert isinstance(item, pb.AggregatedSlice)


if __name__ == "__main__":
    _common.main(fuzz_one, ALLOWED)
