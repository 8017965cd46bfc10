"""The ``ray`` engine: a local Ray instance, one actor per partition (skipped without Ray installed)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from confide.compute import SecretShippingError, open_compute
from confide.compute.partitions import PartitionedData, PartitionRows, PartitionTask, list_partitions
from confide.data.fldata import FLData
from confide.ml.homo_lr import HomoLR
from confide.vertical.binning import Binner
from tests.fixtures.keys import fixed_key, fixed_native_key
from tests.fixtures.partitions import fl_data

# A Ray head per module and worker processes per test: the fast tier leaves Ray out.
pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'confide[ray]'; make test installs it)")


@pytest.fixture(scope="module")
def engine():
    compute = open_compute("ray")
    yield compute
    compute.close()


def hold(compute, root):
    partitions = list_partitions(root, "rows")
    task = PartitionTask(party="p1", dataset="rows", fl_data=FLData.create(**fl_data("p1")).to_dict())
    holders = compute.hold(PartitionRows, [(task, p) for p in partitions])
    return PartitionedData(holders, holders.call("shape"), engine=compute.describe())


def test_partitions_live_in_worker_processes_and_give_inline_results(engine, partitioned):
    on_ray, inline = hold(engine, partitioned), hold(open_compute("inline"), partitioned)
    assert on_ray.shapes == inline.shapes
    pids = on_ray.holders.pids()
    assert len(set(pids)) == 4 and os.getpid() not in pids
    w = np.random.default_rng(1).normal(0, 0.3, len(on_ray.features) + 1)
    # Same rows, same arithmetic; a worker's BLAS may split a product over other threads: 1e-12.
    for (g1, l1, n1), (g2, l2, n2) in zip(on_ray.call("lr_gradient", w), inline.call("lr_gradient", w), strict=True):
        assert np.allclose(g1, g2, rtol=1e-12, atol=1e-12) and l1 == pytest.approx(l2, rel=1e-12) and n1 == n2
    a = HomoLR(learning_rate=0.5, local_epochs=5, batch_size=0)
    b = HomoLR(learning_rate=0.5, local_epochs=5, batch_size=0)
    a.initialize(len(on_ray.features))
    b.initialize(len(on_ray.features))
    a.train_partitioned(on_ray)
    b.train_partitioned(inline)
    assert np.allclose(a.get_weights(), b.get_weights(), rtol=1e-12, atol=1e-12)
    assert on_ray.engine["engine"] == "ray" and on_ray.engine["nodes"] >= 1
    on_ray.holders.close()


class SlowRows(PartitionRows):
    """A holder whose gradient takes long enough to be killed in the middle of it."""

    def slow_gradient(self, w):
        time.sleep(3.0)
        return self.lr_gradient(w)


def test_a_worker_killed_mid_call_is_restarted_and_the_call_retried(engine, partitioned):
    import sys

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import the tests
    partitions = list_partitions(partitioned, "rows")
    task = PartitionTask(party="p1", dataset="rows", fl_data=FLData.create(**fl_data("p1")).to_dict())
    holders = engine.hold(SlowRows, [(task, p) for p in partitions])
    data = PartitionedData(holders, holders.call("shape"))
    w = np.random.default_rng(2).normal(0, 0.3, len(data.features) + 1)
    expected = data.call("lr_gradient", w)
    victim = data.holders.pids()[1]
    pending = [actor.slow_gradient.remote(w) for actor in data.holders.actors]
    time.sleep(1.0)  # every call is now sleeping inside its worker
    os.kill(victim, signal.SIGKILL)
    results = ray.get(pending, timeout=120)
    for (g1, l1, n1), (g2, l2, n2) in zip(results, expected, strict=True):
        assert np.array_equal(g1, g2) and l1 == l2 and n1 == n2
    deadline = time.monotonic() + 60
    while victim in data.holders.pids() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert victim not in data.holders.pids()  # a new process holds partition 1, rebuilt from its file
    data.holders.close()


def test_no_secret_reaches_a_ray_worker(engine, partitioned):
    data = hold(engine, partitioned)
    key = fixed_key()
    with pytest.raises(SecretShippingError, match="DecryptionKey must stay in the party process"):
        data.call("lr_loss", key, "train")
    with pytest.raises(SecretShippingError):
        engine.hold(PartitionRows, [(key, None)])
    data.holders.close()


@pytest.mark.slow
def test_gradients_encrypted_by_ray_tasks_decrypt_to_the_plaintexts(engine):
    from confide.compute.tasks import encrypt_raw_on

    key = fixed_native_key()
    plaintexts = [int(v).to_bytes(16, "big") for v in np.random.default_rng(6).integers(0, 2**62, 3000)]
    vector = encrypt_raw_on(engine, key.encryption_key, plaintexts, min_chunk=500)
    assert [int.from_bytes(b, "big") for b in key.decrypt_raw(vector)] == [int.from_bytes(p, "big") for p in plaintexts]


def test_a_workers_data_error_reaches_the_party_as_itself(engine, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from confide.errors import DataProblemError

    root = tmp_path / "rows"
    root.mkdir()
    pq.write_table(pa.table({"x0": [1.0, float("nan"), 3.0], "label": [0.0, 1.0, 0.0]}), root / "part-000.parquet")
    task = PartitionTask(party="p1", dataset="rows", fl_data=FLData.create(**fl_data("p1", steps=[])).to_dict())
    holders = engine.hold(PartitionRows, [(task, p) for p in list_partitions(root, "rows")])
    with pytest.raises(DataProblemError, match=r"partition 0.*feature column 'x0' has 1 missing values"):
        holders.call("shape")
    holders.close()


def test_a_histogram_holder_restarted_without_gradients_gets_them_again(engine):
    from confide.vertical.histograms import HostHistograms

    key = fixed_native_key()
    rng = np.random.default_rng(9)
    bins = rng.integers(0, 8, (3, 600)).astype(np.uint8)
    gh = key.encrypt_raw([int(v).to_bytes(16, "big") for v in rng.integers(0, 2**60, 600)], "fixed_base", 0)
    node_of_row = rng.integers(0, 2, 600).astype(np.int32)
    remote = HostHistograms(engine, bins, ranges=3)
    remote.set_gradients(key.encryption_key, gh)
    os.kill(remote.holders.pids()[1], signal.SIGKILL)
    [built] = remote.histograms(node_of_row, [1], 8, key.encryption_key)
    direct = gh.histogram(bins, np.flatnonzero(node_of_row == 1).astype(np.uint32), 8, 0)
    assert built.to_bytes() == direct.to_bytes()
    remote.close()


@pytest.mark.slow
def test_psi_blinding_on_ray_workers_aligns_the_same_rows(engine):
    import threading

    from confide.vertical.channel import LocalChannel
    from confide.vertical.psi import intersect

    rng = np.random.default_rng(4)
    universe = np.arange(60_000)
    ids = {"g": rng.choice(universe, 20_000, replace=False), "h": rng.choice(universe, 15_000, replace=False)}
    runs = {}
    for engines in ({}, {"g": engine, "h": engine}):
        channels = LocalChannel.group(["g", "h"], timeout_s=60)
        results, stats = {}, {"g": {}, "h": {}}

        def work(party, channels=channels, results=results, stats=stats, engines=engines):
            role = "guest" if party == "g" else "host"
            results[party] = intersect(
                channels[party],
                ids[party],
                role=role,
                guest="g",
                hosts=["h"],
                session="ray",
                stats=stats[party],
                engine=engines.get(party),
            )

        threads = [threading.Thread(target=work, args=(p,)) for p in ("g", "h")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        runs[bool(engines)] = results
        assert stats["g"]["blinding"] == ("compute workers (ray)" if engines else "party process")
    assert np.array_equal(ids["g"][runs[True]["g"]], ids["h"][runs[True]["h"]])
    for party in ("g", "h"):
        assert np.array_equal(runs[True][party], runs[False][party])
    assert len(runs[True]["g"]) == len(np.intersect1d(ids["g"], ids["h"]))


def test_a_partitioned_host_on_ray_answers_as_inline_and_survives_a_killed_holder(engine, tmp_path):
    from confide.vertical.columns import PartitionedColumns
    from tests.fixtures.partitions import host_fl_data, write_columns

    rng = np.random.default_rng(8)
    X = np.round(rng.normal(0, 2, (900, 4)), 1)
    root = write_columns(tmp_path / "cols", rng.permutation(5000)[:900], X, [300, 250, 350])
    task = PartitionTask(party="lab", dataset="cols", fl_data=FLData.create(**host_fl_data()).to_dict())
    rows = rng.permutation(900)[:700]
    key = fixed_native_key()
    gh = key.encrypt_raw([int(v).to_bytes(16, "big") for v in rng.integers(0, 2**60, 700)], "fixed_base", 0)
    node_of_row = rng.integers(0, 3, 700).astype(np.int32)
    decisions = np.array([[0, 1, 3], [2, 0, 5]])
    answers = {}
    for name, compute in (("ray", engine), ("inline", open_compute("inline"))):
        columns = PartitionedColumns.open(compute, task, list_partitions(root, "cols"), "id")
        view = columns.view("train", rows)
        binner = view.fit(8, "lab")
        if name == "ray":
            os.kill(columns.holders.pids()[0], signal.SIGKILL)  # loses its view and bins before the gradients
        view.set_gradients(key.encryption_key, gh)
        if name == "ray":
            os.kill(columns.holders.pids()[1], signal.SIGKILL)  # loses its view, bins and gradients
        hists, counts = view.layer(node_of_row, [0, 2], 8, key.encryption_key)
        answers[name] = (
            binner.cuts,
            [h.to_bytes() for h in hists],
            counts,
            view.lefts(node_of_row, decisions),
            view.below([(np.arange(0, 700, 3), 2, 0.5)]),
        )
        columns.close()
    ray_cuts, ray_hists, ray_counts, ray_lefts, ray_below = answers["ray"]
    cuts, hists, counts, lefts, below = answers["inline"]
    assert all(np.array_equal(a, b) for a, b in zip(ray_cuts, cuts, strict=True))
    assert ray_hists == hists and np.array_equal(ray_counts, counts)
    assert all(np.array_equal(a, b) for a, b in zip(ray_lefts + ray_below, lefts + below, strict=True))
    bins = Binner.fit(X[rows], 8).transform(X[rows])
    assert hists[0] == gh.histogram(bins, np.flatnonzero(node_of_row == 0).astype(np.uint32), 8, 0).to_bytes()
    assert np.array_equal(below[0], X[rows][np.arange(0, 700, 3), 2] < 0.5)
