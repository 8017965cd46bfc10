"""A vertical host's partitioned columns (confide.vertical.columns): PSI, exact binning and
SecureBoost on holders give what the same rows in one matrix give."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from confide.compute import open_compute
from confide.compute.partitions import PartitionTask, list_partitions
from confide.data.fldata import FLData
from confide.errors import InvalidParameterError
from confide.vertical import secureboost as sb
from confide.vertical.binning import Binner
from confide.vertical.channel import LocalChannel, run_parties
from confide.vertical.columns import ColumnRows, PartitionedColumns
from confide.vertical.psi import intersect
from tests.fixtures.keys import fixed_native_key
from tests.fixtures.partitions import host_fl_data, write_columns

KEY = fixed_native_key()


class ArrayRows(ColumnRows):
    """A holder built from arrays (values provisioning would refuse: NaN, inf, -0.0)."""

    def __init__(self, X: np.ndarray, start: int) -> None:
        self.index, self.party, self.error, self.views = start, "lab", None, {}
        self.X, self.ids, self.features = X, np.arange(start, start + len(X)), [f"f{j}" for j in range(X.shape[1])]


def array_columns(X: np.ndarray, sizes: list[int]) -> PartitionedColumns:
    edges = np.concatenate([[0], np.cumsum(sizes)])
    holders = open_compute("inline").hold(
        ArrayRows, [(X[a:b], int(a)) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    )
    return PartitionedColumns(holders, holders.call("shape"), {"engine": "inline"})


def awkward_matrix(rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = np.column_stack(
        [
            rng.normal(0, 1, rows),
            np.round(rng.normal(0, 3, rows)),  # many ties
            np.full(rows, 2.5),  # constant
            rng.exponential(1.0, rows) * 1e-300,  # subnormal-sized
            -rng.pareto(1.5, rows),  # heavy negative tail
            rng.choice([-0.0, 0.0, 1.0], rows),  # signed zeros
            np.full(rows, np.nan),  # all missing
        ]
    )
    X[rng.random(rows) < 0.1, 0] = np.nan
    return X


@pytest.mark.parametrize("n_bins", [2, 3, 17, 32, 256])
def test_cut_points_found_across_holders_are_binner_fit_on_the_rows_together(n_bins):
    X = awkward_matrix(3000, n_bins)
    columns = array_columns(X, [1200, 0, 900, 900])
    rows = np.random.default_rng(1).permutation(3000)[:2100]
    view = columns.view("train", rows)
    binner = view.fit(n_bins, "lab")
    expected = Binner.fit(X[rows], n_bins)
    for j, (mine, theirs) in enumerate(zip(binner.cuts, expected.cuts, strict=True)):
        assert np.array_equal(mine, theirs), j
    # every holder binned its rows of the view as the whole matrix would be binned
    for p, holder in enumerate(columns.holders.holders):
        assert np.array_equal(holder.views["train"]["bins"], expected.transform(X[rows])[:, view.members[p]])


def test_an_infinite_value_is_named_as_binner_fit_names_it():
    X = awkward_matrix(200, 0)
    X[150, 3] = np.inf
    view = array_columns(X, [100, 100]).view("train", np.arange(200))
    with pytest.raises(InvalidParameterError, match="lab: column 3 holds an infinite value"):
        view.fit(8, "lab")


@pytest.fixture(scope="module")
def vertical(tmp_path_factory):
    """Guest columns and labels in memory; the host's columns in 4 files with shuffled ids."""
    X, y = load_breast_cancer(return_X_y=True)
    rng = np.random.default_rng(3)
    ids = rng.permutation(10_000)[: len(y)]
    host_rows = rng.permutation(len(y))[:500]  # the host holds 500 of the 569 records, in its own order
    root = write_columns(tmp_path_factory.mktemp("lab") / "cols", ids[host_rows], X[host_rows, 12:], [140, 120, 0, 240])
    return {
        "ids": ids,
        "X_guest": X[:, :12],
        "y": y.astype(float),
        "host_ids": ids[host_rows],
        "X_host": X[host_rows, 12:],
        "root": root,
    }


def open_host(vertical, engine):
    task = PartitionTask(party="lab", dataset="cols", fl_data=FLData.create(**host_fl_data()).to_dict())
    return PartitionedColumns.open(engine, task, list_partitions(vertical["root"], "cols"), "id")


def psi_rows(vertical, host_ids, engine=None):
    channels = LocalChannel.group(["hospital", "lab"])
    common = dict(guest="hospital", hosts=["lab"], session="s")
    return run_parties(
        {
            "hospital": lambda: intersect(channels["hospital"], vertical["ids"], role="guest", **common),
            "lab": lambda: intersect(channels["lab"], host_ids, role="host", engine=engine, **common),
        },
        timeout=60,
    )


