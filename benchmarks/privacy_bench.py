"""Privacy benchmark, in one run: threshold Paillier's costs and what differential privacy costs in accuracy.

- ``threshold.*``: from :mod:`threshold_bench` (partial decryption vs CRT decryption, a round's
  crypto vs ``paillier``'s at the runtime shapes, key generation for 3 and 10 parties).
- ``privacy.dp_sgd.breast_cancer.eps<e>.auc``: homo_lr with record-level DP-SGD, 3 hospitals,
  15 rounds under groupmask, median over seeds; anchor: the same job without DP, same run.
- ``privacy.dp_sgd.digits.eps<e>.accuracy``: the PyTorch CNN of examples/pytorch_digits with
  DP-SGD through Opacus, 10 rounds; anchor: the same job without DP.
- ``privacy.distributed.breast_cancer.eps<e>.auc``: party-level DP with distributed discrete
  Gaussian noise under secagg (3 hospitals, so the noise is large); anchor: no DP.

Every job runs as separate processes over gRPC + mTLS (``run_local``), as a user's would.
Writes benchmarks/results/privacy.json and prints the table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from benchutil import machine, record, results_table, write  # noqa: E402
from threshold_bench import threshold_records  # noqa: E402

from confide.local import run_local  # noqa: E402
from confide.spec import load_job, parse_job  # noqa: E402

EPSILONS = (1, 3, 8)


def _run(spec: dict) -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        return run_local(parse_job(spec), workdir, progress=False, echo=lambda *_: None)


def breast_cancer(privacy: dict | None, seed: int, protection: dict) -> float:
    spec = load_job(ROOT / "examples" / "breast_cancer.yaml").model_dump(mode="json")
    spec.update(job_id=f"bench-privacy-{seed}", seed=seed, protection=protection, privacy=privacy)
    spec["data"]["seed"] = seed
    return float(_run(spec)["final_auc"])


def digits(privacy: dict | None) -> float:
    spec = load_job(ROOT / "examples" / "pytorch_digits" / "job.yaml").model_dump(mode="json")
    spec.update(job_id="bench-privacy-digits", privacy=privacy, protection={"mode": "groupmask"})
    return float(_run(spec)["final_accuracy"])


def _breast_cancer_records(mechanism: str, protection: dict, seeds: int) -> list[dict]:
    """One record per epsilon: the median AUC over seeds, against the same job without DP."""
    plain = statistics.median(breast_cancer(None, s, protection) for s in range(seeds))
    out = []
    for epsilon in EPSILONS:
        privacy = {"mechanism": mechanism, "epsilon": epsilon, "clip_norm": 1.0}
        runs = [breast_cancer(privacy, s, protection) for s in range(seeds)]
        print(f"{mechanism} breast cancer eps {epsilon}: {[round(r, 4) for r in runs]}", flush=True)
        out.append(
            record(
                f"privacy.{mechanism}.breast_cancer.eps{epsilon}.auc",
                statistics.median(runs),
                "AUC",
                "same job without DP (median AUC)",
                plain,
                {
                    "seeds": seeds,
                    "rounds": 15,
                    "parties": 3,
                    "delta": 1e-5,
                    "clip_norm": 1.0,
                    "protection": protection["mode"],
                    "runs": [round(r, 4) for r in runs],
                },
            )
        )
    return out


def dp_records(seeds: int) -> list[dict]:
    out = _breast_cancer_records("dp_sgd", {"mode": "groupmask"}, seeds)
    out += _breast_cancer_records("distributed", {"mode": "secagg", "mask_bound": 256}, seeds)
    plain_digits = digits(None)
    for epsilon in EPSILONS:
        accuracy = digits({"mechanism": "dp_sgd", "epsilon": epsilon, "clip_norm": 1.0})
        print(f"dp_sgd digits eps {epsilon}: {accuracy:.4f} (no DP {plain_digits:.4f})", flush=True)
        out.append(
            record(
                f"privacy.dp_sgd.digits.eps{epsilon}.accuracy",
                accuracy,
                "accuracy",
                "same job without DP",
                plain_digits,
                {"rounds": 10, "model": "examples/pytorch_digits (PyTorch CNN, Opacus)", "runs": 1},
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds of each breast-cancer configuration")
    parser.add_argument("--keygen-runs", type=int, default=3)
    parser.add_argument("--keygen-parties", default="3,10")
    parser.add_argument("--skip-threshold", action="store_true", help="only the DP records")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    results = []
    if not args.skip_threshold:
        results += threshold_records(args.keygen_runs, tuple(int(p) for p in args.keygen_parties.split(",")))
    results += dp_records(args.seeds)
    print("\n".join(results_table(results, value=",.4f", anchor=",.4f")))
    if not args.no_write:
        print(write("privacy", machine(), results))


if __name__ == "__main__":
    main()
