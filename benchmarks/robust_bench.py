"""Trusting the aggregator less: what verification costs, what it catches, and what robust rules hold.

Three parts, each against an anchor measured in the same run:

1. **Verification cost at 20k values** (in one process, three ``secagg`` parties over an
   in-memory relay, so only the arithmetic is timed): all of a party's verification work in a
   round, waiting for peers aside (``verify.party_ms.20k``: the commitment hash, the inner
   products of the sum and of its own encoding, pads, the message, the check), and of it the
   check once the peers' tags are in (``verify.check_ms.20k``: added and compared). Anchor: the
   same party's secagg encode and decode of the slice.
   LightVeriFL reports 18 ms per user and 9.5 ms to verify at 20k dimensions.
2. **Verification in a round at 1.25M values** (real processes, mTLS): ``secagg`` with Homo LR
   on 1.25M sparse features, 3 parties; the fraction of a round the check takes
   (``verify.round_overhead.1_25m``: the parties' ``verify_s`` over the round's seconds, median of
   the rounds after the first), and the rounds with ``verify: off`` as the anchor.
3. **Attacks** (real processes, 5 parties, ``benchmarks/attack_model.py``): one party scaling
   its update by 100, flipping its sign (x -4) or pushing one value 2^20 out; accuracy on digits
   and breast cancer under FedAvg and every robust rule, against clean FedAvg
   (``robust.<rule>.scaling_attack.accuracy_gap``: clean FedAvg's accuracy minus the rule's under
   the scaling attack, on digits, in points). And an aggregator that lies
   (``tests/fixtures/lying.py``): the round each lie is caught in and what the job cost.

4. **What a range proof costs** (``benchmarks/range_proof``, the dalek ``bulletproofs`` crate
   alone, built here on first use): aggregated proofs that each value of an update lies in
   [0, 2^16), 64 and 256 values a proof (and 32-bit values), proving and verifying, per 100k values
   (``bound.bulletproofs.seconds_per_100k``: proving 16-bit values, 64 a proof). No anchor runs
   here: ACORN reports 250k 16-bit values in under 80 s per client (32 s per 100k).
5. **What the product's bound proofs cost** (part ``proofs``; ``protection.prove_bound``,
   docs/crypto.md "Bounded updates"): the native calls a party makes, on 1,024 values of a
   3-party secagg fixed point: commit and prove (``bound.confide.prove_seconds_per_100k``), check
   one peer's proofs (``bound.confide.verify_seconds_per_100k``) and the sum check over three
   parties (``bound.confide.sum_check_seconds_per_100k``); and a real 3-party secagg job on breast
   cancer (31 values) with and without the proofs (``bound.confide.round_seconds.breast_cancer``).
   With ``protection.l2_bound``, the norm proof on the same commitments, apart from the range
   proofs: proving (``bound.l2.prove_seconds_per_100k``) and checking one peer's
   (``bound.l2.verify_seconds_per_100k``).

A run that skips parts keeps the earlier records of what it skipped (benchutil.merged).
Writes ``benchmarks/results/robust.json`` and its block in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchutil import machine, merged, merged_lines, record, results_table, write, write_markdown_block  # noqa: E402

from confide.errors import JobFailedError  # noqa: E402
from confide.local import run_local  # noqa: E402
from confide.spec import parse_job  # noqa: E402

ATTACK_MODEL = Path(__file__).resolve().parent / "attack_model.py"
FIVE = [f"hospital-{c}" for c in "abcde"]
RULES = ["median", "trimmed_mean", "krum", "multi_krum", "norm_clip"]
ATTACKS = {"scaling": "scale:100", "sign_flip": "sign_flip", "overflow": "overflow"}


# -- 1. verification at 20k values, in process ------------------------------------------------------------------


def verification_cost(length: int, repeats: int) -> list[dict]:
    from confide.protect.base import ProtectionParams, RoundContext
    from confide.protect.masking import SecAgg
    from confide.protect.verify import Verifier
    from confide.transport.certs import Identity, init_federation
    from confide.v1 import runtime_pb2 as pb
    from tests.unit.runtime.harness import MemoryHub, run_parallel

    names = ["alpha", "bravo", "charlie"]
    root = tempfile.mkdtemp(prefix="robust-bench-")
    init_federation(root, parties=names)
    hub = MemoryHub()
    params = ProtectionParams(setup_timeout_s=30, mask_bound=4.0, share_timeout_s=30)
    parties = {n: SecAgg(hub.exchange(Identity.load(root, n)), params) for n in names}
    for protection in parties.values():
        protection.verifier = Verifier(protection, timeout_s=30)
    run_parallel({n: (lambda p=p: p.setup(names)) for n, p in parties.items()})
    rng = np.random.default_rng(0)
    vectors = {n: rng.normal(0, 0.5, length).astype(np.float32) for n in names}
    tag, check, codec = [], [], []
    for round_number in range(1, repeats + 1):
        contexts = {n: RoundContext(round_number, 0, names, n, length, length, dtype="float32") for n in names}

        def encode(n, contexts=contexts):
            began = time.perf_counter()
            parties[n].begin_round(contexts[n], vectors[n])
            payload = parties[n].encode(contexts[n], 0, vectors[n])
            return payload, time.perf_counter() - began

        encoded = run_parallel({n: (lambda n=n: encode(n)) for n in names})
        total = np.zeros(length, dtype=np.uint32)
        for payload, _ in encoded.values():
            total += np.frombuffer(payload, dtype="<u4")

        def finish(n, contexts=contexts, total=total, encoded=encoded):
            protection, context = parties[n], contexts[n]
            protection.verifier.begin(context, vectors[n])
            began = time.perf_counter()
            protection.finish_round(context, lambda i: pb.Slice(index=0, n_valid=length, payload=total.tobytes()))
            decode = time.perf_counter() - began - protection.verifier.seconds
            protection.verifier.settle(names)
            verifier = protection.verifier
            return verifier.tag_seconds + verifier.check_seconds, verifier.check_seconds, decode + encoded[n][1]

        for t, c, d in run_parallel({n: (lambda n=n: finish(n)) for n in names}).values():
            tag.append(t)
            check.append(c)
            codec.append(d)
    codec_ms = 1e3 * statistics.median(codec)
    params_ = {"values": length, "parties": 3, "mode": "secagg", "rounds": repeats, "lightverifl_ms": [18, 9.5]}
    return [
        record("verify.party_ms.20k", 1e3 * statistics.median(tag), "ms", "secagg encode+decode", codec_ms, params_),
        record("verify.check_ms.20k", 1e3 * statistics.median(check), "ms", "secagg encode+decode", codec_ms, params_),
    ]


# -- 2. verification in a round at 1.25M values ------------------------------------------------------------------


def round_overhead(features: int, rounds: int, workdir: Path) -> list[dict]:
    def job(verify: str) -> dict:
        spec = parse_job(
            {
                "job_id": f"robust-overhead-{verify}",
                "rounds": rounds,
                "parties": FIVE[:3],
                "model": {"algorithm": "homo_lr", "learning_rate": 0.05, "local_epochs": 1, "batch_size": 256},
                "data": {"dataset": "synthetic", "samples": 6000, "features": features, "density": 100 / features},
                "protection": {"mode": "secagg", "verify": verify},
                "transport": {"round_timeout_s": 600.0},
                "seed": 5,
            }
        )
        return run_local(spec, workdir / f"overhead-{verify}", progress=False, echo=lambda *_: None, baseline=False)

    off, on = job("off"), job("auto")
    steady_on = on["rounds"][1:]
    fraction = statistics.median(r["verify_s"] / r["seconds"] for r in steady_on)
    seconds_on = statistics.median(r["seconds"] for r in steady_on)
    seconds_off = statistics.median(r["seconds"] for r in off["rounds"][1:])
    params = {
        "values": features + 1,
        "parties": 3,
        "mode": "secagg",
        "rounds": rounds,
        "train_s": round(statistics.median(r["train_s"] for r in steady_on), 4),
        "round_ratio_to_unverified": round(seconds_on / seconds_off, 4),
    }
    return [
        record("verify.round_overhead.1_25m", fraction, "fraction", "round without verification", None, params),
        record("verify.round_seconds.1_25m", seconds_on, "s", "round without verification", seconds_off, params),
    ]


# -- 3. attacks ---------------------------------------------------------------------------------------------------


def accuracy(dataset: str, strategy: str, attack: str | None, rounds: int, workdir: Path) -> float:
    spec = parse_job(
        {
            "job_id": f"robust-{dataset}-{strategy}-{(attack or 'clean').replace(':', 'x')}",
            "rounds": rounds,
            "parties": FIVE,
            "model": {"algorithm": "custom", "entry": f"{ATTACK_MODEL}:build", "options": {"learning_rate": 0.5}},
            "data": {"dataset": dataset, "split": "iid", "seed": 3},
            "strategy": {"name": strategy},
            "protection": {"mode": "plain"},
            "metrics": ["loss", "accuracy"],
            "seed": 3,
        }
    )
    env = {FIVE[-1]: {"CONFIDE_ATTACK": attack}} if attack else {}
    report = run_local(spec, workdir / spec.job_id, progress=False, echo=lambda *_: None, party_env=env, baseline=False)
    return float(report["final_accuracy"])


def attacks(rounds: int, workdir: Path) -> tuple[list[dict], list[str]]:
    results, lines = [], []
    for dataset in ("digits", "breast_cancer"):
        clean = accuracy(dataset, "fedavg", None, rounds, workdir)
        lines.append(f"| {dataset} | no attack | fedavg | {100 * clean:.1f} |")
        for attack_name, attack in ATTACKS.items():
            if dataset == "breast_cancer" and attack_name != "scaling":
                continue
            for strategy in ["fedavg", *RULES]:
                got = accuracy(dataset, strategy, attack, rounds, workdir)
                lines.append(f"| {dataset} | {attack_name} | {strategy} | {100 * got:.1f} |")
                params = {"dataset": dataset, "attack": attack, "parties": 5, "attackers": 1, "rounds": rounds}
                results.append(
                    record(
                        f"robust.{strategy}.{attack_name}_attack.{dataset}.accuracy",
                        got,
                        "accuracy",
                        "fedavg, no attack",
                        clean,
                        params,
                    )
                )
                if dataset == "digits" and attack_name == "scaling":
                    results.append(
                        record(
                            f"robust.{strategy}.scaling_attack.accuracy_gap",
                            100 * (clean - got),
                            "points",
                            "fedavg, no attack (accuracy)",
                            100 * clean,
                            params,
                            digits=2,
                        )
                    )
    return results, lines


def lies(workdir: Path) -> tuple[list[dict], list[str]]:
    from tests.fixtures.lying import LIES, environment

    results, lines = [], []
    for lie in LIES:
        spec = parse_job(
            {
                "job_id": f"robust-lie-{lie.replace('_', '-')}",
                "rounds": 4,
                "parties": FIVE[:3],
                "model": {"algorithm": "homo_lr", "learning_rate": 0.1, "local_epochs": 1},
                "data": {"dataset": "synthetic", "samples": 600, "features": 600, "seed": 3},
                "protection": {"mode": "secagg"},
                "transport": {"slice_bytes": 1024},
            }
        )
        saved = dict(os.environ)
        os.environ.update(environment(lie, round_number=2))
        began = time.perf_counter()
        try:
            run_local(
                spec,
                workdir / spec.job_id,
                progress=False,
                echo=lambda *_: None,
                baseline=False,
                aggregator_args=["--data-port", "-1"],
            )
            caught, message = None, "not caught"
        except JobFailedError as error:
            message = str(error)
            caught = 2 if re.search(r"round 2\b", message) and "refused" in message else None
        finally:
            os.environ.clear()
            os.environ.update(saved)
        seconds = time.perf_counter() - began
        results.append(
            record(
                f"verify.detect.{lie}.round",
                float(caught or 0),
                "round",
                None,
                None,
                {"lie_round": 2, "mode": "secagg", "parties": 3, "job_seconds": round(seconds, 2)},
            )
        )
        lines.append(f"| {lie} | {caught or 'NOT caught'} | {seconds:.1f} |")
    return results, lines


def bound_proofs(repeats: int) -> list[dict]:
    import json
    import subprocess

    root = Path(__file__).resolve().parent
    env = {**os.environ, "CARGO_TARGET_DIR": str(root.parent / "target" / "range-proof")}
    done = subprocess.run(
        [
            "cargo",
            "run",
            "--release",
            "-q",
            "--manifest-path",
            str(root / "range_proof" / "Cargo.toml"),
            "--",
            str(repeats),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    out = []
    for line in done.stdout.splitlines():
        row = json.loads(line)
        per_value = 1e5 / row["values_per_proof"]
        params = {**row, "library": "bulletproofs 5 (dalek)", "acorn_published_s_per_100k": 32}
        suffix = (
            "" if (row["bits"], row["values_per_proof"]) == (16, 64) else f".{row['bits']}bit.{row['values_per_proof']}"
        )
        out.append(
            record(f"bound.bulletproofs{suffix}.seconds_per_100k", row["prove_s"] * per_value, "s", None, None, params)
        )
        out.append(
            record(
                f"bound.bulletproofs{suffix}.verify_seconds_per_100k",
                row["verify_s"] * per_value,
                "s",
                None,
                None,
                params,
            )
        )
    return out


def product_proofs(repeats: int, workdir: Path) -> list[dict]:
    """The native bound-proof calls at 1,024 values, and a breast cancer job with and without them."""
    from confide import _native
    from confide.crypto.fixedpoint import FixedPoint
    from confide.protect.bound import proven_bits

    fixed = FixedPoint(8.0, 3)
    bits = proven_bits(fixed.scale, fixed.bound)
    rng = np.random.default_rng(5)
    count = 1024
    words = [fixed.encode(rng.uniform(-7.9, 7.9, count)) for _ in range(3)]
    key = bytes(range(16))
    adds = [[True, True], [False, True], [False, False]]
    # the L2 bound of protection.l2_bound: each update's own norm (rounded up), the tightest an update meets
    l2 = [math.isqrt(_native.bound_squared_norm(w, 32, bits)) + 1 for w in words]
    prove, verify, check, norm_prove, norm_verify = [], [], [], [], []
    for _ in range(repeats):
        began = time.perf_counter()
        messages = [_native.bound_prove(b"bench", w, 32, bits, [key, key], a) for w, a in zip(words, adds, strict=True)]
        prove.append((time.perf_counter() - began) / 3)
        began = time.perf_counter()
        points = [_native.bound_verify(b"bench", m, count, bits, True) for m in messages]
        verify.append((time.perf_counter() - began) / 3)
        assert all(not why for _, why in points)
        total = (words[0].astype(np.uint64) + words[1] + words[2]).astype(np.uint32)
        began = time.perf_counter()
        wrong = _native.bound_check_sum([p for p, _ in points], total, 32, bits)
        check.append(time.perf_counter() - began)
        assert not wrong
        began = time.perf_counter()
        norms = [
            _native.bound_norm_prove(b"bench", w, 32, bits, [key, key], a, p, b)
            for w, a, (p, _), b in zip(words, adds, points, l2, strict=True)
        ]
        norm_prove.append((time.perf_counter() - began) / 3)
        began = time.perf_counter()
        refused = [
            _native.bound_norm_verify(b"bench", n, p, count, bits, b)
            for n, (p, _), b in zip(norms, points, l2, strict=True)
        ]
        norm_verify.append((time.perf_counter() - began) / 3)
        assert refused == ["", "", ""], refused
    per = 1e5 / count
    params = {
        "values": count,
        "parties": 3,
        "bits": bits,
        "proof_bits": 32,
        "values_per_proof": 64,
        "bytes_per_value": round(len(messages[0]) / count, 1),
        "repeats": repeats,
        "library": "bulletproofs 5 (dalek)",
        "acorn_published_s_per_100k": 32,
    }
    out = [
        record("bound.confide.prove_seconds_per_100k", statistics.median(prove) * per, "s", None, None, params),
        record("bound.confide.verify_seconds_per_100k", statistics.median(verify) * per, "s", None, None, params),
        record("bound.confide.sum_check_seconds_per_100k", statistics.median(check) * per, "s", None, None, params),
    ]
    norm_params = {
        "values": count,
        "parties": 3,
        "bits": bits,
        "proof": "a committed square per value (Sigma protocol) and a 2x64-bit range proof of the bound's slack",
        "bytes_per_value": round(len(norms[0]) / count, 1),
        "repeats": repeats,
        "library": "curve25519-dalek 4, bulletproofs 5 (dalek)",
    }
    out += [
        record("bound.l2.prove_seconds_per_100k", statistics.median(norm_prove) * per, "s", None, None, norm_params),
        record("bound.l2.verify_seconds_per_100k", statistics.median(norm_verify) * per, "s", None, None, norm_params),
    ]

    def job(prove_bound: bool) -> dict:
        spec = parse_job(
            {
                "job_id": f"bound-{prove_bound}",
                "rounds": 6,
                "parties": FIVE[:3],
                "model": {"algorithm": "homo_lr", "learning_rate": 0.5, "local_epochs": 2, "batch_size": 32},
                "data": {"dataset": "breast_cancer", "split": "iid", "seed": 7},
                "protection": {"mode": "secagg", "prove_bound": prove_bound},
                "seed": 7,
            }
        )
        return run_local(spec, workdir / f"bound-{prove_bound}", progress=False, echo=lambda *_: None, baseline=False)

    seconds = {}
    for on in (False, True):
        report = job(on)
        seconds[on] = statistics.median(r["seconds"] for r in report["rounds"][1:])
    out.append(
        record(
            "bound.confide.round_seconds.breast_cancer",
            seconds[True],
            "s",
            "round without bound proofs",
            seconds[False],
            {"values": 31, "parties": 3, "mode": "secagg", "rounds": 6, "median_of": "rounds 2-6"},
        )
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="rounds of each attack job")
    parser.add_argument("--features", type=int, default=1_249_999, help="Homo LR features of the overhead job")
    parser.add_argument(
        "--overhead-rounds",
        type=int,
        default=25,
        help="rounds of each 1.25M job (25: a round ratio within a few points)",
    )
    parser.add_argument("--repeats", type=int, default=20, help="in-process rounds of the 20k measurement")
    parts = "cost,overhead,attacks,lies,bounds,proofs"
    parser.add_argument("--skip", default="", help=f"comma-separated parts to skip: {parts}")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    workdir = Path(tempfile.mkdtemp(prefix="robust-bench-"))
    results, attack_lines, lie_lines = [], [], []
    if "cost" not in skip:
        results += verification_cost(20_000, args.repeats)
    if "overhead" not in skip:
        results += round_overhead(args.features, args.overhead_rounds, workdir)
    if "attacks" not in skip:
        found, attack_lines = attacks(args.rounds, workdir)
        results += found
    if "lies" not in skip:
        found, lie_lines = lies(workdir)
        results += found
    if "bounds" not in skip:
        results += bound_proofs(3)
    if "proofs" not in skip:
        results += product_proofs(3, workdir)
    info = machine()
    if skip:
        ran = sorted({"cost", "overhead", "attacks", "lies", "bounds", "proofs"} - skip)
        results, info = merged("robust", results, info, f"parts {', '.join(ran)}")
    write("robust", info, results)
    lines = [
        f"{info['date']} on {info['cpu']} ({info['cores']} cores), commit {info['commit']}.",
        *merged_lines(info),
        "",
        *results_table(results, value=",.4f", anchor=",.4f"),
    ]
    if attack_lines:
        lines += ["", "| data | attack (1 of 5 parties) | strategy | accuracy % |", "|---|---|---|---|", *attack_lines]
    if lie_lines:
        lines += ["", "| aggregator lie (round 2, secagg) | caught in round | job s |", "|---|---|---|", *lie_lines]
    write_markdown_block("robust", "Verification and robust aggregation", lines, "robust_bench")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
