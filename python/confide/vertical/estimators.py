"""scikit-learn-style estimators over the vertical protocols.

Each estimator holds every party's part of a model and runs the real protocols — every party's
side in its own thread, talking through an in-memory :class:`LocalChannel` with the same
messages as the runtime — so a data scientist can fit, predict and score a vertical model in one
process (experiments, tests), or load the parts a runtime job wrote (``<party>.model.cvw``) and
predict with them::

    model = SecureBoostClassifier(n_trees=5, max_depth=3).fit({"bank": X_bank, "shop": X_shop}, y, guest="bank")
    model.predict_proba({"bank": X_bank_new, "shop": X_shop_new})[:, 1]

    model = SecureBoostClassifier.from_parts({"bank": "parties/bank.model.cvw", "shop": "parties/shop.model.cvw"})

The party holding the labels is ``guest`` (default: the first key). Rows of the parties' matrices
must be aligned (same record per row); align real data with :func:`confide.vertical.psi.intersect`.
"""

from __future__ import annotations

import os
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from confide.errors import InvalidParameterError
from confide.vertical import secureboost as sb
from confide.vertical import wire
from confide.vertical.channel import LocalChannel, run_parties

__all__ = [
    "HeteroLogisticRegression",
    "HeteroNNClassifier",
    "HeteroNNRegressor",
    "SecureBoostClassifier",
    "SecureBoostRegressor",
]


def _parts(X_parts: dict, guest: str | None) -> tuple[str, list[str], dict[str, np.ndarray]]:
    if not isinstance(X_parts, dict) or len(X_parts) < 2:
        raise InvalidParameterError("X_parts must map at least two party names to their column blocks")
    guest = guest or next(iter(X_parts))
    if guest not in X_parts:
        raise InvalidParameterError(f"guest {guest!r} is not one of the parties {list(X_parts)}")
    arrays = {p: np.asarray(x, dtype=np.float64) for p, x in X_parts.items()}
    rows = {p: x.shape[0] for p, x in arrays.items()}
    if len(set(rows.values())) != 1:
        raise InvalidParameterError(f"the parties' blocks must have the same rows (aligned records), got {rows}")
    return guest, [p for p in arrays if p != guest], arrays


