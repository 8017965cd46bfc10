"""Large models through real processes: seconds per round, memory against the model, bytes on the wire.

A Keras Dense 1000 -> N -> 10 network (Adam; ``benchmarks/scale_model.py``) of 10M, 100M and
400M values, three parties and one aggregator (``confide.local``, the processes ``confide run``
starts), three rounds per protection mode. Every party records its resident set once the
model, its optimizer and one local step exist, and its peak at exit; a sampler reads the
aggregator's peak (``VmHWM``) while the job runs. The relay holds ``--window-mb`` of deliveries
in memory (the aggregator's configured window; beyond it they wait on disk).

Records (``results/scale.json``), for ``<size>`` in ``10m``, ``100m``, ``400m`` (and ``25m`` with
``--sizes``: the lattice mode's 3-party goal, ``scale.25m.lattice.seconds_per_round`` against plain):

- ``scale.<size>.<mode>.completed``: 1 if every party finished every round, else 0 (a size the
  machine cannot hold is not started: 0, with the reason in ``params``);
- ``scale.<size>.<mode>.seconds_per_round``: the median round at the parties (phases in
  ``params``); anchor: ``plain`` at the same size, measured in the same run;
- ``scale.<size>.<mode>.party_rss_over_model``: the largest party's peak less its baseline, over
  the model's bytes; anchor: the same network trained alone for as many rounds, reading and
  loading its weights once a round (the framework's own growth, over the model's bytes);
- ``scale.<size>.<mode>.aggregator_peak_rss_mb``; anchor: the same mode at ``10m``.

LoRA fine-tuning (``--parts lora``): a BERT encoder (4 layers, hidden size 128, 0.6M weights)
pretrained here on a 4-class keyword task (``tests/fixtures/hf_models.py``; nothing is
downloaded), fine-tuned with ``model.algorithm: hf`` on the 2-class task
(``data.dataset: text``), 3 parties, 3 rounds, in every protection mode:

- ``lora.<mode>.bytes_vs_full``: bytes on the wire per round with the LoRA adapter (r 8 on
  query and value, and the head) over those of full fine-tuning (``adapter: none``) in the same
  mode, measured in the same run (the anchor);
- ``lora.accuracy_gap``: the central run's accuracy less the federated one's (``plain``; points
  of accuracy, the central run being the same fine-tuning on the pooled rows for ``rounds``
  epochs, trained by the job's centralized baseline); the accuracy of every mode is in
  ``params``.

Run: ``python benchmarks/scale_bench.py --write`` (about 20 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))

from benchutil import machine, merged, merged_lines, record, results_table, write, write_markdown_block  # noqa: E402
from scale_model import hidden_units  # noqa: E402

sys.path.insert(0, str(HERE.parent))

from confide.local.federation import run_local  # noqa: E402
from confide.protect import MODES  # noqa: E402
from confide.spec import parse_job  # noqa: E402
from tests.fixtures.hf_models import LENGTH, VOCABULARY, pretrained_base  # noqa: E402

SIZES = {"10m": 10_000_000, "25m": 25_000_000, "100m": 100_000_000, "400m": 400_000_000}
PARTIES = ["hospital-a", "hospital-b", "hospital-c"]
PHASES = ("train_s", "agree_s", "encode_s", "upload_s", "wait_s", "decode_s")


def mem_available_mb() -> float:
    """MemAvailable of this machine, MiB."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


