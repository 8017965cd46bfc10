"""A party whose rows are partitioned Parquet, held in-process or by Ray actors, in a real job."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from confide.cli.main import print_summary
from confide.errors import JobFailedError
from confide.spec import parse_job
from tests.fixtures.federation import run_local
from tests.fixtures.partitions import write_partitions

PARTIES = ["hospital-a", "hospital-b"]


def _catalogs(tmp_path) -> dict[str, str]:
    out = {}
    for index, party in enumerate(PARTIES):
        root = write_partitions(tmp_path / party / "rows", [400, 250, 333][: 3 - index], seed=index)
        catalog = tmp_path / party / "catalog.yaml"
        catalog.write_text(
            yaml.safe_dump({"datasets": {"rows": {"source": "parquet", "path": str(root), "partitioned": True}}})
        )
        out[party] = str(catalog)
    return out


def _job(mode: str = "plain") -> dict:
    return {
        "job_id": f"partitioned-{mode}",
        "rounds": 3,
        "parties": PARTIES,
        "model": {"algorithm": "homo_lr", "learning_rate": 1.0, "local_epochs": 10, "batch_size": 0},
        "fl_data": {
            "label": "label",
            "participants": {p: {"dataset": "rows", "test_fraction": 0.2} for p in PARTIES},
            "pipeline": [
                {
                    "name": "site",
                    "op": "encode",
                    "params": {"columns": ["site"], "categories": {"site": ["north", "south"]}},
                }
            ],
        },
        "protection": {"mode": mode},
        "metrics": ["loss", "auc"],
    }


def _weights(workdir) -> dict[str, list[float]]:
    return {p: json.loads((workdir / "parties" / f"{p}.report.json").read_text())["weights"] for p in PARTIES}


def test_a_job_trains_on_partitions_held_inline(tmp_path):
    catalogs = _catalogs(tmp_path)
    report = run_local(parse_job(_job()), tmp_path / "inline", progress=False, echo=lambda *_: None, catalogs=catalogs)
    assert len(report["rounds"]) == 3 and report["final_auc"] > 0.9
    party = json.loads((tmp_path / "inline" / "parties" / "hospital-a.report.json").read_text())
    assert party["samples"] + party["test_samples"] == 983 and party["features"] == 7
    assert party["compute"]["engine"] == "inline" and party["compute"]["partitions"] == 3
    weights = _weights(tmp_path / "inline")
    assert weights["hospital-a"] == weights["hospital-b"]
    assert report["parties"]["hospital-a"]["compute"]["partitions"] == 3
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_summary(report)
    assert "compute at hospital-a: inline (3 partitions held)" in printed.getvalue()
    mini = {**_job(), "job_id": "partitioned-minibatch"}
    mini["model"] = {**mini["model"], "batch_size": 32}
    with pytest.raises(JobFailedError, match="set model.batch_size: 0"):
        run_local(parse_job(mini), tmp_path / "mini", progress=False, echo=lambda *_: None, catalogs=catalogs)


def test_a_keras_network_trains_data_parallel_on_the_partitions(tmp_path):
    catalogs = _catalogs(tmp_path)
    job = {**_job(), "job_id": "partitioned-keras", "metrics": ["loss", "accuracy", "auc"]}
    job["model"] = {
        "algorithm": "keras",
        "learning_rate": 0.05,
        "batch_size": 32,
        "network": {
            "layers": [
                {"class_name": "Dense", "config": {"units": 8, "activation": "relu"}},
                {"class_name": "Dense", "config": {"units": 1, "activation": "sigmoid"}},
            ],
            "optimizer": {"class_name": "Adam"},
            "loss": "binary_crossentropy",
        },
    }
    report = run_local(parse_job(job), tmp_path / "keras", progress=False, echo=lambda *_: None, catalogs=catalogs)
    assert len(report["rounds"]) == 3 and report["final_auc"] > 0.9 and report["final_accuracy"] > 0.8
    weights = _weights(tmp_path / "keras")
    assert weights["hospital-a"] == weights["hospital-b"]


def test_a_party_on_ray_trains_the_same_model_as_inline(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'confide[ray]'; make test installs it)")
    catalogs = _catalogs(tmp_path)
    run = dict(progress=False, echo=lambda *_: None, catalogs=catalogs)
    run_local(parse_job(_job()), tmp_path / "inline", **run)
    report = run_local(parse_job(_job()), tmp_path / "ray", compute={"hospital-a": "ray"}, **run)
    assert len(report["rounds"]) == 3
    party = json.loads((tmp_path / "ray" / "parties" / "hospital-a.report.json").read_text())
    assert party["compute"]["engine"] == "ray" and party["compute"]["nodes"] == 1
    assert len(set(party["compute"]["holder_pids"])) == 3
    # The holders add their sums in the same order wherever they run; a worker's BLAS may split a
    # product over other threads than the party's, so equal within float tolerance.
    on_ray, inline = _weights(tmp_path / "ray"), _weights(tmp_path / "inline")
    for party in PARTIES:
        assert np.allclose(on_ray[party], inline[party], rtol=1e-12, atol=1e-12)


MiB = 1024 * 1024


class _MemoryGroup:
    """A memory cgroup (v1 or v2) that caps the processes started while this process stands in it."""

    def __init__(self, limit: int) -> None:
        import os
        from pathlib import Path

        self.limit = limit
        name = f"confide-test-{os.getpid()}"
        v1, v2 = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")
        controllers = v2 / "cgroup.controllers"
        if (v1 / "memory.limit_in_bytes").exists():
            self.root, self.group, self.cap = v1, v1 / name, "memory.limit_in_bytes"
        elif controllers.exists() and "memory" in controllers.read_text().split():
            self.root, self.group, self.cap = v2, v2 / name, "memory.max"
        else:
            raise OSError("no cgroup memory controller is mounted")
        self.group.mkdir()
        (self.group / self.cap).write_text(str(limit))

    def enter(self) -> None:
        import os

        (self.group / "cgroup.procs").write_text(str(os.getpid()))

    def leave(self) -> None:
        import os

        (self.root / "cgroup.procs").write_text(str(os.getpid()))

    def events(self) -> int:
        """Times the cap was hit (v1 failcnt, v2 max events)."""
        if self.cap == "memory.limit_in_bytes":
            return int((self.group / "memory.failcnt").read_text())
        fields = dict(line.split() for line in (self.group / "memory.events").read_text().splitlines())
        return int(fields.get("max", 0)) + int(fields.get("oom_kill", 0))

    def remove(self) -> None:
        self.group.rmdir()


def _ray_cluster(tmp_path):
    """``ray start --head`` as a silo operator runs it (not a child of any party); its address."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ray = str(Path(sys.executable).parent / "ray")
    subprocess.run(
        [
            ray,
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return f"127.0.0.1:{port}", lambda: subprocess.run([ray, "stop", "--force"], capture_output=True, timeout=120)


def _run_capped(tmp_path, name, catalogs, compute, group):
    """hospital-a started inside the memory cgroup; the aggregator and hospital-b outside it."""
    from pathlib import Path

    from confide.local.federation import LocalFederation, _follow

    job = {**_job(), "job_id": f"capped-{name}", "rounds": 1, "metrics": ["loss", "auc"]}
    job["model"] = {**job["model"], "local_epochs": 1}
    job["fl_data"] = {
        **job["fl_data"],
        "participants": {p: {"dataset": "rows", "test_fraction": 0.01} for p in PARTIES},
        "pipeline": [],
    }
    federation = LocalFederation(parse_job(job), Path(tmp_path / name), catalogs=catalogs, compute=compute)
    federation.prepare()
    try:
        federation.start_aggregator()
        group.enter()
        try:
            federation.start_party("hospital-a", {"RAY_AUTH_MODE": "token"})
        finally:
            group.leave()
        federation.start_party("hospital-b")
        _follow(federation, False, lambda *_: None)
    finally:
        federation.stop()
    return federation.report_of("hospital-a") or {}, federation.parties["hospital-a"].returncode


def test_a_party_trains_through_ray_on_ten_times_the_memory_its_process_may_hold(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'confide[ray]'; make test installs it)")
    limit = 320 * MiB
    try:
        group = _MemoryGroup(limit)
    except OSError as error:
        pytest.skip(f"cannot cap a process's memory here: {error}")
    try:
        import numpy as np

        # 8 files of 7.5M rows x 6 features: 3.0 GiB once provisioned as float64 arrays (x + y). The
        # files hold the same rows (hard links of one written file): what is measured is how much of
        # them a process holds, and writing eight distinct files took the test 34 s of its 95.
        big = write_partitions(tmp_path / "a" / "rows", [7_500_000], features=6, text=False, dtype=np.float32)
        for index in range(1, 8):
            os.link(big / "part-000.parquet", big / f"part-{index:03d}.parquet")
        small = write_partitions(tmp_path / "b" / "rows", [20_000], seed=1, features=6, text=False)
        catalogs = {}
        for party, root in (("hospital-a", big), ("hospital-b", small)):
            path = tmp_path / f"{party}.yaml"
            path.write_text(
                yaml.safe_dump({"datasets": {"rows": {"source": "parquet", "path": str(root), "partitioned": True}}})
            )
            catalogs[party] = str(path)
        dataset_bytes = 60_000_000 * 7 * 8
        assert dataset_bytes >= 10 * limit
        address, stop_ray = _ray_cluster(tmp_path)
        try:
            report, status = _run_capped(tmp_path, "ray", catalogs, {"hospital-a": f"ray:{address}"}, group)
        finally:
            stop_ray()
        assert status == 0 and report["status"] == "completed", report.get("error")
        assert report["samples"] + report["test_samples"] == 60_000_000
        # The kernel enforced the cap on what the process held. Its VmHWM can read a little above the
        # cap (333.6 MiB once): it also counts shared-library pages charged to other processes.
        assert report["peak_rss_mb"] * MiB < dataset_bytes / 8
        assert report["rounds"][0]["test_auc"] > 0.9
        # The cap bites: held in the party process, the same rows do not fit.
        with pytest.raises(JobFailedError):
            _run_capped(tmp_path, "inline", catalogs, {"hospital-a": "inline"}, group)
        assert group.events() > 0
    finally:
        group.remove()


def test_a_holder_killed_during_a_job_is_restarted_and_the_job_loses_nothing(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'confide[ray]'; make test installs it)")
    import os
    import signal
    import threading
    import time

    catalogs = _catalogs(tmp_path)
    job = {**_job(), "job_id": "partitioned-kill", "rounds": 8}
    run = dict(progress=False, echo=lambda *_: None, catalogs=catalogs)
    run_local(parse_job(job), tmp_path / "calm", compute={"hospital-a": "ray"}, **run)
    report_path = tmp_path / "killed" / "parties" / "hospital-a.report.json"
    killed = []

    def kill_a_holder_after_round_two():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                report = json.loads(report_path.read_text())
            except (OSError, ValueError):
                report = {}
            if len(report.get("rounds", [])) >= 2:
                victim = report["compute"]["holder_pids"][1]
                os.kill(victim, signal.SIGKILL)
                killed.append(victim)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_a_holder_after_round_two)
    killer.start()
    report = run_local(parse_job(job), tmp_path / "killed", compute={"hospital-a": "ray"}, **run)
    killer.join()
    assert killed, "the job ended before a holder could be killed"
    assert len(report["rounds"]) == 8 and not report["dropped"]
    calm, survived = _weights(tmp_path / "calm"), _weights(tmp_path / "killed")
    for party in PARTIES:
        assert np.allclose(calm[party], survived[party], rtol=1e-12, atol=1e-12)


def test_secureboost_with_the_guest_encrypting_and_the_host_summing_on_ray_grows_the_same_trees(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'confide[ray]'; make test installs it)")
    spec = {
        "job_id": "vertical-secureboost-ray",
        "rounds": 2,
        "parties": ["hospital", "lab"],
        "model": {"algorithm": "secureboost", "max_depth": 3, "learning_rate": 0.3},
        "data": {"dataset": "breast_cancer", "guest": "hospital", "overlap": 0.95, "seed": 3},
        "protection": {"mode": "paillier"},
    }
    quiet = dict(progress=False, echo=lambda *_: None)
    itself = run_local(parse_job(spec), tmp_path / "itself", **quiet)
    # One party on Ray per run: two local Ray instances do not share one machine (silos have their own).
    for party, work in (("hospital", "GH encryption, public-key path"), ("lab", "encrypted histograms by row ranges")):
        offloaded = run_local(parse_job(spec), tmp_path / party, compute={party: "ray"}, **quiet)
        mine = json.loads((tmp_path / party / "parties" / f"{party}.report.json").read_text())
        assert mine["compute"]["engine"] == "ray" and mine["compute"]["work"] == ["PSI hashing and blinding", work]
        assert mine["psi"]["blinding"] == "compute workers (ray)"
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            print_summary(offloaded)
        assert f"compute at {party}: ray, 1 node (PSI hashing and blinding; {work})" in printed.getvalue()
        assert offloaded["metrics"] == itself["metrics"]
        trees = {
            run: json.loads((tmp_path / run / "parties" / "hospital.report.json").read_text())["feature_importance"]
            for run in ("itself", party)
        }
        assert trees[party] == trees["itself"]


def _lab_catalogs(tmp_path) -> dict[str, dict[str, str]]:
    """The lab's panel of examples/vertical_csv as one Parquet file, and as 3 partitions of it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from confide.data.catalog import Catalog

    example = Path(__file__).resolve().parents[2] / "examples" / "vertical_csv"
    table = Catalog.load(example / "lab" / "catalog.yaml").table("panel")
    arrow = pa.table({name: np.asarray(values) for name, values in table.columns.items()})
    whole, parts = tmp_path / "lab-one" / "panel.parquet", tmp_path / "lab-parts" / "panel"
    whole.parent.mkdir(parents=True)
    parts.mkdir(parents=True)
    pq.write_table(arrow, whole)
    for index, (a, b) in enumerate([(0, 150), (150, 330), (330, arrow.num_rows)]):
        pq.write_table(arrow.slice(a, b - a), parts / f"part-{index}.parquet")
    catalogs = {}
    for name, path, partitioned in (("one", whole, False), ("parts", parts, True)):
        entry = {"source": "parquet", "path": str(path), **({"partitioned": True} if partitioned else {})}
        catalog = tmp_path / f"lab-{name}" / "catalog.yaml"
        catalog.write_text(yaml.safe_dump({"datasets": {"panel": entry}}))
        catalogs[name] = {"hospital": str(example / "hospital" / "catalog.yaml"), "lab": str(catalog)}
    return catalogs


def _secureboost_on_the_sites_exports() -> dict:
    example = Path(__file__).resolve().parents[2] / "examples" / "vertical_csv"
    spec = yaml.safe_load((example / "job.yaml").read_text())  # as written (parsing adds the join)
    spec["rounds"] = 3
    spec["model"] = {"algorithm": "secureboost", "max_depth": 3, "learning_rate": 0.3}
    # row-local at the lab: its missing measurements filled with a constant, not a median of all rows
    spec["fl_data"]["pipeline"][1] = {"name": "fill", "op": "impute", "params": {"strategy": "constant", "value": 0.0}}
    return spec


def test_a_secureboost_host_on_partitioned_files_grows_the_trees_of_the_same_rows_in_one_file(tmp_path):
    catalogs = _lab_catalogs(tmp_path)
    spec = _secureboost_on_the_sites_exports()
    quiet = dict(progress=False, echo=lambda *_: None)
    one = run_local(parse_job(spec), tmp_path / "one", catalogs=catalogs["one"], **quiet)
    runs = {"inline": run_local(parse_job(spec), tmp_path / "inline", catalogs=catalogs["parts"], **quiet)}
    if importlib.util.find_spec("ray") is not None:  # make test installs Ray; a bare install still runs inline
        runs["ray"] = run_local(
            parse_job(spec), tmp_path / "ray", catalogs=catalogs["parts"], compute={"lab": "ray"}, **quiet
        )
    trees = json.loads((tmp_path / "one" / "parties" / "hospital.report.json").read_text())["feature_importance"]
    for engine, report in runs.items():
        assert report["metrics"] == one["metrics"], engine
        assert report["psi"]["intersection"] == one["psi"]["intersection"], engine
        guest = json.loads((tmp_path / engine / "parties" / "hospital.report.json").read_text())
        assert guest["feature_importance"] == trees, engine
        lab = json.loads((tmp_path / engine / "parties" / "lab.report.json").read_text())
        assert lab["compute"]["engine"] == engine and lab["compute"]["partitions"] == 3
        assert lab["psi"]["blinding"] == f"compute workers ({engine})"
        assert lab["features"] == 20 and lab["records"] == one["parties"]["lab"].get("records", lab["records"])
    assert any(f["party"] == "lab" for f in trees), "the lab owns no split"
    median = _secureboost_on_the_sites_exports()
    median["fl_data"]["pipeline"][1]["params"] = {"strategy": "median"}
    with pytest.raises(JobFailedError, match=r"step 'fill' \(impute\) fits statistics over all rows") as refused:
        run_local(parse_job(median), tmp_path / "median", catalogs=catalogs["parts"], **quiet)
    # the guest stops at once, naming the host, instead of waiting for its PSI hello
    assert "PSI aborted by the host 'lab': it failed before PSI with InvalidParameterError" in str(refused.value)
    with pytest.raises(JobFailedError, match="a vertical job reads partitioned data at a SecureBoost host only"):
        run_local(
            parse_job({**spec, "model": {"algorithm": "hetero_lr"}}),
            tmp_path / "lr",
            catalogs=catalogs["parts"],
            **quiet,
        )
