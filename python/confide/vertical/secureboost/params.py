"""SecureBoost's hyper-parameters and limits (named and meant as in XGBoost)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from confide._checks import is_int, is_real
from confide.errors import InvalidParameterError
from confide.vertical.binning import MAX_BINS, MIN_BINS

#: Bits of each packed field (G and H): every sum over at most N rows stays below 2^62, so the
#: guest's plaintext sums are exact in int64 and the packed fields never carry into each other.
FIELD_BITS = 62
MIN_PRECISION_BITS = 8
MAX_ROWS = 1 << 30
Objective = Literal["binary:logistic", "reg:squarederror", "multi:softprob"]
MAX_CLASSES = 1000


@dataclass(frozen=True)
class SecureBoostParams:
    """Hyper-parameters, named and meant as in XGBoost (gamma: minimum gain to split)."""

    objective: Objective = "binary:logistic"
    n_trees: int = 5
    max_depth: int = 3
    learning_rate: float = 0.3
    reg_lambda: float = 1.0
    min_child_weight: float = 1.0
    gamma: float = 0.0
    n_bins: int = 32
    key_bits: int = 2048
    #: Initial prediction (a probability for binary:logistic); None: the mean label.
    base_score: float | None = None
    #: Worker threads for the crypto kernels (0: all cores).
    threads: int = 0
    #: multi:softprob only: the number of classes (labels 0..num_class-1); one tree per class per round.
    num_class: int | None = None
    #: Rows held out of training (drawn with ``seed``) to measure the validation loss after every
    #: boosting round: logloss, mlogloss or RMSE, as XGBoost's default eval metrics. 0: none.
    validation_fraction: float = 0.0
    #: Stop when the validation loss has not improved for this many rounds, and keep the model
    #: of the best round (needs ``validation_fraction``). None: train every round.
    early_stopping_rounds: int | None = None
    #: Seed of the validation split.
    seed: int = 0
    #: multi:softprob: encrypt a row's K classes in one ciphertext per round ("always"), one per
    #: class and tree ("never"), or decide each round from the last round's measured encryption
    #: and decryption costs ("auto"; round 0 never packs).
    pack_classes: str = "auto"

    def __post_init__(self) -> None:
        checks = [
            (
                "objective",
                self.objective in ("binary:logistic", "reg:squarederror", "multi:softprob"),
                "binary:logistic, reg:squarederror or multi:softprob",
            ),
            ("n_trees", is_int(self.n_trees) and 1 <= self.n_trees <= 10_000, "an int in 1..10000"),
            ("max_depth", is_int(self.max_depth) and 1 <= self.max_depth <= 16, "an int in 1..16"),
            ("learning_rate", is_real(self.learning_rate) and 0 < self.learning_rate <= 10, "a number in (0, 10]"),
            ("reg_lambda", is_real(self.reg_lambda) and 0 <= self.reg_lambda <= 1e6, "a number in [0, 1e6]"),
            (
                "min_child_weight",
                is_real(self.min_child_weight) and 0 <= self.min_child_weight <= 1e9,
                "a number in [0, 1e9]",
            ),
            ("gamma", is_real(self.gamma) and 0 <= self.gamma <= 1e9, "a number in [0, 1e9]"),
            (
                "n_bins",
                is_int(self.n_bins) and MIN_BINS + 1 <= self.n_bins <= MAX_BINS,
                f"an int in {MIN_BINS + 1}..{MAX_BINS}",
            ),
            ("key_bits", self.key_bits in (2048, 3072, 4096), "2048, 3072 or 4096"),
            ("threads", is_int(self.threads) and 0 <= self.threads <= 256, "an int in 0..256"),
            (
                "validation_fraction",
                is_real(self.validation_fraction) and 0 <= self.validation_fraction <= 0.5,
                "a number in [0, 0.5]",
            ),
            (
                "early_stopping_rounds",
                self.early_stopping_rounds is None
                or (is_int(self.early_stopping_rounds) and 1 <= self.early_stopping_rounds <= 10_000),
                "None or an int in 1..10000",
            ),
            ("seed", is_int(self.seed) and 0 <= self.seed < 2**32, "an int in 0..2^32-1"),
            ("pack_classes", self.pack_classes in ("auto", "always", "never"), "auto, always or never"),
        ]
        if self.objective == "multi:softprob":
            checks.append(
                (
                    "num_class",
                    is_int(self.num_class) and 3 <= self.num_class <= MAX_CLASSES,
                    f"an int in 3..{MAX_CLASSES}",
                )
            )
            checks.append(("base_score", self.base_score is None, "unset for multi:softprob (every class starts at 0)"))
        else:
            checks.append(
                ("num_class", self.num_class is None, f"unset for {self.objective} (it is for multi:softprob)")
            )
        for name, ok, rule in checks:
            if not ok:
                raise InvalidParameterError(f"secureboost.{name} must be {rule}, got {getattr(self, name)!r}")
        if self.early_stopping_rounds is not None and not self.validation_fraction:
            raise InvalidParameterError(
                f"secureboost.early_stopping_rounds={self.early_stopping_rounds} needs a validation set: "
                "set secureboost.validation_fraction (e.g. 0.1)"
            )
        if self.base_score is not None:
            low_ok = self.objective != "binary:logistic" or 0 < self.base_score < 1
            if not (is_real(self.base_score) and math.isfinite(self.base_score) and low_ok):
                raise InvalidParameterError(
                    "secureboost.base_score must be finite (and in (0, 1) for binary:logistic), "
                    f"got {self.base_score!r}"
                )

    @property
    def classes(self) -> int:
        """Trees per boosting round: ``num_class`` for multi:softprob, else 1."""
        return self.num_class if self.objective == "multi:softprob" else 1

    @property
    def slots(self) -> int:
        """Bin sums folded into one ciphertext."""
        return self.cells_per_ciphertext(1)

    def cells_per_ciphertext(self, classes: int) -> int:
        """(feature, bin) cells per folded ciphertext, each cell carrying ``classes`` (G, H) fields.

        0: not even one cell fits.
        """
        return (self.key_bits - 2) // (2 * FIELD_BITS * classes)
