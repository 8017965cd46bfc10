"""Level-1 routing across aggregator nodes (algorithms.md §6.2)."""

from __future__ import annotations

import pytest

from confide import _native
from confide.errors import TransportUnavailableError
from confide.transport.routing import mix64, node_for, serving_node, session_hash, share_indices


def test_mix64_is_the_native_one():
    for value in (0, 1, 2**32 + 7, 2**64 - 1, session_hash("job-1")):
        assert mix64(value) == _native.agg_mix64(value)


@pytest.mark.parametrize("nodes", [1, 2, 3, 7])
def test_consecutive_slices_spread_round_robin_and_shares_partition(nodes):
    owners = [node_for("job-x", i, nodes, layer=4) for i in range(50)]
    for a, b in zip(owners, owners[1:], strict=False):
        assert b == (a + 1) % nodes
    shares = [share_indices("job-x", k, nodes, 50, layer=4) for k in range(nodes)]
    assert sorted(i for share in shares for i in share) == list(range(50))
    for k, share in enumerate(shares):
        assert all(node_for("job-x", i, nodes, layer=4) == k for i in share)


def test_same_index_same_node_across_parties_and_rounds():
    # Routing depends on the session and the slice only: parties joining never move a slice.
    assert [node_for("s", i, 5) for i in range(20)] == [node_for("s", i, 5) for i in range(20)]


def test_layers_start_on_different_nodes():
    starts = {node_for("job-y", 0, 8, layer=layer) for layer in range(32)}
    assert len(starts) > 1


def test_lost_node_moves_only_its_share():
    assert serving_node(2, 4, lost=[]) == 2
    assert serving_node(2, 4, lost=[2]) == 3
    assert serving_node(3, 4, lost=[3]) == 0
    assert serving_node(1, 4, lost=[2]) == 1
    assert serving_node(2, 4, lost=[2, 3]) == 0
    with pytest.raises(TransportUnavailableError, match="every one of the 2"):
        serving_node(0, 2, lost=[0, 1])
