"""The aggregator process: streaming, slice-wise aggregation that never holds key material."""

from confide.aggregator.core import AggregatorConfig, AggregatorCore
from confide.aggregator.service import serve

__all__ = ["AggregatorConfig", "AggregatorCore", "serve"]
