"""Confide: cross-silo federated learning whose updates stay hidden from the coordinator.

The crypto core lives in :mod:`confide.crypto`; errors in :mod:`confide.errors`.
"""

from confide.errors import ConfideError

__all__ = ["ConfideError", "__version__"]
__version__ = "0.1.0"
