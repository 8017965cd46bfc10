"""The aggregator process: streaming, slice-wise aggregation that never holds key material."""

from confide.aggregator.service import AggregatorConfig, AggregatorCore, serve

__all__ = ["AggregatorConfig", "AggregatorCore", "serve"]
