"""Models trained by the federated runtime.

:class:`HomoLR` is binary logistic regression for horizontal federated learning: every party
runs :meth:`HomoLR.local_train` on its own rows and the runtime averages the weights (FedAvg).
"""

from confide.ml.homo_lr import HomoLR

__all__ = ["HomoLR"]
