r"""Federated data sets for tests, examples and benchmarks (no downloads).

:func:`breast_cancer_federation`
    scikit-learn's embedded Wisconsin diagnostic breast cancer data (569 rows, 30 features),
    with a stratified held-out test split and the training rows dealt to ``parties`` parties,
    either IID or label-skewed. Features are min-max scaled with the value ranges published in
    the data set's description (its "Min Max" summary table), i.e. a public schema: every party
    applies the identical transform without looking at anyone else's rows.

:func:`digits_federation`
    scikit-learn's embedded handwritten digits (1,797 images of 8x8 pixels, 10 classes) as
    images ``(n, 8, 8, 1)`` scaled to [0, 1], with a stratified held-out test split and the
    training images dealt IID or label-skewed (a class's images go to its "home" party
    ``c mod parties`` with probability ``skew``, else to any party). The neural-network demo.

:func:`text_federation`
    A generated text classification task as token ids (keywords among filler tokens), dealt
    like the digits; for fine-tuning a pretrained language model (``model.algorithm: hf``).

:func:`synthetic_tensors`
    One party's shard of random tensors of a given example shape, for measuring networks at
    their real sizes (benchmarks): images ``N(0, 1)`` with uniform labels, or token sequences
    (integers in ``[0, classes)``) whose label at each position is the next token.

:func:`synthetic_lr`
    One party's shard of a synthetic, heterogeneous binary classification task. It follows
    algorithms §7.1, the "Synthetic(alpha, beta)" generator of FedProx (Li et al., 2020), for
    party ``k`` with ``d`` features (``j = 1..d`` is the 1-based feature index)::

        u_k ~ N(0, alpha^2)            B_k ~ N(0, beta^2)
        W_k ~ N(u_k, 1)^d              b_k ~ N(u_k, 1)
        v_k ~ N(B_k, 1)^d              Sigma = diag(j^-1.2)
        x   = v_k + sqrt(diag Sigma) * N(0, I_d)
        y   = 1[x . W_k + b_k > 0]

    ``alpha`` controls how much the parties' models differ, ``beta`` how much their feature
    distributions differ. What differs from FedProx:

    * Labels are binary, ``1[logit > 0]``, instead of the argmax of a 10-class softmax (W_k is a
      vector, b_k a scalar). If a party's labels would all be one class, its logits are recentred
      by subtracting their median over the party's rows (train and test together), which splits
      that party about evenly. With many features this recentring is the common case, because
      ``v_k . W_k`` (spread ~ sqrt(d)) dwarfs the per-row noise (spread ~ 2-3).
    * Sparse variant (``density`` set): every entry of a row is non-zero independently with
      probability ``density`` (so a row has Binomial(d, density) non-zeros, at uniformly random
      positions; a row may be empty). A non-zero entry ``j`` takes the same per-feature value
      ``v_kj + j^-0.6 N(0, 1)`` as in the dense case, and the logit is the sparse product over
      the non-zeros only, ``sum_{j in nz(x)} x_j W_kj + b_k``.
    * Everything is generated in float32.
    * Every random draw is per party, from ``np.random.default_rng([seed, party])`` alone, so a
      party process generates its own shard without the others; draws run in a fixed order
      (``u_k, B_k, b_k, W_k, v_k``, then the rows), so a party's model parameters do not depend
      on ``parties`` or ``samples``. Only ``Sigma`` and the family of distributions are common
      to all parties. (``alpha = beta = 0`` therefore does not give FedProx's IID variant, in
      which one ``W, b`` is shared by all parties.)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from confide._checks import check_int as _check_int
from confide._checks import check_real as _check_real
from confide.errors import ConfideError, InvalidParameterError

__all__ = [
    "Federation",
    "breast_cancer_feature_ranges",
    "breast_cancer_federation",
    "digits_federation",
    "synthetic_lr",
    "synthetic_tensors",
    "text_federation",
]

#: Minimum rows of each class every party gets with ``split="label_skew"``.
MIN_ROWS_PER_CLASS = 10
_MAX_PARTIES = 50
_MAX_DENSE_ENTRIES = 1_000_000_000


# ---------------------------------------------------------------------- validation


# ---------------------------------------------------------------------- breast cancer


@dataclass(frozen=True)
class Federation:
    """A data set dealt to parties, plus a held-out test set that no party receives.

    Attributes
    ----------
    parts : list of (numpy.ndarray, numpy.ndarray)
        ``(X_i, y_i)`` of party ``i``: float64 features and int64 labels in {0, 1}.
    test : (numpy.ndarray, numpy.ndarray)
        The held-out ``(X, y)``.
    feature_names : list of str
        Column names, in order.
    description : str
        One line saying how the data were split.
    part_rows : list of numpy.ndarray
        Row indices of each part in the source data's own order (a party's catalog uses them
        to serve its raw, unscaled rows). Empty for data sets without a source order.
    """

    parts: list[tuple[np.ndarray, np.ndarray]]
    test: tuple[np.ndarray, np.ndarray]
    feature_names: list[str]
    description: str
    part_rows: list[np.ndarray] = field(default_factory=list)


_STAT_SUFFIX = {"mean": "mean {}", "standard error": "{} error", "worst": "worst {}"}
_ROW = re.compile(
    r"^(?P<feature>[a-z][a-z ]*?) \((?P<stat>mean|standard error|worst)\):\s+(?P<min>\S+)\s+(?P<max>\S+)\s*$"
)


def _parse_summary_ranges(descr: str, feature_names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Parse the "Min Max" summary table of the data set description, in ``feature_names`` order."""
    m = re.search(r":Summary Statistics:(.*?)(?:\n:[A-Z]|\Z)", descr, flags=re.S)
    if m is None:
        raise ConfideError("breast cancer description has no ':Summary Statistics:' section")
    section = m.group(1)
    if not re.search(r"^\s*Min\s+Max\s*$", section, flags=re.M):
        raise ConfideError("breast cancer summary table has no 'Min Max' header")
    rows = []
    for line in section.splitlines():
        hit = _ROW.match(line.strip())
        if hit is None:
            continue
        name = _STAT_SUFFIX[hit["stat"]].format(hit["feature"])
        try:
            lo, hi = float(hit["min"]), float(hit["max"])
        except ValueError:
            raise ConfideError(f"breast cancer summary row {line.strip()!r} has non-numeric Min/Max") from None
        rows.append((name, lo, hi))
    if len(rows) != len(feature_names):
        raise ConfideError(
            f"breast cancer summary table: parsed {len(rows)} Min/Max rows, expected {len(feature_names)}"
        )
    for (name, lo, hi), expected in zip(rows, feature_names, strict=True):
        if name != expected:
            raise ConfideError(f"breast cancer summary table: row {name!r} where {expected!r} was expected")
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ConfideError(f"breast cancer summary table: bad range [{lo}, {hi}] for {name!r}")
    return np.array([r[1] for r in rows]), np.array([r[2] for r in rows])