def framework_alone(parameters: int, rounds: int) -> dict:
    """The network trained alone (no Confide) in its own process: baseline, peak and model bytes."""
    done = subprocess.run(
        [sys.executable, str(HERE / "scale_model.py"), str(parameters), str(rounds)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "KERAS_BACKEND": "jax"},
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


class PeakSampler:
    """Reads the peak resident set of the aggregator process under ``workdir`` while a job runs."""

    def __init__(self, workdir: Path) -> None:
        self.marker = str(workdir / "aggregator.port").encode()
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        pid = None
        while not self._stop.wait(0.25):
            if pid is None:
                pid = self._find()
                if pid is None:
                    continue
            try:
                with open(f"/proc/{pid}/status") as status:
                    for line in status:
                        if line.startswith("VmHWM:"):
                            self.peak_kib = max(self.peak_kib, int(line.split()[1]))
            except OSError:
                pid = None  # exited (or restarted)

    def _find(self) -> int | None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    if self.marker in cmdline.read():
                        return int(entry)
            except OSError:
                continue
        return None


def run_job(size: str, parameters: int, mode: str, rounds: int, window_mb: int, root: Path) -> dict:
    """One job; its parties' reports and memory, the aggregator's peak."""
    workdir = root / f"{size}-{mode}"
    memory = workdir / "memory"
    memory.mkdir(parents=True)
    job = parse_job(
        {
            "job_id": f"scale-{size}-{mode}",
            "rounds": rounds,
            "parties": PARTIES,
            "model": {
                "algorithm": "custom",
                "entry": f"{HERE / 'scale_model.py'}:dense",
                "options": {"parameters": parameters},
            },
            "data": {"dataset": "digits", "split": "iid", "seed": 3},
            "protection": {"mode": mode, "share_timeout_s": 600.0},
            "transport": {"round_timeout_s": 1800.0, "dropout_grace_s": 30.0, "message_timeout_s": 1800.0},
            "metrics": ["loss"],
            "seed": 3,
        }
    )
    env = {
        party: {"CONFIDE_SCALE_MEMORY_DIR": str(memory), "CONFIDE_SCALE_PARTY": party, "KERAS_BACKEND": "jax"}
        for party in PARTIES
    }
    started = time.perf_counter()
    error = ""
    with PeakSampler(workdir) as sampler:
        try:
            run_local(
                job,
                workdir,
                progress=False,
                echo=lambda *_: None,
                party_env=env,
                baseline=False,
                max_restarts=0,
                aggregator_args=["--mailbox-memory-mb", str(window_mb)],
            )
        except Exception as failure:  # noqa: BLE001 - a size that fails is a result (completed 0)
            error = f"{type(failure).__name__}: {failure}"
    seconds = time.perf_counter() - started
    reports, memories = {}, {}
    for party in PARTIES:
        path = workdir / "parties" / f"{party}.report.json"
        reports[party] = json.loads(path.read_text()) if path.exists() else {}
        measured = memory / f"{party}.json"
        memories[party] = json.loads(measured.read_text()) if measured.exists() else None
    shutil.rmtree(workdir, ignore_errors=True)  # checkpoints and models of GBs
    return {
        "reports": reports,
        "memory": memories,
        "aggregator_peak_kib": sampler.peak_kib,
        "seconds": seconds,
        "error": error,
    }


def summarize(outcome: dict, rounds: int) -> dict:
    """Completed, the median round and its phases, bytes, and the largest party's growth over the model."""
    reports = outcome["reports"].values()
    completed = all(r.get("status") == "completed" and len(r.get("rounds", [])) == rounds for r in reports)
    rows = [row for r in reports for row in r.get("rounds", [])]
    out = {"completed": completed, "error": outcome["error"]}
    if rows:
        out["seconds_per_round"] = statistics.median(row["seconds"] for row in rows)
        out["phases"] = {p: round(statistics.median(row.get(p, 0.0) for row in rows), 3) for p in PHASES}
        out["bytes_sent_per_round"] = statistics.median(row.get("bytes_sent", 0) for row in rows)
        out["bytes_received_per_round"] = statistics.median(row.get("bytes_received", 0) for row in rows)
    growth = [(m["peak_kib"] - m["baseline_kib"]) * 1024 / m["model_bytes"] for m in outcome["memory"].values() if m]
    if growth:
        out["party_rss_over_model"] = max(growth)
        out["party_baseline_mb"] = max(m["baseline_kib"] for m in outcome["memory"].values() if m) / 1024
    out["aggregator_peak_rss_mb"] = outcome["aggregator_peak_kib"] / 1024
    return out


def lora_job(mode: str, base: Path, adapter: str, rounds: int) -> dict:
    return {
        "job_id": f"lora-{mode}-{adapter}",
        "rounds": rounds,
        "parties": PARTIES,
        "model": {
            "algorithm": "hf",
            # Full fine-tuning diverges from the pretrained weights at LoRA's rate (0.69-0.82 accuracy at 0.002).
            "learning_rate": 0.002 if adapter == "lora" else 0.0005,
            "batch_size": 16,
            "hf": {"pretrained": str(base), "adapter": adapter},
        },
        "data": {"dataset": "text", "samples": 1500, "example_shape": [LENGTH], "classes": 2, "vocabulary": VOCABULARY},
        "protection": {"mode": mode, "share_timeout_s": 60.0},
        "transport": {"round_timeout_s": 600.0},
        "metrics": ["loss", "accuracy"],
        "seed": 5,
    }


def run_lora(rounds: int, root: Path, modes: list[str]) -> list[dict]:
    """LoRA against full fine-tuning in every mode: bytes per round, accuracy, the central run's accuracy."""
    base = pretrained_base(root / "bert-4x128", hidden=128, layers=4)
    results, accuracies = [], {}
    central = None
    for mode in modes:
        outcome = {}
        for adapter in ("lora", "none"):
            workdir = root / f"lora-{mode}-{adapter}"
            report = run_local(
                parse_job(lora_job(mode, base, adapter, rounds)),
                workdir,
                progress=False,
                echo=lambda *_: None,
                baseline=mode == "plain" and adapter == "lora",
                max_restarts=0,
            )
            party = json.loads((workdir / "parties" / f"{PARTIES[0]}.report.json").read_text())["model"]
            outcome[adapter] = {
                "bytes": statistics.median(r["bytes_sent"] for r in report["rounds"]),
                "accuracy": report["final_accuracy"],
                "values": party["parameters"],
                "base_parameters": party["base_parameters"],
                "seconds": statistics.median(r["seconds"] for r in report["rounds"]),
            }
            if report.get("centralized"):
                central = report["centralized"]
            shutil.rmtree(workdir, ignore_errors=True)
        lora, full = outcome["lora"], outcome["none"]
        accuracies[mode] = lora["accuracy"]
        print(f"  lora {mode}: {json.dumps(outcome)}", flush=True)
        results.append(
            record(
                f"lora.{mode}.bytes_vs_full",
                lora["bytes"] / full["bytes"],
                "ratio",
                anchor="full fine-tuning, same mode, same run (bytes per round)",
                anchor_value=1.0,
                params={
                    "parties": len(PARTIES),
                    "rounds": rounds,
                    "lora_bytes_per_round": lora["bytes"],
                    "full_bytes_per_round": full["bytes"],
                    "adapter_values": lora["values"],
                    "full_values": full["values"],
                    "base_parameters": lora["base_parameters"],
                    "lora_accuracy": lora["accuracy"],
                    "full_accuracy": full["accuracy"],
                    "lora_seconds_per_round": lora["seconds"],
                    "full_seconds_per_round": full["seconds"],
                },
            )
        )
    if central and "pooled_accuracy" in central:
        results.append(
            record(
                "lora.accuracy_gap",
                central["pooled_accuracy"] - accuracies["plain"],
                "accuracy",
                anchor="the same fine-tuning, central, on the pooled rows (its accuracy)",
                anchor_value=central["pooled_accuracy"],
                params={"accuracy_by_mode": accuracies, "central_epochs": central.get("epochs")},
            )
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10m,100m,400m")
    parser.add_argument("--modes", default="plain,secagg,groupmask")
    parser.add_argument("--paillier-sizes", default="10m", help="sizes that also run paillier ('' for none)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-mb", type=int, default=64, help="the relay's in-memory window (MiB)")
    parser.add_argument("--parts", default="scale,lora", help="scale (the Keras sizes), lora (fine-tuning)")
    parser.add_argument("--lora-modes", default=",".join(MODES), help="modes of the LoRA part")
    parser.add_argument("--write", action="store_true", help="write results/scale.json and docs/benchmarks.md")
    parser.add_argument(
        "--merge", action="store_true", help="with --write: keep the earlier records this run did not measure"
    )
    args = parser.parse_args()
    parts = args.parts.split(",")
    info = machine()
    results: list[dict] = []
    aggregator_at_10m: dict[str, float] = {}
    root = Path(tempfile.mkdtemp(prefix="confide-scale-"))
    try:
        for size in args.sizes.split(",") if "scale" in parts else []:
            parameters = SIZES[size]
            units = hidden_units(parameters)
            params = {"parameters": units * 1011 + 10, "hidden_units": units, "parties": 3, "rounds": args.rounds}
            modes = args.modes.split(",") + (["paillier"] if size in args.paillier_sizes.split(",") else [])
            alone = framework_alone(parameters, args.rounds)
            alone_growth = (alone["peak_kib"] - alone["baseline_kib"]) * 1024 / alone["model_bytes"]
            # Three parties at the framework's own peak plus Confide's share (about 2.5 model sizes), and room.
            needed_mb = 3 * (alone["peak_kib"] / 1024 + 2.5 * alone["model_bytes"] / 2**20) + 1024
            available = mem_available_mb()
            print(
                f"{size}: {params['parameters']:,} values ({alone['model_bytes'] / 2**20:,.0f} MiB); alone: baseline "
                f"{alone['baseline_kib'] / 1024:,.0f} MiB, grows {alone_growth:.2f}x the model; "
                f"3 parties need ~{needed_mb:,.0f} of {available:,.0f} MiB available",
                flush=True,
            )
            plain_seconds = None
            for mode in modes:
                name = f"scale.{size}.{mode}"
                if needed_mb > available:
                    reason = (
                        f"not started: three parties would need about {needed_mb:,.0f} MiB (the framework alone "
                        f"peaks at {alone['peak_kib'] / 1024:,.0f} MiB per party), {available:,.0f} MiB are available"
                    )
                    print(f"  {mode}: {reason}", flush=True)
                    results.append(record(f"{name}.completed", 0, "bool", params={**params, "reason": reason}))
                    continue
                summary = summarize(run_job(size, parameters, mode, args.rounds, args.window_mb, root), args.rounds)
                print(f"  {mode}: {json.dumps(summary)}", flush=True)
                detail = {**params, "error": summary["error"]} if summary["error"] else params
                results.append(record(f"{name}.completed", int(summary["completed"]), "bool", params=detail))
                if "seconds_per_round" in summary:
                    if mode == "plain":
                        plain_seconds = summary["seconds_per_round"]
                    results.append(
                        record(
                            f"{name}.seconds_per_round",
                            summary["seconds_per_round"],
                            "s",
                            anchor="plain, same size, same run" if plain_seconds else None,
                            anchor_value=plain_seconds,
                            params={
                                **params,
                                "phases_s": summary["phases"],
                                "bytes_sent_per_round": summary["bytes_sent_per_round"],
                                "bytes_received_per_round": summary["bytes_received_per_round"],
                            },
                        )
                    )
                if "party_rss_over_model" in summary:
                    results.append(
                        record(
                            f"{name}.party_rss_over_model",
                            summary["party_rss_over_model"],
                            "x model bytes",
                            anchor="the network trained alone, same rounds (its own growth)",
                            anchor_value=alone_growth,
                            params={**params, "party_baseline_mb": round(summary["party_baseline_mb"], 1)},
                        )
                    )
                peak = summary["aggregator_peak_rss_mb"]
                if size == "10m":
                    aggregator_at_10m[mode] = peak
                results.append(
                    record(
                        f"{name}.aggregator_peak_rss_mb",
                        peak,
                        "MiB",
                        anchor="same mode at 10m" if mode in aggregator_at_10m else None,
                        anchor_value=aggregator_at_10m.get(mode),
                        params={**params, "window_mb": args.window_mb},
                    )
                )
        if "lora" in parts:
            results += run_lora(args.rounds, root, args.lora_modes.split(","))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.write:
        if args.merge:
            results, info = merged("scale", results, info, f"parts {args.parts} (sizes {args.sizes})")
        path = write("scale", info, results)
        print(f"wrote {path}")
        lines = [
            f"Keras Dense 1000 -> N -> 10 (Adam), 3 parties, {args.rounds} rounds, relay window "
            f"{args.window_mb} MiB; LoRA: a 4-layer BERT (hidden 128) pretrained here, 3 parties, {args.rounds} "
            f"rounds; {info.get('cpu', '')}.",
            *merged_lines(info),
            "",
        ]
        write_markdown_block("scale_bench", "Large models: rounds, memory, wire", lines + results_table(results))


if __name__ == "__main__":
    main()
