"""The compute seam in the party process: partitions, row-local FL_Data, full-batch Homo LR, secrets."""

from __future__ import annotations

import numpy as np
import pytest

from confide.compute import SecretShippingError, check_shippable, open_compute
from confide.compute.inline import InlineCompute
from confide.compute.partitions import PartitionedData, PartitionRows, PartitionTask, list_partitions
from confide.data.catalog import Catalog
from confide.data.fldata import FLData
from confide.errors import InvalidParameterError
from confide.ml.homo_lr import HomoLR, HomoLRModel
from tests.fixtures.keys import fixed_key, fixed_native_key
from tests.fixtures.partitions import fl_data, write_partitions


def hold(engine, root, party="p1", **options):
    partitions = list_partitions(root, "rows")
    task = PartitionTask(party=party, dataset="rows", fl_data=FLData.create(**fl_data(party, **options)).to_dict())
    holders = engine.hold(PartitionRows, [(task, p) for p in partitions])
    return PartitionedData(holders, holders.call("shape"))


def test_partitions_are_the_files_in_path_order_with_their_footer_counts(partitioned, tmp_path):
    partitions = list_partitions(partitioned, "rows")
    assert [p.rows for p in partitions] == [300, 120, 211, 5]
    assert [p.index for p in partitions] == [0, 1, 2, 3]
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidParameterError, match=r"empty: no \.parquet files"):
        list_partitions(tmp_path / "empty", "empty")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(InvalidParameterError, match="cannot read the footer of broken.parquet"):
        list_partitions(tmp_path / "broken.parquet", "broken")


def test_each_partition_provisions_alone_with_a_per_row_test_split(partitioned):
    data = hold(open_compute("inline"), partitioned)
    assert data.features == ["x0", "x1", "x2", "x3", "x4", "site=north", "site=south"]
    assert data.rows + data.view("test").rows == 636
    # The split of a partition depends on that partition alone: rebuilding one file's holder alone
    # gives the same rows as it had among the others.
    again = write_partitions(partitioned.parent / "again", [300, 120, 211, 5])
    alone = hold(open_compute("inline"), again)
    assert [s["rows"] for s in alone.shapes] == [s["rows"] for s in data.shapes]
    first = data.holders.holders[0]
    assert np.array_equal(first.X, alone.holders.holders[0].X)
    assert 0.1 < data.view("test").rows / 636 < 0.3
    assert np.all(np.abs(first.X[:, 0]) <= 2.0)  # the clip step ran


def test_steps_that_fit_statistics_over_all_rows_are_refused_naming_the_step(partitioned):
    scale = [{"name": "z", "op": "scale", "params": {"method": "standard"}}]
    with pytest.raises(InvalidParameterError, match=r"step 'z' \(scale\) fits statistics over all rows"):
        hold(open_compute("inline"), partitioned, steps=scale)
    mean = [{"name": "fill", "op": "impute", "params": {"strategy": "mean"}}]
    with pytest.raises(InvalidParameterError, match=r"step 'fill' \(impute\)"):
        hold(open_compute("inline"), partitioned, steps=mean)


def test_full_batch_on_partitions_equals_full_batch_on_the_rows_together(partitioned):
    data = hold(open_compute("inline"), partitioned)
    X = np.concatenate([h.X for h in data.holders.holders])
    y = np.concatenate([h.y for h in data.holders.holders])
    together = HomoLR(learning_rate=0.5, local_epochs=7, batch_size=0, l2=0.01, seed=3)
    apart = HomoLR(learning_rate=0.5, local_epochs=7, batch_size=0, l2=0.01, seed=3)
    together.initialize(X.shape[1])
    apart.initialize(X.shape[1])
    loss_together = together.local_train(X, y)
    loss_apart = apart.train_partitioned(data)
    assert np.allclose(together.get_weights(), apart.get_weights(), rtol=0, atol=1e-12)
    assert loss_apart == pytest.approx(loss_together, abs=1e-12)


def test_homo_lr_on_partitions_needs_the_full_batch_and_evaluates_without_the_rows(partitioned):
    data = hold(open_compute("inline"), partitioned)
    model = HomoLRModel(HomoLR(learning_rate=0.5, local_epochs=2, batch_size=32))
    model.build((data.shape[1],), 2)
    from confide.ml.base import FitConfig

    with pytest.raises(InvalidParameterError, match="set model.batch_size: 0"):
        model.fit(data, data, FitConfig(round=1, seed=(0, 0, 1), epochs=2))
    model.estimator.batch_size = 0
    result = model.fit(data, data, FitConfig(round=1, seed=(0, 0, 1), epochs=2))
    assert result.num_examples == data.rows
    test = data.view("test")
    metrics = model.evaluate(test, test, ["loss", "accuracy", "auc"])
    assert set(metrics) == {"loss", "accuracy", "auc"} and metrics["auc"] > 0.7


def test_secrets_never_cross_to_a_worker_whatever_the_engine(partitioned):
    key = fixed_key()
    with pytest.raises(SecretShippingError, match="DecryptionKey must stay in the party process"):
        check_shippable([np.zeros(3), {"nested": [key]}], "test")
    data = hold(open_compute("inline"), partitioned)
    with pytest.raises(SecretShippingError):
        data.call("lr_loss", key, "train")
    check_shippable([key.encryption_key, np.zeros(3), "text"], "public material passes")