def _load_breast_cancer() -> Any:
    from confide.data.embedded import breast_cancer

    return breast_cancer()


def breast_cancer_feature_ranges() -> tuple[list[str], np.ndarray, np.ndarray]:
    """Return the published per-feature value ranges of the breast cancer data set.

    Parsed from the "Min Max" summary statistics table of ``load_breast_cancer().DESCR``
    (for example ``radius (mean): 6.981 28.11``) and checked against the column order.

    Returns
    -------
    feature_names : list of str
        The 30 column names.
    mins, maxs : numpy.ndarray
        float64, shape ``(30,)``.

    Raises
    ------
    ConfideError
        The table cannot be parsed, has a count other than 30, or its rows are out of order.
    """
    data = _load_breast_cancer()
    names = [str(n) for n in data.feature_names]
    lo, hi = _parse_summary_ranges(data.DESCR, names)
    return names, lo, hi


def _check_dealing(parties: Any, split: Any, skew: Any, test_fraction: Any, seed: Any) -> tuple[int, float, float, int]:
    """The arguments every embedded federation takes, checked."""
    parties = _check_int("parties", parties, 2, _MAX_PARTIES)
    if split not in ("iid", "label_skew"):
        raise InvalidParameterError(f"split must be 'iid' or 'label_skew', got {split!r}")
    skew = _check_real("skew", skew)
    if not 0.5 <= skew < 1.0:
        raise InvalidParameterError(f"skew must be in [0.5, 1), got {skew}")
    test_fraction = _check_real("test_fraction", test_fraction)
    if not 0.0 < test_fraction <= 0.5:
        raise InvalidParameterError(f"test_fraction must be in (0, 0.5], got {test_fraction}")
    return parties, skew, test_fraction, _check_int("seed", seed, 0)


