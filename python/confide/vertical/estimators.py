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

__all__ = ["HeteroLogisticRegression", "SecureBoostClassifier", "SecureBoostRegressor"]


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
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        paths = {self.guest: directory / f"{self.guest}.model.cvw"}
        paths[self.guest].write_bytes(
            wire.encode({"algorithm": "secureboost", "role": "guest", "model": self.guest_model.to_dict()})
        )
        for host, model in self.host_models.items():
            paths[host] = directory / f"{host}.model.cvw"
            paths[host].write_bytes(wire.encode({"algorithm": "secureboost", "role": "host", "model": model.to_dict()}))
        return paths

    @classmethod
    def from_parts(cls, paths: dict[str, str | os.PathLike]):
        """An estimator from the parts a job wrote; the guest part names its hosts."""
        parts = {party: wire.decode(Path(path).read_bytes()) for party, path in paths.items()}
        guests = [p for p, part in parts.items() if part.get("role") == "guest"]
        if len(guests) != 1 or any(part.get("algorithm") != "secureboost" for part in parts.values()):
            raise InvalidParameterError("parts must be SecureBoost parts with exactly one guest part")
        guest_model = sb.SecureBoostGuestModel.from_dict(parts[guests[0]]["model"])
        missing = [h for h in guest_model.hosts if h not in parts]
        if missing:
            raise InvalidParameterError(f"missing the parts of hosts {missing}")
        estimator = cls.__new__(cls)
        estimator.params, estimator.guest, estimator.guest_model = guest_model.params, guests[0], guest_model
        estimator.host_models = {h: sb.SecureBoostHostModel.from_dict(parts[h]["model"]) for h in guest_model.hosts}
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
        labels = np.asarray(y, dtype=np.float64)
        top = int(labels.max()) if labels.size and np.isfinite(labels).all() else 1
        multi = top >= 2
        objective = "multi:softprob" if multi else "binary:logistic"
        self.params = replace(self.params, objective=objective, num_class=top + 1 if multi else None)
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