def test_a_partitioned_catalog_entry_is_published_file_by_file_and_never_read_whole(partitioned):
    catalog = Catalog.from_mapping(
        {"datasets": {"rows": {"source": "parquet", "path": str(partitioned), "partitioned": True}}}
    )
    [meta] = catalog.metadata()
    assert meta["rows"] == 636
    site = next(c for c in meta["schema"] if c["name"] == "site")
    assert site["categories"] == ["north", "south"] and site["missing"] is False
    assert len(catalog.partitions("rows")) == 4
    with pytest.raises(InvalidParameterError, match="is partitioned: it is read one partition at a time"):
        catalog.table("rows")
    with pytest.raises(InvalidParameterError, match=r"datasets.rows.partitioned must be true or false"):
        Catalog.from_mapping(
            {"datasets": {"rows": {"source": "parquet", "path": str(partitioned), "partitioned": "yes"}}}
        )


def test_engine_names_are_checked():
    with pytest.raises(InvalidParameterError, match="compute engine must be one of inline, ray, got 'spark'"):
        open_compute("spark")
    with pytest.raises(InvalidParameterError, match="'inline' takes no address"):
        open_compute("inline:somewhere")


@pytest.mark.slow
def test_gradients_encrypted_on_workers_with_the_public_key_decrypt_as_the_guests_own():
    from confide.compute.tasks import encrypt_raw_on

    key = fixed_native_key()
    plaintexts = [int(v).to_bytes(16, "big") for v in np.random.default_rng(5).integers(0, 2**62, 5000)]
    engine = open_compute("inline")
    vector = encrypt_raw_on(engine, key.encryption_key, plaintexts, min_chunk=1000)
    assert len(vector) == 5000
    decrypted = [int.from_bytes(b, "big") for b in key.decrypt_raw(vector)]
    assert decrypted == [int.from_bytes(p, "big") for p in plaintexts]
    with pytest.raises(SecretShippingError):
        engine.map(len, [(key,)])


def test_host_histograms_built_by_row_ranges_are_the_same_ciphertexts():
    from confide.vertical.histograms import HostHistograms

    key = fixed_native_key()
    rng = np.random.default_rng(0)
    rows, features, n_bins = 1500, 4, 8
    bins = rng.integers(0, n_bins, (features, rows)).astype(np.uint8)
    gh = key.encrypt_raw([int(v).to_bytes(16, "big") for v in rng.integers(0, 2**60, rows)], "fixed_base", 0)
    node_of_row = rng.integers(0, 3, rows).astype(np.int32)
    remote = HostHistograms(open_compute("inline"), bins, ranges=5)
    remote.set_gradients(key.encryption_key, gh)
    built = remote.histograms(node_of_row, [0, 2], n_bins, key.encryption_key)
    for node, vector in zip([0, 2], built, strict=True):
        direct = gh.histogram(bins, np.flatnonzero(node_of_row == node).astype(np.uint32), n_bins, 0)
        assert vector.to_bytes() == direct.to_bytes()
    # each holder keeps the ciphertexts of its own rows only
    held = remote.holders.holders
    assert [len(h.gh) for h in held] == [b - a for a, b in remote.ranges] == [300] * 5
    assert held[2].gh.to_bytes() == gh.slice(600, 900).to_bytes()
    remote.close()
    with pytest.raises(InvalidParameterError, match="stop: must satisfy start <= stop <= 1500"):
        gh.slice(10, 1501)


def test_empty_files_are_skipped_and_a_directory_of_them_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = write_partitions(tmp_path / "rows", [50, 60])
    table = pq.read_table(root / "part-000.parquet")
    pq.write_table(table.slice(0, 0), root / "part-000a-empty.parquet")
    assert [p.rows for p in list_partitions(root, "rows")] == [50, 60]
    empty = tmp_path / "empty"
    empty.mkdir()
    pq.write_table(pa.table({"x": pa.array([], pa.float64())}), empty / "part-0.parquet")
    with pytest.raises(InvalidParameterError, match="every .parquet file under .* is empty"):
        list_partitions(empty, "empty")


def test_secrets_are_found_inside_dataclasses_and_sets_and_cycles_do_not_loop():
    from dataclasses import dataclass

    key = fixed_key()

    @dataclass
    class Carrier:
        payload: object

    loop: list = []
    loop.append(loop)
    check_shippable([loop, Carrier("public")], "cycles")
    with pytest.raises(SecretShippingError):
        check_shippable([Carrier({"deep": [frozenset({1}), (key,)]})], "dataclass")


def test_files_with_other_columns_are_named_when_the_catalog_publishes(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = write_partitions(tmp_path / "rows", [40, 40])
    pq.write_table(pa.table({"x0": np.zeros(40), "label": np.zeros(40)}), root / "part-002.parquet")
    catalog = Catalog.from_mapping(
        {"datasets": {"rows": {"source": "parquet", "path": str(root), "partitioned": True}}}
    )
    with pytest.raises(InvalidParameterError, match=r"partition 2 \(part-002.parquet\): every file must hold the same"):
        catalog.metadata()


def test_ranges_cut_work_into_about_two_per_worker_without_gaps_or_tiny_pieces():
    class Four(InlineCompute):
        @property
        def workers(self) -> int:
            return 4

    engine = Four()
    for count in (0, 1, 7, 4096, 10_000, 100_003):
        for min_chunk in (1, 2048, 4096):
            cut = engine.ranges(count, min_chunk=min_chunk)
            assert [i for a, b in cut for i in range(a, b)] == list(range(count))
            assert len(cut) <= 8 and all(b > a for a, b in cut)
            assert len(cut) <= -(-count // min_chunk)
            assert all(b - a >= count // len(cut) for a, b in cut)  # as even as integer edges allow
    assert engine.ranges(100, parts=3) == [(0, 33), (33, 66), (66, 100)]
    assert engine.ranges(10_000, min_chunk=4096) == [(0, 3333), (3333, 6666), (6666, 10_000)]
