"""The order ``make test`` hands files to its workers (tests/fixtures/ordering.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from tests.fixtures import ordering


def items(*nodeids):
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_files_go_longest_first_and_keep_their_own_order():
    table = {"tests/unit/test_b.py": 5.0, "tests/integration/test_c.py": 300.0}
    got = items(
        "tests/unit/test_a.py::one",
        "tests/unit/test_b.py::one",
        "tests/integration/test_c.py::one",
        "tests/unit/test_b.py::two",
        "tests/integration/test_c.py::two",
        "tests/integration/test_new.py::one",
    )
    ordering.longest_files_first(got, table)
    assert [i.nodeid for i in got] == [
        "tests/integration/test_c.py::one",
        "tests/integration/test_c.py::two",
        # Not measured yet: an integration file counts as UNKNOWN_S, ahead of the short unit files.
        "tests/integration/test_new.py::one",
        "tests/unit/test_b.py::one",
        "tests/unit/test_b.py::two",
        "tests/unit/test_a.py::one",
    ]


def test_recording_adds_up_each_files_phases_and_keeps_the_files_it_did_not_run(tmp_path):
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"tests/unit/test_old.py": 3.0, "tests/unit/test_a.py": 99.0}))
    recorder = ordering.Recorder(path)
    for nodeid, seconds in [
        ("tests/unit/test_a.py::one", 1.25),
        ("tests/unit/test_a.py::one", 0.5),
        ("tests/integration/test_c.py::two[x]", 40.0),
    ]:
        recorder.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=seconds))
    recorder.pytest_sessionfinish(session=None)
    assert json.loads(path.read_text()) == {
        "tests/integration/test_c.py": 40.0,
        "tests/unit/test_old.py": 3.0,
        "tests/unit/test_a.py": 1.8,
    }
    assert list(json.loads(path.read_text())) == [
        "tests/integration/test_c.py",
        "tests/unit/test_old.py",
        "tests/unit/test_a.py",
    ]
