"""Soak: a long job under ``confide run`` while its processes are SIGKILLed at random.

One ``confide run`` (aggregator and three parties as separate processes, gRPC with mutual TLS on
loopback) trains Homo LR on breast cancer for ``--rounds`` rounds in ``--mode`` (secagg by
default). Every ``--kill-every`` seconds on average (exponential gaps, seeded) this script
SIGKILLs one of them: the aggregator with probability ``--aggregator-share``, else a party drawn
at random. The launcher must name each death, restart the process, and the job must go on:
a restarted aggregator with its stored rounds, a restarted party rejoining at a round boundary
with the model everyone holds.

What it checks and records (``benchmarks/results/soak.json``):

- ``soak.rounds_completed``: rounds in the job report (must be all of them) and
  ``soak.rounds_lost``: rounds missing from it (must be 0);
- ``soak.kills`` and ``soak.restarts``: every kill must show up as a restart in the report;
- ``soak.models_identical``: 1 when every party that finished holds the same final weights;
- per role, the peak resident memory of any process (``VmHWM``) and the growth of resident
  memory over the life of each long-lived process (median of its last fifth minus median of its
  first fifth after the first 5 % of its life), sampled once a second from ``/proc``.

Controller kills and aggregator cluster node kills are not part of this soak (docs/benchmarks.md).
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
    """Live ``confide`` processes of this soak: pid -> role (aggregator or the party's name)."""
    found = {}
    for pid, argv in confide_processes(workdir).items():
        if "aggregator" in argv:
            found[pid] = "aggregator"
        elif "--party" in argv:
            found[pid] = argv[argv.index("--party") + 1]
    return found


def past_round(run: Path, number: int) -> bool:
    """Whether every party's report shows a round after ``number``."""
    for party in PARTIES:
        try:
            rounds = json.loads((run / "parties" / f"{party}.report.json").read_text())["rounds"]
        except (OSError, ValueError, KeyError):
            return False
        if not rounds or rounds[-1]["round"] <= number:
            return False
    return True


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--mode", default="secagg")
    parser.add_argument("--kill-every", type=float, default=4.0, help="mean seconds between kills")
    parser.add_argument("--aggregator-share", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--write", action="store_true", help="also update docs/benchmarks.md")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="confide-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    spec = workdir / "soak.json"
    spec.write_text(json.dumps(job(args.rounds, args.mode)))
    run = workdir / "run"
    log = open(workdir / "launcher.log", "w")
    started = time.monotonic()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "confide", "run", str(spec), "--workdir", str(run), "--no-progress"]
        + ["--max-restarts", "1000"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    sampler = Sampler(run)
    sampler.start()
    kills: list[dict] = []
    next_kill = started + rng.expovariate(1 / args.kill_every)
    while launcher.poll() is None:
        time.sleep(0.2)
        if time.monotonic() < next_kill or not past_round(run, 5):
            continue  # kills start once the job runs (a death during set-up fails a job by design)
        next_kill = time.monotonic() + rng.expovariate(1 / args.kill_every)
        live = processes(run)
        role = "aggregator" if rng.random() < args.aggregator_share else rng.choice(PARTIES)
        victims = [pid for pid, r in live.items() if r == role]
        if len(victims) != 1:
            continue  # mid-restart or finished: skip this kill
        try:
            os.kill(victims[0], signal.SIGKILL)
        except ProcessLookupError:
            continue
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
    restarts = report["restarts"]
    by_role: dict[str, list[int]] = {}
    for pid, role in sampler.roles.items():
        by_role.setdefault("aggregator" if role == "aggregator" else "party", []).append(pid)
    params = {"rounds": args.rounds, "mode": args.mode, "kill_every_s": args.kill_every, "seed": args.seed}
    results = [
        record("soak.rounds_completed", len(numbers), "rounds", params=params),
        record("soak.rounds_lost", len(lost), "rounds", params=params),
        record("soak.kills", len(kills), "kills", params=params),
        record("soak.restarts", len(restarts), "restarts", params=params),
        record("soak.models_identical", float(identical), "bool", params={**params, "parties": sorted(finals)}),
        record("soak.wall_seconds", wall, "s", params=params),
    ]
    for role, pids in sorted(by_role.items()):
        peak = max(max(s[2] for s in sampler.samples[pid]) for pid in pids)
        results.append(record(f"soak.peak_rss_mb.{role}", peak, "MiB", params=params))
        lived = [pid for pid in pids if len(sampler.samples[pid]) >= max(30, 0.3 * wall)]
        if lived:
            worst = max(growth(sampler.samples[pid]) for pid in lived)
            results.append(
                record(f"soak.rss_growth_mb.{role}", worst, "MiB", params={**params, "processes": len(lived)})
            )
    info = machine()
    path = write("soak", info, results)
    lines = results_table(results, value=",.1f")
    print("\n".join(lines))
    print(f"kills {len(kills)}, restarts in the report {len(restarts)}, lost rounds {lost[:10]}; wrote {path}")
    if args.write:
        said = (
            f"Measured {info['date']} on {info['cpu']} ({info['cores']} cores), commit {info['commit']}: "
            f"{args.rounds} rounds of {args.mode}, a SIGKILL every {args.kill_every:g} s on average "
            f"({len(kills)} kills: {sum(k['role'] == 'aggregator' for k in kills)} of the aggregator), one run."
        )
        write_markdown_block("soak", "Soak: a long job under random SIGKILLs", [said, "", *lines], "soak")
    if lost or len(restarts) < len(kills) or not identical:
        raise SystemExit("soak failed: rounds lost, a kill without a restart, or the parties' models differ")


if __name__ == "__main__":
    main()