def _save_parts(directory: str | os.PathLike, algorithm: str, guest: str, models: dict) -> dict[str, Path]:
    """Each party's part as ``<party>.model.cvw`` (what a runtime job writes)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for party, model in models.items():
        role = "guest" if party == guest else "host"
        paths[party] = directory / f"{party}.model.cvw"
        paths[party].write_bytes(wire.encode({"algorithm": algorithm, "role": role, "model": model.to_dict()}))
    return paths


def _load_parts(paths: dict[str, str | os.PathLike], algorithm: str, guest_class) -> tuple[str, object, dict]:
    """(guest, guest model, every part's model mapping) from the parts a job wrote."""
    parts = {party: wire.decode(Path(path).read_bytes()) for party, path in paths.items()}
    guests = [p for p, part in parts.items() if part.get("role") == "guest"]
    if len(guests) != 1 or any(part.get("algorithm") != algorithm for part in parts.values()):
        raise InvalidParameterError(f"parts must be {algorithm} parts with exactly one guest part")
    guest_model = guest_class.from_dict(parts[guests[0]]["model"])
    missing = [h for h in guest_model.hosts if h not in parts]
    if missing:
        raise InvalidParameterError(f"missing the parts of hosts {missing}")
    return guests[0], guest_model, {p: part["model"] for p, part in parts.items()}


def _label_objective(y) -> tuple[str, int | None]:
    """binary:logistic for 0/1 labels, multi:softprob with K classes for labels 0..K-1 (K >= 3)."""
    labels = np.asarray(y, dtype=np.float64)
    top = int(labels.max()) if labels.size and np.isfinite(labels).all() else 1
    return ("multi:softprob", top + 1) if top >= 2 else ("binary:logistic", None)


class _SecureBoost:
    _objective = "binary:logistic"

    def __init__(self, **params) -> None:
        names = {f.name for f in fields(sb.SecureBoostParams)} - {"objective", "num_class"}
        unknown = set(params) - names
        if unknown:
            raise InvalidParameterError(f"unknown SecureBoost parameters {sorted(unknown)}; known: {sorted(names)}")
        self.params = sb.SecureBoostParams(objective=self._objective, **params)
        self.guest_model: sb.SecureBoostGuestModel | None = None
        self.host_models: dict[str, sb.SecureBoostHostModel] = {}
        self.guest: str | None = None
        self._session = 0

    def fit(self, X_parts: dict, y, *, guest: str | None = None):
        """Train with the secure protocol (one thread per party)."""
        guest, hosts, arrays = _parts(X_parts, guest)
        channels = LocalChannel.group([guest, *hosts], timeout_s=3600)
        jobs = {guest: lambda: sb.train_guest(channels[guest], hosts, arrays[guest], np.asarray(y), self.params, "fit")}
        for host in hosts:
            jobs[host] = lambda h=host: sb.serve_host(channels[h], guest, arrays[h], "fit", threads=self.params.threads)
        out = run_parties(jobs)
        self.guest, self.guest_model = guest, out[guest]
        self.host_models = {h: out[h] for h in hosts}
        return self

    def _margin(self, X_parts: dict) -> np.ndarray:
        if self.guest_model is None:
            raise InvalidParameterError("the model is not fitted: call fit() or from_parts() first")
        guest, hosts, arrays = _parts(X_parts, self.guest)
        if sorted(hosts) != sorted(self.host_models):
            raise InvalidParameterError(f"X_parts must hold the parties {[self.guest, *self.host_models]}")
        self._session += 1
        session = f"predict-{self._session}"
        channels = LocalChannel.group([guest, *hosts], timeout_s=3600)
        jobs = {guest: lambda: sb.predict_margin(channels[guest], self.guest_model, arrays[guest], session)}
        for host in hosts:
            jobs[host] = lambda h=host: sb.serve_host(channels[h], guest, arrays[h], session, model=self.host_models[h])
        return run_parties(jobs)[guest]

    def feature_importance(self) -> list[dict]:
        """Per splitting feature (party, index): split count, total and mean gain, as the guest sees it."""
        if self.guest_model is None:
            raise InvalidParameterError("the model is not fitted: call fit() or from_parts() first")
        return self.guest_model.feature_importance()

    def save_parts(self, directory: str | os.PathLike) -> dict[str, Path]:
        """Write each party's part as ``<party>.model.cvw`` (what a runtime job writes)."""
        return _save_parts(directory, "secureboost", self.guest, {self.guest: self.guest_model, **self.host_models})

    @classmethod
    def from_parts(cls, paths: dict[str, str | os.PathLike]):
        """An estimator from the parts a job wrote; the guest part names its hosts."""
        guest, guest_model, parts = _load_parts(paths, "secureboost", sb.SecureBoostGuestModel)
        estimator = cls.__new__(cls)
        estimator.params, estimator.guest, estimator.guest_model = guest_model.params, guest, guest_model
        estimator.host_models = {h: sb.SecureBoostHostModel.from_dict(parts[h]) for h in guest_model.hosts}
        estimator._session = 0
        return estimator


class SecureBoostClassifier(_SecureBoost):
    """SecureBoost classification; parameters as :class:`SecureBoostParams`.

    Labels 0/1 train ``binary:logistic``; labels 0..K-1 with K >= 3 train ``multi:softprob``
    (one tree per class per round), decided at :meth:`fit` from the labels.
    """

    _objective = "binary:logistic"

    def fit(self, X_parts: dict, y, *, guest: str | None = None):
        """Train with the secure protocol (one thread per party); the labels choose binary or multi-class."""
        objective, num_class = _label_objective(y)
        self.params = replace(self.params, objective=objective, num_class=num_class)
        return super().fit(X_parts, y, guest=guest)

    def predict_proba(self, X_parts: dict) -> np.ndarray:
        """Class probabilities, shape (rows, classes)."""
        margin = self._margin(X_parts)
        if self.params.objective == "multi:softprob":
            return sb.softmax(margin)
        p = 1.0 / (1.0 + np.exp(-margin))
        return np.column_stack([1 - p, p])

    def predict(self, X_parts: dict) -> np.ndarray:
        """Predicted classes."""
        return self.predict_proba(X_parts).argmax(axis=1)


class SecureBoostRegressor(_SecureBoost):
    """SecureBoost regression (reg:squarederror)."""

    _objective = "reg:squarederror"

    def predict(self, X_parts: dict) -> np.ndarray:
        """Predicted values."""
        return self._margin(X_parts)


class HeteroLogisticRegression:
    """Hetero LR without an arbiter (:mod:`confide.vertical.hetero_lr`); parameters as HeteroLRParams."""

    def __init__(self, **params) -> None:
        from confide.vertical.hetero_lr import HeteroLRParams

        self.params = HeteroLRParams(**params)
        self.guest: str | None = None
        self.models: dict = {}
        self._session = 0

    def fit(self, X_parts: dict, y, *, guest: str | None = None):
        """Train with the secure protocol (one thread per party)."""
        from confide.vertical import hetero_lr as lr

        guest, hosts, arrays = _parts(X_parts, guest)
        channels = LocalChannel.group([guest, *hosts], timeout_s=3600)
        jobs = {guest: lambda: lr.train_guest(channels[guest], hosts, arrays[guest], np.asarray(y), self.params, "fit")}
        for host in hosts:
            jobs[host] = lambda h=host: lr.train_host(channels[h], guest, hosts, arrays[h], self.params, "fit")
        self.models = run_parties(jobs)
        self.guest = guest
        return self

    def predict_proba(self, X_parts: dict) -> np.ndarray:
        """Class probabilities, shape (rows, 2)."""
        from confide.vertical import hetero_lr as lr

        if not self.models:
            raise InvalidParameterError("the model is not fitted: call fit() first")
        guest, hosts, arrays = _parts(X_parts, self.guest)
        self._session += 1
        session = f"predict-{self._session}"
        channels = LocalChannel.group([guest, *hosts], timeout_s=3600)
        jobs = {guest: lambda: lr.predict_guest(channels[guest], hosts, arrays[guest], self.models[guest], session)}
        for host in hosts:
            jobs[host] = lambda h=host: lr.predict_host(channels[h], guest, arrays[h], self.models[h], session)
        p = np.asarray(run_parties(jobs)[guest], dtype=np.float64)
        return np.column_stack([1 - p, p])

    def predict(self, X_parts: dict) -> np.ndarray:
        """Predicted classes 0/1."""
        return (self.predict_proba(X_parts)[:, 1] >= 0.5).astype(int)


class _HeteroNN:
    """Hetero NN (:mod:`confide.vertical.hetero_nn`); parameters as HeteroNNParams (``epochs``, ...)."""

    _objective = "binary:logistic"

    def __init__(self, **params) -> None:
        from confide.vertical.hetero_nn import HeteroNNParams

        names = {f.name for f in fields(HeteroNNParams) if f.init} - {"objective", "num_class"}
        unknown = set(params) - names
        if unknown:
            raise InvalidParameterError(f"unknown Hetero NN parameters {sorted(unknown)}; known: {sorted(names)}")
        self.params = HeteroNNParams(objective=self._objective, **params)
        self.guest: str | None = None
        self.models: dict = {}
        self._session = 0

    def fit(self, X_parts: dict, y, *, guest: str | None = None):
        """Train with the secure protocol (one thread per party)."""
        from confide.vertical import hetero_nn as nn

        guest, hosts, arrays = _parts(X_parts, guest)
        channels = LocalChannel.group([guest, *hosts], timeout_s=3600)
        labels = np.asarray(y)
        jobs = {guest: lambda: nn.train_guest(channels[guest], hosts, arrays[guest], labels, self.params, "fit")}
        for host in hosts:
            jobs[host] = lambda h=host: nn.train_host(channels[h], guest, arrays[h], self.params, "fit")
        self.models = run_parties(jobs)
        self.guest = guest
        return self

    def _scores(self, X_parts: dict) -> np.ndarray:
        from confide.vertical import hetero_nn as nn

        if not self.models:
            raise InvalidParameterError("the model is not fitted: call fit() or from_parts() first")
        guest, hosts, arrays = _parts(X_parts, self.guest)
        if sorted(hosts) != sorted(h for h in self.models if h != self.guest):
            raise InvalidParameterError(f"X_parts must hold the parties {list(self.models)}")
        self._session += 1
        session = f"predict-{self._session}"
        channels = LocalChannel.group([guest, *hosts], timeout_s=3600)
        jobs = {guest: lambda: nn.predict_guest(channels[guest], hosts, arrays[guest], self.models[guest], session)}
        for host in hosts:
            jobs[host] = lambda h=host: nn.predict_host(channels[h], guest, arrays[h], self.models[h], session)
        return np.asarray(run_parties(jobs)[guest], dtype=np.float64)

    def save_parts(self, directory: str | os.PathLike) -> dict[str, Path]:
        """Write each party's part as ``<party>.model.cvw`` (what a runtime job writes)."""
        return _save_parts(directory, "hetero_nn", self.guest, self.models)

    @classmethod
    def from_parts(cls, paths: dict[str, str | os.PathLike]):
        """An estimator from the parts a job wrote; the guest part names its hosts."""
        from confide.vertical import hetero_nn as nn

        guest, guest_model, parts = _load_parts(paths, "hetero_nn", nn.HeteroNNGuestModel)
        estimator = cls.__new__(cls)
        estimator.params, estimator.guest, estimator._session = guest_model.params, guest, 0
        estimator.models = {guest: guest_model}
        estimator.models.update({h: nn.HeteroNNHostModel.from_dict(parts[h]) for h in guest_model.hosts})
        return estimator


class HeteroNNClassifier(_HeteroNN):
    """Hetero NN classification: labels 0/1 train a sigmoid head, 0..K-1 (K >= 3) a softmax head."""

    def fit(self, X_parts: dict, y, *, guest: str | None = None):
        """Train with the secure protocol; the labels choose binary or multi-class."""
        objective, num_class = _label_objective(y)
        self.params = replace(self.params, objective=objective, num_class=num_class)
        return super().fit(X_parts, y, guest=guest)

    def predict_proba(self, X_parts: dict) -> np.ndarray:
        """Class probabilities, shape (rows, classes)."""
        scores = self._scores(X_parts)
        return scores if scores.ndim == 2 else np.column_stack([1 - scores, scores])

    def predict(self, X_parts: dict) -> np.ndarray:
        """Predicted classes."""
        return self.predict_proba(X_parts).argmax(axis=1)


class HeteroNNRegressor(_HeteroNN):
    """Hetero NN regression (reg:squarederror)."""

    _objective = "reg:squarederror"

    def predict(self, X_parts: dict) -> np.ndarray:
        """Predicted values."""
        return self._scores(X_parts)