def breast_cancer_federation(
    parties: int = 3,
    *,
    split: str = "iid",
    skew: float = 0.8,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> Federation:
    """Deal the Wisconsin diagnostic breast cancer data (scikit-learn, embedded) to parties.

    Steps, all driven by ``np.random.default_rng(seed)``:

    1. Stratified held-out test split: in each class, ``round(test_fraction * n_class)`` rows
       (at least 1) chosen at random go to ``test``; no party ever receives them.
    2. Scaling: ``(x - min) / (max - min)`` per feature, with the published ranges of
       :func:`breast_cancer_feature_ranges`, clipped to [0, 1] (the published ranges are
       rounded, so a few values fall just outside).
    3. Dealing the training rows:

       * ``"iid"``: shuffle, then cut into ``parties`` contiguous pieces whose sizes differ by
         at most one.
       * ``"label_skew"``: party ``i``'s major class is ``i % 2``. In each class ``c``
         (rows shuffled), every party first receives ``MIN_ROWS_PER_CLASS`` (10) rows, round
         robin. Each remaining row of class ``c`` then goes, with probability ``skew``, to a
         party whose major class is ``c``, and otherwise to a party whose major class is
         ``1 - c``, uniformly within that group. Parties with major class 0 (label 0 is
         malignant) thus see mostly malignant rows and the others mostly benign ones. With an
         odd number of parties, group 0 has one party more, so its parties are smaller.

    Each party's rows are finally shuffled.

    Parameters
    ----------
    parties : int, default 3
        Number of parties, in [2, 50].
    split : {"iid", "label_skew"}, default "iid"
        How training rows are dealt.
    skew : float, default 0.8
        Probability that a (non-reserved) row goes to its class's group, in [0.5, 1);
        used by ``"label_skew"`` only.
    test_fraction : float, default 0.2
        Share of the rows held out, in (0, 0.5].
    seed : int, default 0
        Seed, >= 0.

    Returns
    -------
    Federation
        ``parts`` and ``test`` hold float64 features in [0, 1] and int64 labels
        (0 = malignant, 1 = benign).

    Raises
    ------
    InvalidParameterError
        An argument is out of range, or ``"label_skew"`` cannot give every party 10 rows of
        each class.
    """
    parties, skew, test_fraction, seed = _check_dealing(parties, split, skew, test_fraction, seed)

    data = _load_breast_cancer()
    names = [str(n) for n in data.feature_names]
    lo, hi = _parse_summary_ranges(data.DESCR, names)
    X = np.clip((np.asarray(data.data, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0)
    y = np.asarray(data.target, dtype=np.int64)
    rng = np.random.default_rng(seed)

    test_idx, train_by_class = [], []
    for c in (0, 1):
        idx = rng.permutation(np.flatnonzero(y == c))
        k = max(1, round(test_fraction * idx.size))
        test_idx.append(idx[:k])
        train_by_class.append(idx[k:])
    test = np.sort(np.concatenate(test_idx))

    if split == "iid":
        train = rng.permutation(np.concatenate(train_by_class))
        shares = np.array_split(train, parties)
    else:
        for c, idx in enumerate(train_by_class):
            if idx.size < MIN_ROWS_PER_CLASS * parties:
                raise InvalidParameterError(
                    f"parties must be <= {idx.size // MIN_ROWS_PER_CLASS} for split='label_skew' with "
                    f"test_fraction={test_fraction}: class {c} has {idx.size} training rows and every party "
                    f"needs {MIN_ROWS_PER_CLASS}, got parties={parties}"
                )
        groups = [np.arange(c, parties, 2) for c in (0, 1)]
        owner_lists: list[list[np.ndarray]] = [[] for _ in range(parties)]
        for c, idx in enumerate(train_by_class):
            reserved = MIN_ROWS_PER_CLASS * parties
            for p in range(parties):
                owner_lists[p].append(idx[p:reserved:parties])
            rest = idx[reserved:]
            to_major = rng.random(rest.size) < skew
            group = np.where(to_major, c, 1 - c)
            pick = rng.random(rest.size)
            owner = np.where(
                group == 0,
                groups[0][(pick * groups[0].size).astype(np.int64)],
                groups[1][(pick * groups[1].size).astype(np.int64)],
            )
            for p in range(parties):
                owner_lists[p].append(rest[owner == p])
        shares = [rng.permutation(np.concatenate(lists)) for lists in owner_lists]

    parts = [(X[s], y[s]) for s in shares]
    n_train = sum(s.size for s in shares)
    detail = f", skew {skew}" if split == "label_skew" else ""
    description = (
        f"breast_cancer (Wisconsin diagnostic, scikit-learn): {parties} parties, {split} split{detail}, "
        f"{n_train} training rows, {test.size} held-out test rows (stratified, test_fraction {test_fraction}), "
        f"features min-max scaled with the published ranges, seed {seed}"
    )
    return Federation(
        parts=parts, test=(X[test], y[test]), feature_names=names, description=description, part_rows=list(shares)
    )


def digits_federation(
    parties: int = 3,
    *,
    split: str = "iid",
    skew: float = 0.8,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> Federation:
    """Deal scikit-learn's embedded digits (8x8 images, 10 classes) to parties.

    Steps, all driven by ``np.random.default_rng(seed)``: a stratified held-out test split
    (``round(test_fraction * n_class)`` images of each class); pixels scaled to [0, 1] (divided
    by 16, the data set's maximum, a public constant); then ``"iid"``: shuffle and cut into
    ``parties`` pieces of sizes differing by at most one; ``"label_skew"``: every training image
    of class ``c`` goes to party ``c mod parties`` with probability ``skew`` and otherwise to a
    uniformly drawn party. Each party's images are finally shuffled.

    Returns
    -------
    Federation
        ``parts`` and ``test`` hold float32 images ``(n, 8, 8, 1)`` and int64 labels 0..9.
    """
    from confide.data.embedded import digits

    parties, skew, test_fraction, seed = _check_dealing(parties, split, skew, test_fraction, seed)
    data = digits()
    X = (np.asarray(data.images, dtype=np.float32) / 16.0)[..., None]
    y = np.asarray(data.target, dtype=np.int64)
    test, train, shares = _deal_by_class(
        y, 10, parties, split, skew, test_fraction, np.random.default_rng(seed), "images"
    )
    detail = f", skew {skew}" if split == "label_skew" else ""
    description = (
        f"digits (scikit-learn, 8x8 images, 10 classes): {parties} parties, {split} split{detail}, "
        f"{train.size} training images, {test.size} held-out test images, seed {seed}"
    )
    return Federation(
        parts=[(X[s], y[s]) for s in shares],
        test=(X[test], y[test]),
        feature_names=[f"pixel_{r}_{c}" for r in range(8) for c in range(8)],
        description=description,
        part_rows=list(shares),
    )


def _deal_by_class(
    y: np.ndarray, classes: int, parties: int, split: str, skew: float, test_fraction: float, rng, what: str
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """A stratified test split and the training rows dealt to parties: ``(test, train, shares)``.

    ``round(test_fraction * n_class)`` rows of each class are held out; then ``"iid"`` shuffles
    the rest and cuts it into ``parties`` pieces of sizes differing by at most one, and
    ``"label_skew"`` sends each row of class ``c`` to party ``c mod parties`` with probability
    ``skew``, else to a uniformly drawn party. Each party's rows are finally shuffled.
    """
    test_idx, train_idx = [], []
    for c in range(classes):
        idx = rng.permutation(np.flatnonzero(y == c))
        k = max(1, round(test_fraction * idx.size))
        test_idx.append(idx[:k])
        train_idx.append(idx[k:])
    test = np.sort(np.concatenate(test_idx))
    train = rng.permutation(np.concatenate(train_idx))
    if split == "iid":
        return test, train, np.array_split(train, parties)
    home = y[train] % parties
    other = rng.integers(0, parties, size=train.size)
    owner = np.where(rng.random(train.size) < skew, home, other)
    shares = [rng.permutation(train[owner == p]) for p in range(parties)]
    if min(s.size for s in shares) == 0:
        raise InvalidParameterError(f"label_skew left a party without {what}; use fewer than {parties} parties")
    return test, train, shares


def text_federation(
    parties: int = 3,
    *,
    samples: int = 2000,
    length: int = 24,
    classes: int = 2,
    vocabulary: int = 1000,
    split: str = "iid",
    skew: float = 0.8,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> Federation:
    """A generated text classification task as token ids, dealt to parties (fine-tuning a language model).

    Token 0 is padding; tokens ``1 .. 4 * classes`` are keywords, four for each class; the rest
    of the ``vocabulary`` is filler. A document of class ``c`` has a length drawn uniformly in
    ``[length // 2, length]``, made of filler tokens with two of class ``c``'s keywords at
    random positions (and, in half the documents, one keyword of another class, so counting
    matters, not mere presence); it is padded with 0 to ``length``. Everything is drawn from
    ``np.random.default_rng(seed)``; the rows are then split and dealt as
    :func:`digits_federation` deals images.

    Returns
    -------
    Federation
        ``parts`` and ``test`` hold int64 token ids ``(n, length)`` and int64 labels.
    """
    parties, skew, test_fraction, seed = _check_dealing(parties, split, skew, test_fraction, seed)
    samples = _check_int("samples", samples, 20, 10_000_000)
    length = _check_int("example_shape[0] (the sequence length)", length, 4, 100_000)
    classes = _check_int("classes", classes, 2, 100)
    keywords = 4 * classes
    vocabulary = _check_int("vocabulary", vocabulary, keywords + 2, 10_000_000)
    if samples * length > _MAX_DENSE_ENTRIES:
        raise InvalidParameterError(
            f"samples x length must be at most {_MAX_DENSE_ENTRIES:,}, got {samples * length:,}"
        )
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, size=samples).astype(np.int64)
    lengths = rng.integers(length // 2, length + 1, size=samples)
    X = rng.integers(keywords + 1, vocabulary, size=(samples, length)).astype(np.int64)
    X[np.arange(length)[None, :] >= lengths[:, None]] = 0
    rows = np.arange(samples)
    # Distinct positions inside each document: the first three of a random order of its length.
    order = np.argsort(rng.random((samples, length)) + (np.arange(length)[None, :] >= lengths[:, None]), axis=1)
    for k in range(2):
        X[rows, order[:, k]] = 1 + 4 * y + rng.integers(0, 4, size=samples)
    decoy = rng.random(samples) < 0.5
    other = (y + rng.integers(1, classes, size=samples)) % classes
    X[rows[decoy], order[decoy, 2]] = 1 + 4 * other[decoy] + rng.integers(0, 4, size=int(decoy.sum()))
    test, train, shares = _deal_by_class(y, classes, parties, split, skew, test_fraction, rng, "documents")
    detail = f", skew {skew}" if split == "label_skew" else ""
    description = (
        f"text (generated: {classes} classes told apart by keywords, documents of {length // 2}-{length} "
        f"tokens from a vocabulary of {vocabulary}): {parties} parties, {split} split{detail}, "
        f"{train.size} training documents, {test.size} held-out test documents, seed {seed}"
    )
    return Federation(
        parts=[(X[s], y[s]) for s in shares],
        test=(X[test], y[test]),
        feature_names=[f"token_{i}" for i in range(length)],
        description=description,
        part_rows=list(shares),
    )


def synthetic_tensors(
    party: int,
    parties: int,
    *,
    samples: int,
    example_shape: tuple[int, ...],
    classes: int,
    sequence: bool = False,
    test_fraction: float = 0.1,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Party ``party``'s ``samples`` random examples (and a test split), drawn from ``[seed, party]``.

    Images (``sequence=False``): float32 ``N(0, 1)`` of ``(samples, *example_shape)``, int64 labels
    uniform in ``[0, classes)``. Sequences (``sequence=True``, ``example_shape = (length,)``): int32
    tokens uniform in ``[0, classes)``; the label of position ``t`` is the token at ``t + 1`` (the
    last position's is a fresh draw), shape ``(samples, length)``. Nothing here is learnable; it
    gives networks inputs of the right shapes and cost.
    """
    party = _check_int("party", party, 0, parties - 1)
    samples = _check_int("samples", samples, 2, 10_000_000)
    classes = _check_int("classes", classes, 2, 1_000_000)
    if not example_shape or math.prod(example_shape) * samples > _MAX_DENSE_ENTRIES:
        raise InvalidParameterError(
            f"example_shape {list(example_shape)} x samples {samples} must be non-empty and at most "
            f"{_MAX_DENSE_ENTRIES:,} values"
        )
    rng = np.random.default_rng([seed, party])
    total = samples + max(1, round(samples * test_fraction))
    if sequence:
        if len(example_shape) != 1:
            raise InvalidParameterError(f"sequences take example_shape [length], got {list(example_shape)}")
        tokens = rng.integers(0, classes, size=(total, example_shape[0] + 1)).astype(np.int32)
        X, y = tokens[:, :-1], tokens[:, 1:].astype(np.int64)
    else:
        X = rng.standard_normal((total, *example_shape), dtype=np.float32)
        y = rng.integers(0, classes, size=total).astype(np.int64)
    return X[:samples], y[:samples], X[samples:], y[samples:]


# ---------------------------------------------------------------------- synthetic


def synthetic_lr(
    party: int,
    parties: int,
    *,
    samples: int,
    features: int,
    density: float | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    seed: int = 0,
    test_fraction: float = 0.1,
) -> tuple[Any, np.ndarray, Any, np.ndarray]:
    """One party's shard of the binary, optionally sparse, FedProx Synthetic(alpha, beta) task.

    The generator, and how it differs from FedProx, is described in the module docstring.
    The shard depends on ``(seed, party)`` and on its size only; each party can generate its
    own without the others.

    Parameters
    ----------
    party : int
        This party's index, in [0, parties).
    parties : int
        Number of parties, in [1, 100_000].
    samples : int
        Rows over all parties, >= 10 * parties. Party ``k`` gets ``samples // parties`` rows;
        the last party also takes the remainder.
    features : int
        Number of features ``d``, in [1, 100_000_000].
    density : float, optional
        If given, in (0, 1]: return scipy.sparse CSR matrices whose entries are non-zero with
        this probability. If None, return dense arrays (at most 1e9 entries per shard).
    alpha, beta : float, default 1.0
        Standard deviations of ``u_k`` and ``B_k``, finite and >= 0.
    seed : int, default 0
        Seed, >= 0.
    test_fraction : float, default 0.1
        The last ``floor(test_fraction * rows)`` rows of the shard form its test set, in [0, 0.5].

    Returns
    -------
    X_train, y_train, X_test, y_test
        Features as float32 numpy arrays (or float32 ``scipy.sparse.csr_matrix`` with
        ``density``) and int64 labels in {0, 1}.

    Raises
    ------
    InvalidParameterError
        An argument is out of range (the message names it and the limit).
    """
    parties = _check_int("parties", parties, 1, 100_000)
    party = _check_int("party", party, 0, parties - 1)
    samples = _check_int("samples", samples, 10 * parties, 1_000_000_000)
    features = _check_int("features", features, 1, 100_000_000)
    if density is not None:
        density = _check_real("density", density)
        if not 0.0 < density <= 1.0:
            raise InvalidParameterError(f"density must be in (0, 1], got {density}")
    alpha = _check_real("alpha", alpha)
    beta = _check_real("beta", beta)
    if alpha < 0:
        raise InvalidParameterError(f"alpha must be >= 0, got {alpha}")
    if beta < 0:
        raise InvalidParameterError(f"beta must be >= 0, got {beta}")
    seed = _check_int("seed", seed, 0)
    test_fraction = _check_real("test_fraction", test_fraction)
    if not 0.0 <= test_fraction <= 0.5:
        raise InvalidParameterError(f"test_fraction must be in [0, 0.5], got {test_fraction}")

    n = samples // parties + (samples % parties if party == parties - 1 else 0)
    if density is None and n * features > _MAX_DENSE_ENTRIES:
        raise InvalidParameterError(
            f"samples // parties * features must be <= {_MAX_DENSE_ENTRIES} for dense shards, got "
            f"{n} * {features}; pass density for a sparse shard"
        )

    rng = np.random.default_rng([seed, party])
    u = alpha * rng.standard_normal()
    big_b = beta * rng.standard_normal()
    b = np.float32(u + rng.standard_normal())
    W = rng.standard_normal(features, dtype=np.float32)
    W += np.float32(u)
    v = rng.standard_normal(features, dtype=np.float32)
    v += np.float32(big_b)
    scale = np.arange(1, features + 1, dtype=np.float64) ** -0.6  # sqrt(j^-1.2)

    if density is None:
        X = _dense_rows(rng, n, v, scale.astype(np.float32))
    else:
        X = _sparse_rows(rng, n, features, density, v, scale)
    logits = np.asarray(X @ W).reshape(-1)
    logits += b
    y = logits > 0
    if y.all() or not y.any():
        y = logits > np.median(logits)
    y = y.astype(np.int64)

    n_test = math.floor(test_fraction * n)
    n_train = n - n_test
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


def _dense_rows(rng: np.random.Generator, n: int, v: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``v + scale * N(0, I)`` for ``n`` rows, float32, filled in chunks of about 16 MiB."""
    d = v.size
    X = np.empty((n, d), dtype=np.float32)
    step = max(1, (4 << 20) // d)
    for start in range(0, n, step):
        block = X[start : start + step]
        rng.standard_normal(out=block, dtype=np.float32)
        block *= scale
        block += v
    return X


def _sparse_rows(rng: np.random.Generator, n: int, d: int, density: float, v: np.ndarray, scale: np.ndarray) -> Any:
    """CSR rows whose entries are non-zero independently with probability ``density``.

    The positions of the non-zeros in the flattened ``n * d`` grid are the partial sums of
    Geometric(density) gaps, which costs O(non-zeros) and yields them already sorted.
    """
    import scipy.sparse

    total = n * d
    expected = total * density
    chunks, last = [], -1
    while True:
        size = int(expected - (last + 1) * density + 6 * math.sqrt(expected) + 64)
        pos = np.cumsum(rng.geometric(density, size=size).astype(np.int64))
        pos += last
        chunks.append(pos)
        last = int(pos[-1])
        if last >= total:
            break
    flat = np.concatenate(chunks)
    flat = flat[: np.searchsorted(flat, total)]
    rows, cols = np.divmod(flat, d)
    values = rng.standard_normal(flat.size, dtype=np.float32)
    values *= scale[cols].astype(np.float32)
    values += v[cols]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    index_dtype = np.int32 if max(d, flat.size) < 2**31 else np.int64
    return scipy.sparse.csr_matrix((values, cols.astype(index_dtype), indptr.astype(index_dtype)), shape=(n, d))
