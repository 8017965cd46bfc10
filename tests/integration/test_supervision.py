"""A launcher that supervises what it started, and parties that come back: real processes on loopback.

A party that crashes (exits without a word, or is SIGKILLed between rounds; the leader too) is
started again by ``confide run``, proves who it is with a freshly signed key, and is admitted
at the next round boundary with the model everyone holds; a killed aggregator is named and
restarted on its port; a stopped launcher's job goes on with ``confide run --resume``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from tests.fixtures.faults import confide_processes, with_faults
from tests.fixtures.federation import run_local
from tests.fixtures.waiting import wait_for_round
from tests.integration.conftest import make_spec


def _pid_of(workdir: Path, *words: str) -> int:
    """The pid of the one live ``confide`` process under ``workdir`` whose command line has ``words``."""
    found = [pid for pid, argv in confide_processes(workdir).items() if all(w in argv for w in words)]
    assert len(found) == 1, f"expected one process {words} under {workdir}, found {found}"
    return found[0]


def _node_pids(workdir: Path, node: int) -> set[int]:
    """The pids of live processes of aggregator cluster node ``node`` under ``workdir``."""
    return {
        pid
        for pid, argv in confide_processes(workdir).items()
        if "--state" in argv and Path(argv[argv.index("--state") + 1]).name == f"node-{node}"
    }


def _node_pid(workdir: Path, node: int) -> int:
    """The pid of aggregator cluster node ``node`` under ``workdir`` (its ``--state`` folder is ``node-K``)."""
    found = sorted(_node_pids(workdir, node))
    assert len(found) == 1, f"expected one process of node {node} under {workdir}, found {found}"
    return found[0]


def _final_models(workdir: Path, parties: list[str]) -> set[tuple]:
    return {tuple(json.loads((workdir / "parties" / f"{p}.report.json").read_text())["weights"]) for p in parties}


def _slow_rounds(spec, hold: tuple[int, Path] | None = None, **faults) -> dict[str, dict[str, str]]:
    """A pause after every round, so a restarted process can start before the job ends.

    ``hold=(R, path)``: every party also waits after round R until a restarted one has asked to
    rejoin (it creates ``path``), however slowly the host starts it. The CI host once finished all
    twelve rounds before the restarted party was up.
    """
    held = {} if hold is None else {"hold_round": hold[0], "hold_until": hold[1], "rejoin_marker": hold[1]}
    return {p: with_faults(round_delay_s=0.4, **held, **faults.get(p, {})) for p in spec.parties}


@pytest.mark.parametrize(("mode", "on_dropout"), [("paillier", "retry"), ("secagg", "retry")])
def test_crashed_party_rejoins_at_the_next_round_and_ends_with_everyones_model(tmp_path, mode, on_dropout):
    spec = make_spec(
        job_id=f"rejoin-{mode}-{on_dropout}", rounds=12, protection={"mode": mode, "on_dropout": on_dropout}
    )
    lines: list[str] = []
    env = _slow_rounds(spec, **{"hospital-c": {"exit_round": 4}}, hold=(6, tmp_path / "asked"))
    restarts = REGISTRY.get_sample_value("confide_restarts_total", {"process_role": "party"}) or 0.0
    report = run_local(spec, tmp_path, progress=False, echo=lines.append, party_env=env)
    assert REGISTRY.get_sample_value("confide_restarts_total", {"process_role": "party"}) == restarts + 1

    said = [line for line in lines if line.startswith("hospital-c (pid ")]
    assert len(said) == 1 and "exited with status 17" in said[0] and "at round 4 of 12: restarting it" in said[0]
    assert [(r["process"], r["round"]) for r in report["restarts"]] == [("hospital-c", 4)]
    rounds = report["rounds"]
    assert rounds[3]["participants"] == ["hospital-a", "hospital-b"], "round 4 is finished without it"
    rejoin = report["parties"]["hospital-c"]["rejoins"]
    assert len(rejoin) == 1 and rejoin[0]["missed_rounds"] == list(range(4, rejoin[0]["at_round"]))
    assert rejoin[0]["admitted_by"] == "hospital-a"
    back = rejoin[0]["at_round"]
    # However slowly the host starts the process, the others wait after round 6 for its request,
    # and the leader takes it in at the next round boundary (or the one after, if the request
    # reached it just as that round opened).
    assert back <= 8, "admitted with rounds left to train with everyone"
    assert all(r["participants"] == spec.parties for r in rounds[back - 1 :])
    assert report["dropped"] == {}
    party_c = json.loads((tmp_path / "parties" / "hospital-c.report.json").read_text())
    assert [r["round"] for r in party_c["rounds"]] == [1, 2, 3, *range(back, 13)], "the report shows the gap"
    assert len(_final_models(tmp_path, spec.parties)) == 1, "every party ends with the same model"
    assert report["final_auc"] > 0.98


def test_a_lattice_party_that_died_between_rounds_gets_key_shares_sealed_to_its_new_process(tmp_path):
    # Found by the lattice soak: hospital-c died once its round 4 was summed and was admitted to
    # round 5, but hospital-b had sealed its round-5 key share (before training, before it heard
    # who joined) to c's old pair key: c could not open it and was dropped for good.
    spec = make_spec(job_id="rejoin-lattice", rounds=8, protection={"mode": "lattice", "on_dropout": "retry"})
    faults = {"hospital-c": {"exit_round": 4, "exit_step": "summed", "exit_marker": tmp_path / "c.crashed"}}
    env = _slow_rounds(spec, **faults, hold=(4, tmp_path / "asked"))
    lines: list[str] = []
    report = run_local(spec, tmp_path / "run", progress=False, echo=lines.append, party_env=env)

    assert report["dropped"] == {}, report["dropped"]
    assert [r["process"] for r in report["restarts"]] == ["hospital-c"], lines
    rejoin = report["parties"]["hospital-c"]["rejoins"]
    assert len(rejoin) == 1 and rejoin[0]["at_round"] == 5, rejoin  # the round right after: b prepared it with c
    assert all(r["participants"] == spec.parties for r in report["rounds"][4:])
    assert len(_final_models(tmp_path / "run", spec.parties)) == 1


@pytest.mark.parametrize("mode", ["secagg", "paillier"])
def test_two_of_three_crashing_in_one_round_are_admitted_back_by_the_survivor_to_its_retry(tmp_path, mode):
    # Found by the soak: the leader and another party died in one round, the one survivor was
    # below min_parties (2) and failed the job although the launcher was restarting both.
    spec = make_spec(job_id=f"rejoin-two-{mode}", rounds=8, protection={"mode": mode, "on_dropout": "retry"})
    lines: list[str] = []
    crash = {p: {"exit_round": 4, "exit_marker": tmp_path / f"{p}.crashed"} for p in ("hospital-a", "hospital-b")}
    report = run_local(spec, tmp_path / "run", progress=False, echo=lines.append, party_env=_slow_rounds(spec, **crash))

    said = sorted(line for line in lines if "exited with status 17" in line)
    assert [line.split(" (pid")[0] for line in said] == ["hospital-a", "hospital-b"], lines
    assert sorted((r["process"], r["round"]) for r in report["restarts"]) == [("hospital-a", 4), ("hospital-b", 4)]
    rounds = report["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, 9)) and report["dropped"] == {}
    rejoins = {p: report["parties"][p]["rejoins"] for p in ("hospital-a", "hospital-b")}
    assert all(len(r) == 1 for r in rejoins.values()), rejoins
    # Whoever had asked back in when hospital-c was left alone joins the retry of round 4 (both,
    # or the quicker one, the other at a later round boundary): admitted by the survivor.
    retry = [p for p, r in rejoins.items() if r[0]["at_round"] == 4]
    assert retry and all(rejoins[p][0]["admitted_by"] == "hospital-c" for p in retry), rejoins
    assert rounds[3]["attempts"] >= 2 and rounds[3]["participants"] == sorted([*retry, "hospital-c"]), rounds[3]
    assert len(_final_models(tmp_path / "run", spec.parties)) == 1, "every party ends with the same model"
    assert report["final_auc"] > 0.98


@pytest.mark.parametrize("mode", ["lattice", "paillier"])
def test_a_party_lost_before_its_round_left_it_on_a_cluster_is_dropped_at_once_and_readmitted(tmp_path, mode):
    # Found by the lattice soak: on a cluster the header went out only with the slices, after the
    # mode's agreements (the lattice key shares, paillier's range), so no node knew the attempt
    # while the survivors waited in them for the dead party: message_timeout_s, then the job failed.
    spec = make_spec(
        job_id=f"rejoin-cluster-{mode}",
        rounds=8,
        protection={"mode": mode, "on_dropout": "retry"},
        transport={"message_timeout_s": 60.0},
    )
    lines: list[str] = []
    env = _slow_rounds(spec, **{"hospital-c": {"exit_round": 4, "exit_step": "started"}}, hold=(5, tmp_path / "asked"))
    report = run_local(spec, tmp_path, progress=False, echo=lines.append, party_env=env, nodes=2)

    said = [line for line in lines if line.startswith("hospital-c (pid ")]
    assert len(said) == 1 and "at round 4 of 8: restarting it" in said[0], lines
    rounds = report["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, 9)) and report["dropped"] == {}
    # Dropped as soon as its new process said it was back, not after the message timeout.
    assert rounds[3]["participants"] == ["hospital-a", "hospital-b"] and rounds[3]["seconds"] < 30, rounds[3]
    rejoin = report["parties"]["hospital-c"]["rejoins"]
    assert len(rejoin) == 1 and rejoin[0]["at_round"] <= 7, rejoin
    assert len(_final_models(tmp_path, spec.parties)) == 1, "every party ends with the same model"


def test_leader_killed_between_rounds_is_admitted_back_by_the_next_leader(tmp_path):
    spec = make_spec(job_id="rejoin-leader", rounds=14, protection={"mode": "groupmask", "on_dropout": "retry"})
    lines: list[str] = []
    outcome: dict = {}
    asked = tmp_path / "asked"  # the restarted leader's request: the others wait for it after round 7

    def launch():
        try:
            outcome["report"] = run_local(
                spec, tmp_path, progress=False, echo=lines.append, party_env=_slow_rounds(spec, hold=(7, asked))
            )
        except BaseException as error:  # handed to the test thread
            outcome["error"] = error

    launcher = threading.Thread(target=launch)
    launcher.start()
    wait_for_round(tmp_path / "parties" / "hospital-a.report.json", 3)
    pid = _pid_of(tmp_path, "--party", "hospital-a")
    os.kill(pid, signal.SIGKILL)  # in its pause after a round: no upload is open
    launcher.join(240)
    assert not launcher.is_alive() and "error" not in outcome, outcome.get("error")
    report = outcome["report"]

    assert any(line.startswith(f"hospital-a (pid {pid}) was killed by SIGKILL at round") for line in lines), lines
    rejoin = report["parties"]["hospital-a"]["rejoins"]
    assert len(rejoin) == 1 and rejoin[0]["admitted_by"] == "hospital-b", "the next leader admits the old one"
    back = rejoin[0]["at_round"]
    assert all(r["participants"] == spec.parties for r in report["rounds"][back - 1 :])
    assert any(r["participants"] == ["hospital-b", "hospital-c"] for r in report["rounds"])
    assert len(_final_models(tmp_path, spec.parties)) == 1
    assert report["final_auc"] > 0.98


def _confide_run(job: Path, workdir: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, **with_faults(round_delay_s=0.4)}
    command = [sys.executable, "-m", "confide", "run", *([str(job)] if job else []), "--workdir", str(workdir)]
    return subprocess.Popen(
        [*command, "--no-progress", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def test_confide_run_names_a_killed_aggregator_restarts_it_and_the_job_completes(tmp_path):
    spec = make_spec(job_id="supervised", rounds=12, protection={"mode": "secagg"})
    job = tmp_path / "job.json"
    job.write_text(spec.model_dump_json())
    workdir = tmp_path / "run"
    launcher = _confide_run(job, workdir)
    try:
        wait_for_round(workdir / "parties" / "hospital-b.report.json", 3)
        pid = _pid_of(workdir, "aggregator")
        os.kill(pid, signal.SIGKILL)
        output, _ = launcher.communicate(timeout=240)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, output
    assert f"aggregator (pid {pid}) was killed by SIGKILL at round" in output
    assert "restarted: aggregator was killed by SIGKILL" in output
    report = json.loads((workdir / "report.json").read_text())
    assert [r["process"] for r in report["restarts"]] == ["aggregator"]
    assert [r["round"] for r in report["rounds"]] == list(range(1, 13)) and report["dropped"] == {}
    assert len(_final_models(workdir, spec.parties)) == 1


def test_confide_run_names_a_killed_cluster_node_restarts_it_and_the_parties_readmit_it(tmp_path):
    spec = make_spec(job_id="supervised-cluster", rounds=16, protection={"mode": "secagg"})
    job = tmp_path / "job.json"
    job.write_text(spec.model_dump_json())
    workdir = tmp_path / "run"
    launcher = _confide_run(job, workdir, "--nodes", "2")
    try:
        wait_for_round(workdir / "parties" / "hospital-b.report.json", 3)
        pid = _node_pid(workdir, 0)  # node 0 also relays
        os.kill(pid, signal.SIGKILL)
        killed_at = len(json.loads((workdir / "parties" / "hospital-b.report.json").read_text())["rounds"])
        # Its new process dies too, while starting (found by the soak: the launcher failed the job).
        deadline = time.monotonic() + 30
        while (again := _node_pids(workdir, 0) - {pid}) == set():
            assert time.monotonic() < deadline, "node 0 was not restarted"
            time.sleep(0.01)
        os.kill(again.pop(), signal.SIGKILL)
        output, _ = launcher.communicate(timeout=240)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, output
    assert f"node-0 (pid {pid}) was killed by SIGKILL at round" in output
    assert "node-0 exited while starting" in output and "it will be restarted again" in output, output
    report = json.loads((workdir / "report.json").read_text())
    assert [r["process"] for r in report["restarts"]] == ["node-0", "node-0"]
    assert [r["round"] for r in report["rounds"]] == list(range(1, 17)) and report["dropped"] == {}
    assert len(_final_models(workdir, spec.parties)) == 1
    # The restarted node was re-admitted: it served (and stored) its share of the last round.
    state = workdir / "aggregator-state" / "node-0"
    stored = [int(path.name.split("-")[1]) for path in state.rglob("round-*-s0.bin")]
    assert max(stored) == spec.rounds, (killed_at, sorted(stored))


def test_confide_run_resume_goes_on_from_the_last_round_every_party_checkpointed(tmp_path):
    spec = make_spec(job_id="resumable", rounds=12, checkpoint_interval=2, protection={"mode": "paillier"})
    job = tmp_path / "job.json"
    job.write_text(spec.model_dump_json())
    workdir = tmp_path / "run"
    launcher = _confide_run(job, workdir)
    try:
        wait_for_round(workdir / "parties" / "hospital-a.report.json", 5)
        launcher.send_signal(signal.SIGTERM)
        output, _ = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert launcher.returncode == 130, output
    assert f"confide run --resume --workdir {workdir}" in output
    with pytest.raises(AssertionError, match="found \\[\\]"):
        _pid_of(workdir, "aggregator")  # the launcher stopped what it started

    resumed = _confide_run(None, workdir, "--resume")
    output, _ = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, output
    report = json.loads((workdir / "report.json").read_text())
    after = report["resumed_after_round"]
    assert after >= 4 and after % 2 == 0 and f"resuming after round {after}" in output
    assert [r["round"] for r in report["rounds"]] == list(range(1, 13)), "the earlier rounds stay in the report"
    assert len(_final_models(workdir, spec.parties)) == 1
    assert report["final_auc"] > 0.98


def test_resume_refuses_a_workdir_without_a_common_checkpoint(tmp_path):
    spec = make_spec(job_id="nothing-yet", rounds=4)
    (tmp_path / "job.json").write_text(spec.model_dump_json())
    done = subprocess.run(
        [sys.executable, "-m", "confide", "run", "--resume", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "no round is checkpointed by every party" in done.stderr
