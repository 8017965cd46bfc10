"""Soak: long jobs while their processes are SIGKILLed at random, the controller's too.

Two parts, each ``--rounds`` rounds of Homo LR on breast cancer (secagg by default), every
``--kill-every`` seconds on average (exponential gaps, seeded) a SIGKILL:

1. **Launcher.** One ``confide run --nodes N`` (an aggregator cluster of ``--nodes`` processes,
   or one aggregator with ``--nodes 1``, and three parties, gRPC with mutual TLS on loopback).
   The victim is an aggregator node with probability ``--aggregator-share``, else a party drawn
   at random, one node and one party down at a time: a node or a party is killed only once the
   last one killed has served or trained a round since it came back (every node lost at once
   fails a job by design, and parties killed faster than they come back end with none holding
   the model; two of three dying in one round is survived, tests/integration/test_supervision.py,
   but not drawn here). The launcher must name each death and restart the process, and the job must go on: a
   restarted node re-admitted by the parties at a round boundary (the next live node serving
   its share, and the relay, meanwhile), a restarted aggregator with its stored rounds, a
   restarted party rejoining at a round boundary with the model everyone holds.
2. **Controller.** A whole deployment (``LocalDeployment``: controller on SQLite, aggregator and
   three party agents as processes); a developer submits the job as a session and the victim is
   always the controller, which this script starts again on its port as a service manager
   would. The job's data plane does not need it; the agents keep their per-round metrics until
   a heartbeat gets through, so the controller must end with the session completed and every
   round's metrics of every party (``--controller-rounds``, 0 to skip).

What it checks and records (``benchmarks/results/soak.json``):

- ``soak.rounds_completed``: rounds in the job report (must be all of them) and
  ``soak.rounds_lost``: rounds missing from it (must be 0);
- ``soak.kills`` and ``soak.restarts``: every kill must show up as a restart in the report;
- ``soak.models_identical``: 1 when every party that finished holds the same final weights;
- ``soak.parties_dropped``: parties that left the job for good (must be 0: a killed party comes back);
- ``soak.controller.*``: the same for the controller part, where a round is lost when the
  controller lacks its metrics for any party;
- per role (aggregator, party, controller, agent), the peak resident memory of any process
  (``VmHWM``) and the growth of resident memory over the life of each long-lived process (median
  of its last fifth minus median of its first fifth after the first 5 % of its life), sampled
  once a second from ``/proc``.

No anchor: the figures are checks and memory, not speed against another system.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchutil import machine, record, results_table, write, write_markdown_block  # noqa: E402

from tests.fixtures.faults import confide_processes  # noqa: E402

PARTIES = ["hospital-a", "hospital-b", "hospital-c"]


def job(rounds: int, mode: str) -> dict:
    return {
        "job_id": "soak",
        "rounds": rounds,
        "parties": PARTIES,
        "model": {"algorithm": "homo_lr", "learning_rate": 0.1, "local_epochs": 1, "batch_size": 32},
        "data": {"dataset": "breast_cancer", "split": "iid", "seed": 11},
        "protection": {"mode": mode, "on_dropout": "retry", "min_parties": 2},
        "transport": {"round_timeout_s": 30.0, "dropout_grace_s": 1.0, "reconnect_timeout_s": 60.0},
        "checkpoint_interval": 20,
        "seed": 11,
    }


def processes(workdir: Path) -> dict[int, str]:
    """Live ``confide`` processes of this soak: pid -> role (``aggregator``, ``node-K``, ``controller``,
    ``agent`` or the party's name)."""
    found = {}
    for pid, argv in confide_processes(workdir).items():
        if (
            "aggregator" in argv
            and "--state" in argv
            and Path(argv[argv.index("--state") + 1]).name.startswith("node-")
        ):
            found[pid] = Path(argv[argv.index("--state") + 1]).name
        elif "aggregator" in argv:
            found[pid] = "aggregator"
        elif "controller" in argv:
            found[pid] = "controller"
        elif "agent" in argv:
            found[pid] = "agent"
        elif "--party" in argv:
            found[pid] = argv[argv.index("--party") + 1]
    return found


def role_of(name: str) -> str:
    """The memory figure a process counts in: nodes count as aggregators, every party as ``party``."""
    if name.startswith("node-"):
        return "aggregator"
    return name if name in ("aggregator", "controller", "agent") else "party"


def last_rounds(run: Path) -> list[int]:
    """The last round in each party's report (0 where it has none yet or it is being rewritten)."""
    found = []
    for party in PARTIES:
        try:
            rounds = json.loads((run / "parties" / f"{party}.report.json").read_text())["rounds"]
        except (OSError, ValueError, KeyError):
            rounds = []
        found.append(rounds[-1]["round"] if rounds else 0)
    return found


def past_round(run: Path, number: int) -> bool:
    """Whether every party's report shows a round after ``number``."""
    return min(last_rounds(run)) > number


def served_since(run: Path, role: str, number: int) -> bool:
    """Whether aggregator ``role`` (``node-K``, or ``aggregator``) stored a round after ``number``.

    A node that comes back serves again only once every party re-admits it at a round boundary;
    until then the other node serves alone, and killing that one too fails the job by design.
    """
    folder = run / "aggregator-state" / (role if role.startswith("node-") else "")
    stored = [int(path.name.split("-")[1]) for path in folder.glob("*/round-*.bin")]
    return max(stored, default=0) > number


def current_round(run: Path) -> int:
    """The newest round any party's report shows."""
    return max(last_rounds(run))


def memory(pid: int) -> tuple[float, float] | None:
    """(VmRSS, VmHWM) of ``pid`` in MiB, or None once it is gone."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024
    except (OSError, KeyError, ValueError):
        return None


class Sampler(threading.Thread):
    """Resident memory of every process of the soak, once a second."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(daemon=True)
        self.workdir = workdir
        self.samples: dict[int, list[tuple[float, float, float]]] = {}
        self.roles: dict[int, str] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            now = time.monotonic()
            for pid, role in processes(self.workdir).items():
                sample = memory(pid)
                if sample is not None:
                    self.roles[pid] = role
                    self.samples.setdefault(pid, []).append((now, *sample))


def growth(samples: list[tuple[float, float, float]]) -> float:
    """Median RSS of the last fifth minus that of the first fifth, after the first 5 % of the life."""
    kept = samples[max(1, len(samples) // 20) :]
    fifth = max(1, len(kept) // 5)
    return statistics.median(s[1] for s in kept[-fifth:]) - statistics.median(s[1] for s in kept[:fifth])


def controller_job(rounds: int, mode: str) -> dict:
    """The soak's job as a deployment session: the same model, each party's catalog shard as FL_Data."""
    spec = job(rounds, mode)
    del spec["data"]
    spec["job_id"] = "soak-controller"
    spec["fl_data"] = {
        "label": "diagnosis",
        "participants": {p: {"dataset": "breast-cancer", "seed": 3} for p in PARTIES},
        "pipeline": [{"name": "scaled", "op": "scale", "params": {"method": "standard"}}],
    }
    return spec


def launcher_part(args, rng: random.Random, workdir: Path) -> tuple[list[dict], Sampler, list[dict]]:
    """``confide run --nodes N`` under party and node (or aggregator) kills; returns (records, sampler, kills)."""
    spec = workdir / "soak.json"
    spec.write_text(json.dumps(job(args.rounds, args.mode)))
    run = workdir / "run"
    log = open(workdir / "launcher.log", "w")
    started = time.monotonic()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "confide", "run", str(spec), "--workdir", str(run), "--no-progress"]
        + ["--max-restarts", "1000", "--nodes", str(args.nodes)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    sampler = Sampler(run)
    sampler.start()
    kills: list[dict] = []
    down_at = {"server": 0, "party": 0}  # the round at which the last of each was killed
    last_server = ""
    next_kill = started + rng.expovariate(1 / args.kill_every)
    while launcher.poll() is None:
        time.sleep(0.2)
        if time.monotonic() < next_kill or not past_round(run, 5):
            continue  # kills start once the job runs (a death during set-up fails a job by design)
        next_kill = time.monotonic() + rng.expovariate(1 / args.kill_every)
        live = processes(run)
        kind = "server" if rng.random() < args.aggregator_share else "party"
        if down_at[kind] and not past_round(run, down_at[kind] + 1):
            # One node and one party down at a time: the last one killed must have served (or
            # trained) a round since it came back. Every node lost at once fails a job by design,
            # and kills faster than restarts end with no party holding the model.
            continue
        if kind == "server" and last_server and not served_since(run, last_server, down_at["server"]):
            continue  # the node killed last is not serving again yet: the job has one node now
        if kind == "server":
            servers = sorted(r for r in live.values() if r == "aggregator" or r.startswith("node-"))
            if len(servers) < args.nodes or len(servers) != len(set(servers)):
                continue  # a node is still restarting
            role = rng.choice(servers)
        else:
            role = rng.choice(PARTIES)
        down_at[kind] = current_round(run)
        victims = [pid for pid, r in live.items() if r == role]
        if len(victims) != 1:
            continue  # mid-restart or finished: skip this kill
        try:
            os.kill(victims[0], signal.SIGKILL)
        except ProcessLookupError:
            continue
        if kind == "server":
            last_server = role
        kills.append({"at_s": round(time.monotonic() - started, 1), "role": role, "pid": victims[0]})
        print(f"  {kills[-1]['at_s']:7.1f} s  SIGKILL {role} (pid {victims[0]})", flush=True)
    wall = time.monotonic() - started
    sampler.stop.set()
    sampler.join()
    log.close()
    if launcher.returncode != 0:
        print((workdir / "launcher.log").read_text()[-4000:])
        raise SystemExit(f"the soak's job failed (confide run exited {launcher.returncode}); see {workdir}")

    report = json.loads((run / "report.json").read_text())
    numbers = [r["round"] for r in report["rounds"]]
    lost = sorted(set(range(1, args.rounds + 1)) - set(numbers))
    finals = {}
    for party in PARTIES:
        party_report = json.loads((run / "parties" / f"{party}.report.json").read_text())
        if party_report["status"] == "completed":
            finals[party] = tuple(party_report["weights"])
    identical = len(set(finals.values())) == 1 and len(finals) >= 2
    # Under the launcher a killed party comes back: one that left the job for good is a defect
    # (the lattice soak found one: a key share sealed to a restarted party's old pair key).
    dropped = report.get("dropped") or {}
    restarts = report["restarts"]
    params = {
        "rounds": args.rounds,
        "mode": args.mode,
        "nodes": args.nodes,
        "kill_every_s": args.kill_every,
        "seed": args.seed,
        "node_kills": sum(k["role"].startswith("node-") or k["role"] == "aggregator" for k in kills),
    }
    results = [
        record("soak.rounds_completed", len(numbers), "rounds", params=params),
        record("soak.rounds_lost", len(lost), "rounds", params=params),
        record("soak.kills", len(kills), "kills", params=params),
        record("soak.restarts", len(restarts), "restarts", params=params),
        record("soak.models_identical", float(identical), "bool", params={**params, "parties": sorted(finals)}),
        record("soak.parties_dropped", len(dropped), "parties", params={**params, "dropped": dropped}),
        record("soak.wall_seconds", wall, "s", params=params),
    ]
    print(f"launcher part: kills {len(kills)}, restarts in the report {len(restarts)}, lost rounds {lost[:10]}")
    if lost or len(restarts) < len(kills) or not identical or dropped:
        raise SystemExit(
            f"soak failed: rounds lost {lost[:10]}, {len(kills)} kills and {len(restarts)} restarts, "
            f"models identical: {identical}, parties dropped: {dropped}; see {workdir}"
        )
    return results, sampler, kills


def controller_part(args, rng: random.Random, workdir: Path) -> tuple[list[dict], Sampler, list[dict]]:
    """A deployment session under controller kills; returns (records, sampler, kills)."""
    from confide.errors import ConfideError
    from confide.local import LocalDeployment

    deployment = LocalDeployment(workdir / "deploy", parties=list(PARTIES))
    deployment.start()
    sampler = Sampler(deployment.workdir)
    sampler.start()
    kills: list[dict] = []
    rounds = args.controller_rounds
    try:
        deployment.grant_all("alice")
        with deployment.client("alice") as alice:
            token = alice.submit(controller_job(rounds, args.mode))["session"]
        started = time.monotonic()
        next_kill = started + rng.expovariate(1 / args.kill_every)
        deadline = started + 60 + rounds * 2.0
        state = None
        while time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                with deployment.client("alice") as alice:
                    state = alice.status(token)["state"]
            except ConfideError:
                state = None  # down (killed, or restarting)
            if state in ("completed", "failed", "refused", "cancelled", "revoked"):
                break
            if time.monotonic() < next_kill or state is None:
                continue
            next_kill = time.monotonic() + rng.expovariate(1 / args.kill_every)
            pid = deployment.children.children["controller"].pid
            deployment.children.kill("controller")
            kills.append({"at_s": round(time.monotonic() - started, 1), "role": "controller", "pid": pid})
            print(f"  {kills[-1]['at_s']:7.1f} s  SIGKILL controller (pid {pid})", flush=True)
            time.sleep(rng.uniform(0.0, 2.0))  # down a while, as a machine that reboots
            deployment.start_controller()
        wall = time.monotonic() - started
        if state != "completed":
            raise SystemExit(f"soak failed: the controller's session is {state!r} after {wall:.0f} s; see {workdir}")
        # The last heartbeats may still be on their way: metrics of the last rounds arrive within a few.
        missing: dict[str, list[int]] = {}
        for _ in range(40):
            with deployment.client("alice") as alice:
                metrics = alice.request("GET", f"/v1/sessions/{token}/metrics")
            seen = {r["name"]: {m["round"] for m in r["metrics"]} for r in metrics["participants"]}
            missing = {p: sorted(set(range(1, rounds + 1)) - seen.get(p, set())) for p in PARTIES}
            if not any(missing.values()):
                break
            time.sleep(0.5)
        finals = {}
        for party in PARTIES:
            reports = sorted(
                (deployment.workdir / "parties" / party / "sessions" / token).rglob(f"{party}.report.json")
            )
            report = json.loads(reports[-1].read_text())
            if report["status"] == "completed":
                finals[party] = tuple(report["weights"])
    finally:
        sampler.stop.set()
        sampler.join()
        deployment.stop()
    lost = sorted({r for rows in missing.values() for r in rows})
    identical = len(set(finals.values())) == 1 and len(finals) == len(PARTIES)
    params = {"rounds": rounds, "mode": args.mode, "kill_every_s": args.kill_every, "seed": args.seed}
    results = [
        record("soak.controller.rounds_completed", rounds - len(lost), "rounds", params=params),
        record("soak.controller.rounds_lost", len(lost), "rounds", params=params),
        record("soak.controller.kills", len(kills), "kills", params=params),
        record("soak.controller.models_identical", float(identical), "bool", params=params),
        record("soak.controller.wall_seconds", wall, "s", params=params),
    ]
    print(f"controller part: kills {len(kills)}, rounds without metrics at the controller {lost[:10]}")
    if lost or not identical:
        raise SystemExit(f"soak failed: the controller lacks rounds {lost[:10]} or the models differ; see {workdir}")
    return results, sampler, kills


def memory_records(samplers: list[Sampler], wall: float, params: dict) -> list[dict]:
    """Peak RSS per role, and the growth of each process that lived long enough (worst per role)."""
    by_role: dict[str, list[tuple[Sampler, int]]] = {}
    for sampler in samplers:
        for pid, name in sampler.roles.items():
            by_role.setdefault(role_of(name), []).append((sampler, pid))
    results = []
    for role, members in sorted(by_role.items()):
        peak = max(max(s[2] for s in sampler.samples[pid]) for sampler, pid in members)
        results.append(record(f"soak.peak_rss_mb.{role}", peak, "MiB", params=params))
        lived = [sampler.samples[pid] for sampler, pid in members if len(sampler.samples[pid]) >= max(30, 0.3 * wall)]
        if lived:
            worst = max(growth(samples) for samples in lived)
            results.append(
                record(f"soak.rss_growth_mb.{role}", worst, "MiB", params={**params, "processes": len(lived)})
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--controller-rounds", type=int, default=1000, help="rounds of the controller part (0: skip)")
    parser.add_argument("--mode", default="secagg")
    parser.add_argument(
        "--nodes", type=int, default=2, help="aggregator nodes of the launcher part (1: one aggregator)"
    )
    parser.add_argument("--kill-every", type=float, default=2.0, help="mean seconds between kills")
    parser.add_argument("--aggregator-share", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--write", action="store_true", help="also update docs/benchmarks.md")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="confide-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results, sampler, kills = launcher_part(args, rng, workdir)
    samplers, wall = [sampler], results[-1]["value"]
    controller_kills: list[dict] = []
    if args.controller_rounds:
        more, sampler, controller_kills = controller_part(args, rng, workdir)
        results += more
        samplers.append(sampler)
    params = {"rounds": args.rounds, "mode": args.mode, "nodes": args.nodes, "seed": args.seed}
    results += memory_records(samplers, wall, params)
    info = machine()
    # secagg's run is soak.json; another mode's is soak-<mode>.json, so neither replaces the other
    name = "soak" if args.mode == "secagg" else f"soak-{args.mode}"
    path = write(name, info, results)
    lines = results_table(results, value=",.1f")
    print("\n".join(lines))
    print(f"wrote {path}")
    if args.write:
        servers = sum(k["role"] != "controller" and k["role"] not in PARTIES for k in kills)
        said = (
            f"Measured {info['date']} on {info['cpu']} ({info['cores']} cores), commit {info['commit']}: "
            f"{args.rounds} rounds of {args.mode} under `confide run --nodes {args.nodes}`, a SIGKILL every "
            f"{args.kill_every:g} s on average ({len(kills)} kills: {servers} of aggregator nodes, the rest "
            f"parties); then {args.controller_rounds} rounds as a controller session with "
            f"{len(controller_kills)} controller kills. One run."
        )
        heading = "Soak: a long job under random SIGKILLs" + ("" if name == "soak" else f" ({args.mode})")
        write_markdown_block(name, heading, [said, "", *lines], "soak")


if __name__ == "__main__":
    main()