def fit(vertical, g_rows, host_train, host_test, params):
    channels = LocalChannel.group(["hospital", "lab"])
    X, y = vertical["X_guest"][g_rows], vertical["y"][g_rows]
    train, test = np.arange(0, len(g_rows), 2), np.arange(1, len(g_rows), 2)

    def guest():
        model = sb.train_guest(channels["hospital"], ["lab"], X[train], y[train], params, "train", key=KEY)
        return model, sb.predict_guest(channels["hospital"], model, X[test], "test")

    def host():
        lookup = sb.serve_host(channels["lab"], "hospital", host_train, "train")
        return sb.serve_host(channels["lab"], "hospital", host_test, "test", model=lookup)

    out = run_parties({"hospital": guest, "lab": host}, timeout=300)
    return out["hospital"], out["lab"]


@pytest.mark.slow
def test_a_partitioned_host_aligns_bins_and_grows_the_trees_of_its_rows_in_one_matrix(vertical):
    engine = open_compute("inline")
    columns = open_host(vertical, engine)
    assert len(columns) == 500 and columns.features == [f"f{j}" for j in range(18)]
    held = psi_rows(vertical, columns, engine)
    whole = psi_rows(vertical, vertical["host_ids"])
    assert np.array_equal(held["hospital"], whole["hospital"]) and np.array_equal(held["lab"], whole["lab"])
    g_rows, h_rows = held["hospital"], held["lab"]
    assert np.array_equal(vertical["ids"][g_rows], vertical["host_ids"][h_rows])
    train, test = np.arange(0, len(g_rows), 2), np.arange(1, len(g_rows), 2)
    params = sb.SecureBoostParams(n_trees=3, max_depth=3, validation_fraction=0.2, n_bins=16)
    (m1, p1), lookup1 = fit(
        vertical, g_rows, columns.view("train", h_rows[train]), columns.view("test", h_rows[test]), params
    )
    X_host = vertical["X_host"][h_rows]
    (m2, p2), lookup2 = fit(vertical, g_rows, X_host[train], X_host[test], params)
    assert m1.splits() == m2.splits() and len(m1.splits()) == 3
    assert any(owner == 0 for tree in m1.splits() for _, owner, _, _ in tree), "the host owns no split"
    assert np.array_equal(p1, p2)
    assert sorted(lookup1.lookup.values()) == sorted(lookup2.lookup.values())
    columns.close()


def test_ids_repeated_across_files_are_refused_naming_the_partition(vertical, tmp_path):
    ids = np.concatenate([vertical["host_ids"][:100], vertical["host_ids"][50:60]])
    root = write_columns(tmp_path / "cols", ids, vertical["X_host"][:110], [100, 10])
    task = PartitionTask(party="lab", dataset="cols", fl_data=FLData.create(**host_fl_data()).to_dict())
    engine = open_compute("inline")
    columns = PartitionedColumns.open(engine, task, list_partitions(root, "cols"), "id")
    with pytest.raises(InvalidParameterError, match=r"an id of partition 0 \(part-000.parquet, row 50\) repeats"):
        psi_rows(vertical, columns, engine)
    with pytest.raises(InvalidParameterError, match="need the engine that holds them"):
        psi_rows(vertical, columns)


def test_a_holder_that_fails_during_psi_aborts_the_psi_so_the_guest_stops_naming_the_host(vertical, tmp_path):
    task = PartitionTask(party="lab", dataset="cols", fl_data=FLData.create(**host_fl_data()).to_dict())
    engine = open_compute("inline")
    columns = PartitionedColumns.open(engine, task, list_partitions(vertical["root"], "cols"), "id")

    def broken(method, *args):
        raise InvalidParameterError("partition 2 (part-003.parquet): cannot read the Parquet data: gone")

    columns.holders.call = broken
    channels = LocalChannel.group(["hospital", "lab"])
    common = dict(guest="hospital", hosts=["lab"], session="s")
    errors = {}

    def party(name, job):
        try:
            job()
        except InvalidParameterError as error:
            errors[name] = error
        except Exception as error:  # noqa: BLE001 - the test reads it
            errors[name] = error

    import threading

    threads = [
        threading.Thread(
            target=party,
            args=("hospital", lambda: intersect(channels["hospital"], vertical["ids"], role="guest", **common)),
        ),
        threading.Thread(
            target=party,
            args=("lab", lambda: intersect(channels["lab"], columns, role="host", engine=engine, **common)),
        ),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert "the partitions failed" in str(errors["lab"]) and "part-003.parquet" in str(errors["lab"])
    assert "PSI aborted by the host 'lab': its ids are unusable (its partitions failed)" in str(errors["hospital"])
