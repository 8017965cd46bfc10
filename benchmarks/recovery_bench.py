"""SecAgg dropout recovery: what ``on_dropout: recover`` costs a round, and what it saves on a dropout.

4 parties and the aggregator as separate processes on loopback with mutual TLS, Homo LR on
synthetic data (20,000 rows x ``--features`` sparse, 100 non-zeros a row, 1 local epoch),
``secagg`` with a public bound.

- Steady rounds: seconds per round (median of the rounds after the first) of ``secagg`` with
  ``on_dropout: recover`` against plain ``secagg`` (``on_dropout: retry``, the anchor), runs
  interleaved. Recovery adds the Shamir shares before the upload, the views and reveals after
  it, and the removal of every survivor's self mask (one keystream of the vector each).
- A dropout: party 4 dies once round 3 is open (after its header, before any slice). Under
  ``retry`` the aggregator aborts the attempt after ``dropout_grace_s`` and the survivors run
  the round again from local training; under ``recover`` it excludes the party and the round
  completes without a retry. Record: round 3's seconds under each.

Every figure is the median over ``--repeats`` runs (a single job swings by tens of percent on
a shared 2-core machine). Writes ``benchmarks/results/recovery.json`` and its block in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchutil import machine, record, results_table, write, write_markdown_block  # noqa: E402

from confide.local import run_local  # noqa: E402
from confide.spec import parse_job  # noqa: E402
from tests.fixtures.faults import with_faults  # noqa: E402

PARTIES = ["party-1", "party-2", "party-3", "party-4"]


def run(on_dropout: str, features: int, rounds: int, workdir: Path, *, dropout: bool) -> dict:
    spec = parse_job(
        {
            "job_id": f"recovery-{on_dropout}-{'drop' if dropout else 'steady'}",
            "rounds": rounds,
            "parties": PARTIES,
            "model": {"algorithm": "homo_lr", "learning_rate": 0.05, "local_epochs": 1, "batch_size": 256},
            "data": {
                "dataset": "synthetic",
                "samples": 20_000,
                "features": features,
                "density": 100 / features,
                "test_fraction": 0.05,
            },
            "protection": {"mode": "secagg", "on_dropout": on_dropout},
            "transport": {"dropout_grace_s": 1.0},
            "seed": 1,
        }
    )
    env = {"party-4": with_faults(exit_round=3)} if dropout else {}
    report = run_local(spec, workdir, progress=False, echo=lambda *_: None, party_env=env, max_restarts=0)
    later = report["rounds"][1:]
    return {
        "seconds": statistics.median(r["seconds"] for r in later),
        "round3": report["rounds"][2]["seconds"],
        "attempts3": report["rounds"][2]["attempts"],
        "auc": report["final_auc"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs: dict[tuple[str, bool], list[dict]] = {}
    with tempfile.TemporaryDirectory() as directory:
        for repeat in range(args.repeats):
            for dropout in (False, True):
                for on_dropout in ("retry", "recover"):
                    target = Path(directory) / f"{repeat}-{on_dropout}-{dropout}"
                    result = run(on_dropout, args.features, args.rounds, target, dropout=dropout)
                    runs.setdefault((on_dropout, dropout), []).append(result)
                    print(
                        f"repeat {repeat} {on_dropout:7s} {'dropout' if dropout else 'steady '}: "
                        f"{result['seconds']:.3f} s/round, round 3 {result['round3']:.3f} s "
                        f"({result['attempts3']} attempt(s)), AUC {result['auc']:.4f}",
                        flush=True,
                    )

    def median(key: tuple[str, bool], field: str) -> float:
        return statistics.median(r[field] for r in runs[key])

    params = {
        "parties": len(PARTIES),
        "features": args.features,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "dropout_grace_s": 1.0,
    }
    results = [
        record(
            "secagg.recover.steady.seconds_per_round",
            median(("recover", False), "seconds"),
            "s",
            "secagg retry",
            median(("retry", False), "seconds"),
            params,
        ),
        record(
            "secagg.recover.dropout_round.seconds",
            median(("recover", True), "round3"),
            "s",
            "secagg retry",
            median(("retry", True), "round3"),
            params,
        ),
        record(
            "secagg.recover.dropout_round.attempts", median(("recover", True), "attempts3"), "attempts", params=params
        ),
        record("secagg.retry.dropout_round.attempts", median(("retry", True), "attempts3"), "attempts", params=params),
        record("secagg.recover.auc", median(("recover", True), "auc"), "AUC", params=params),
    ]
    path = write("recovery", machine(), results)
    lines = [
        f"4 parties, Homo LR on 20,000 x {args.features:,} sparse synthetic rows (100 non-zeros each), "
        f"median of {args.repeats} runs "
        f"(modes interleaved). Anchor: plain `secagg` (abort and retry) in the same run. The dropout: party 4 "
        "dies after its header in round 3.",
        "",
        *results_table(results, value=",.3f", anchor=",.3f"),
    ]
    write_markdown_block("recovery", "SecAgg dropout recovery", lines, "recovery_bench")
    print(f"wrote {path}")
    for line in results_table(results, value=",.3f", anchor=",.3f"):
        print(line)


if __name__ == "__main__":
    main()
