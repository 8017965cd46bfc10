"""Hetero NN's hyper-parameters and fixed-point constants."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from confide.errors import InvalidParameterError
from confide.ml.netspec import MAX_BATCH_SIZE
from confide.vertical.netlayers import (
    ACTIVATIONS,
    NetSpec,
    parse_network,
)

OBJECTIVES = ("binary:logistic", "multi:softprob", "reg:squarederror")
FA, A_BOUND = 13, 8.0  # activation fraction bits, clip bound
FD, D_BOUND = 16, 128.0  # cut-gradient fraction bits, clip bound
FW = 32  # interactive host weights: fraction bits in Z_(2^64)
SIGMA = 40  # statistical masking bits
C_SHIFT = 40  # the learning-rate multiplier c as an integer / 2^40
RING = 1 << 64
E_OFFSET = 1 << (FA + 3)  # a_q + E_OFFSET >= 0 for |a| <= 8
E_BITS = FA + 5  # exponent bits of a_q + E_OFFSET (<= 2^(FA + 4))
D_Q_BITS = FD + 7  # |delta_q| <= 2^23
PREDICT_BATCH = 4096


@dataclass(frozen=True)
class HeteroNNParams:
    """Hyper-parameters; every party must use the same ones (checked in the first message)."""

    objective: str = "binary:logistic"
    num_class: int | None = None
    epochs: int = 10
    batch_size: int = 256
    learning_rate: float = 0.01  # Adam, bottom and top models
    interactive_learning_rate: float = 0.1  # SGD, the interactive layer
    guest_bottom: Any = ({"units": 8, "activation": "tanh"},)
    host_bottom: Any = ({"units": 8, "activation": "tanh"},)
    interactive_units: int = 8
    interactive_activation: str = "relu"
    top: Any = ()
    key_bits: int = 2048
    seed: int = 0
    threads: int = 0
    guest_net: NetSpec = field(init=False, repr=False, compare=False)
    host_net: NetSpec = field(init=False, repr=False, compare=False)
    top_net: NetSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise InvalidParameterError(f"objective {self.objective!r} is not one of {list(OBJECTIVES)}")
        if self.objective == "multi:softprob":
            if not isinstance(self.num_class, int) or not 3 <= self.num_class <= 1000:
                raise InvalidParameterError(
                    f"num_class must be an integer in 3..1000 for multi:softprob, got {self.num_class!r}"
                )
        elif self.num_class is not None:
            raise InvalidParameterError(f"num_class is for objective multi:softprob, not {self.objective}")
        _int("epochs", self.epochs, 1, 100_000)
        _int("batch_size", self.batch_size, 1, MAX_BATCH_SIZE)
        _int("interactive_units", self.interactive_units, 1, 64)
        _int("seed", self.seed, 0, 2**63 - 1)
        _int("threads", self.threads, 0, 1024)
        for name in ("learning_rate", "interactive_learning_rate"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 < float(value) <= 10.0:
                raise InvalidParameterError(f"{name} must be a number in (0, 10], got {value!r}")
        if self.key_bits not in (2048, 3072, 4096):
            raise InvalidParameterError(f"key_bits must be 2048, 3072 or 4096, got {self.key_bits!r}")
        if self.interactive_activation not in ACTIVATIONS:
            raise InvalidParameterError(
                f"interactive_activation {self.interactive_activation!r} is not one of {list(ACTIVATIONS)}"
            )
        object.__setattr__(self, "guest_net", parse_network(self.guest_bottom, "guest_bottom"))
        object.__setattr__(self, "host_net", parse_network(self.host_bottom, "host_bottom"))
        object.__setattr__(self, "top_net", parse_network(self.top, "top"))

    @property
    def outputs(self) -> int:
        """Width of the output layer (1, or num_class)."""
        return self.num_class if self.objective == "multi:softprob" else 1

    def host_dim(self, columns: int) -> int | None:
        """Width of a host's numpy bottom output for ``columns`` input columns.

        None for a framework bottom: the host builds it and says its width in its hello.
        """
        if self.host_net.kind != "dense":
            return None
        return self.host_net.layers[-1][0] if self.host_net.layers else columns

    def shared(self) -> dict:
        """What every party must agree on."""
        return {
            "objective": self.objective,
            "num_class": self.num_class or 0,
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "interactive_units": self.interactive_units,
            "interactive_learning_rate": float(self.interactive_learning_rate),
            "host_layers": self.host_net.shared(),
            "key_bits": self.key_bits,
            "seed": self.seed,
        }


def _int(name: str, value: Any, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidParameterError(f"{name} must be an integer in {low}..{high}, got {value!r}")
