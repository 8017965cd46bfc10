"""Registration: identities, and dataset metadata that parties publish (never rows)."""

from __future__ import annotations

import pytest

from confide.errors import InvalidParameterError, PermissionDeniedError

from .conftest import ADMIN, AGG, DEV, SCHEMA, Caller, dataset, party


def test_party_publishes_dataset_metadata(controller, fed):
    answer = fed.register_party("hospital-a", [dataset("records", rows=569, description="d", source="catalog")])
    assert answer == {"name": "hospital-a", "role": "party", "datasets": ["records"]}
    [item] = controller.datasets(DEV)
    assert item == {
        "owner": "hospital-a",
        "name": "records",
        "schema": [{**column, "missing": False} for column in SCHEMA],
        "rows": 569,
        "description": "d",
        "source": "catalog",
        "granted": False,
    }
    assert controller.datasets(party("hospital-a"))[0]["granted"] is True  # the owner may always use its own
    [registered] = controller.parties(ADMIN)
    assert registered["name"] == "hospital-a" and registered["role"] == "party" and registered["online"] is True


@pytest.mark.parametrize("field", ["rows_data", "values", "records"])
def test_dataset_with_row_data_is_refused_naming_the_field(controller, fed, field):
    with pytest.raises(InvalidParameterError, match=rf"datasets\[0\].*{field}"):
        fed.register_party("hospital-a", [dataset(**{field: [[1.0, 2.0, 0]]})])
    assert controller.datasets(ADMIN) == []
    assert controller.parties(ADMIN) == []  # nothing of the refused registration is stored


@pytest.mark.parametrize(
    ("item", "where"),
    [
        (dataset(schema=[]), r"datasets\[0\]\.schema"),
        (dataset(schema=[{"name": "x", "dtype": "bool"}]), r"datasets\[0\]\.schema\[0\]"),
        (dataset(schema=[{"name": "x", "dtype": "float", "values": [1, 2]}]), r"datasets\[0\]\.schema\[0\]"),
        (dataset(schema=[{"name": "", "dtype": "int"}]), r"datasets\[0\]\.schema\[0\]"),
        (dataset(rows=-1), r"datasets\[0\]\.rows"),
        (dataset(rows=True), r"datasets\[0\]\.rows"),
        (dataset(rows=1.5), r"datasets\[0\]\.rows"),
        (dataset("Bad Name"), r"datasets\[0\]\.name"),
        (dataset(description="x" * 5000), r"datasets\[0\]\.description"),
        (dataset(source="x" * 65), r"datasets\[0\]\.source"),
        ("records", r"datasets\[0\] must be a mapping"),
    ],
)
def test_schema_checks(controller, fed, item, where):
    with pytest.raises(InvalidParameterError, match=where):
        fed.register_party("hospital-a", [item])
    assert controller.datasets(ADMIN) == []


def test_dataset_names_are_unique_per_party(fed):
    with pytest.raises(InvalidParameterError, match="unique"):
        fed.register_party("hospital-a", [dataset("records"), dataset("records", rows=3)])


def test_reregistering_replaces_metadata(controller, fed):
    fed.register_party("hospital-a", [dataset("records", rows=100)])
    fed.register_party("hospital-a", [dataset("records", rows=250, schema=[{"name": "label", "dtype": "int"}])])
    [item] = controller.datasets(ADMIN)
    assert item["rows"] == 250
    assert item["schema"] == [{"name": "label", "dtype": "int", "missing": False}]
    assert [p["name"] for p in controller.parties(ADMIN)] == ["hospital-a"]


def test_reregistering_drops_datasets_left_out(controller, fed):
    fed.register_party("hospital-a", [dataset("records"), dataset("old")])
    fed.register_party("hospital-a", [dataset("records")])
    assert [d["name"] for d in controller.datasets(ADMIN)] == ["records"]


@pytest.mark.parametrize("caller", [AGG, DEV, ADMIN])
def test_only_parties_publish_datasets(controller, caller):
    with pytest.raises(InvalidParameterError, match="only parties publish datasets"):
        controller.register(caller, address=None, datasets=[dataset()], cert_sha256="0" * 64)
    assert controller.datasets(ADMIN) == []
    assert controller.parties(ADMIN) == []


def test_unknown_role_may_not_register(controller):
    with pytest.raises(PermissionDeniedError, match="guest"):
        controller.register(Caller("x", "guest"), address=None, datasets=[], cert_sha256="0" * 64)


def test_aggregator_registers_its_address(controller, fed):
    fed.register_aggregator()
    [agg] = controller.parties(ADMIN)
    assert agg["role"] == "service" and agg["address"] == "127.0.0.1:7000"
