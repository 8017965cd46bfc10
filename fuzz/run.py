"""Run the fuzz targets, each for a bounded time or number of inputs.

Every Python harness runs on atheris and every Rust target on libFuzzer, starting from the
committed seed corpora.

    .venv/bin/python fuzz/run.py --seconds 600          # the long run (`make fuzz`)
    .venv/bin/python fuzz/run.py --runs 2000 --python   # the short run of the Python targets
    python3 fuzz/run.py --runs 20000 --rust             # the short run of the Rust targets
    .venv/bin/python fuzz/run.py --seconds 60 vertical_wire slice_batch

New interesting inputs go to build/fuzz/corpus/<target>/ (the committed corpus in
fuzz/corpus/<target>/ is only read); a crashing, hanging or leaking input is written to
build/fuzz/artifacts/<target>/ and the run fails, naming it. The Rust targets are built first
with the coverage instrumentation libFuzzer needs, on the stable toolchain (the flags
``cargo fuzz`` would pass, less its nightly-only sanitizer option).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
ROOT = FUZZ.parent
BUILD = ROOT / "build" / "fuzz"
RUST_CRATE = FUZZ / "rust"
RUST_TARGET_DIR = BUILD / "rust-target"
#: What ``cargo fuzz build`` passes to rustc, minus ``-Zsanitizer`` (nightly only).
RUST_FLAGS = [
    "-Cpasses=sancov-module",
    "-Cllvm-args=-sanitizer-coverage-level=4",
    "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
    "-Cllvm-args=-sanitizer-coverage-pc-table",
    "-Cllvm-args=-sanitizer-coverage-trace-compares",
    "--cfg",
    "fuzzing",
]
#: Per input: longer than this is a hang; libFuzzer writes it out as a timeout.
INPUT_TIMEOUT_S = 25
#: Largest generated input (the seeds may be larger and are kept whole).
MAX_LEN = 8192


def python_targets() -> list[str]:
    """Harness modules under fuzz/python/ (a leading underscore marks a helper)."""
    return sorted(p.stem for p in (FUZZ / "python").glob("*.py") if not p.stem.startswith("_"))


def rust_targets() -> list[str]:
    """Binaries of the Rust fuzz crate."""
    return sorted(p.stem for p in (RUST_CRATE / "fuzz_targets").glob("*.rs"))


def host_triple() -> str:
    """The host's target triple: the coverage flags go to it alone, not to build scripts."""
    out = subprocess.run(["rustc", "-vV"], check=True, capture_output=True, text=True).stdout
    return next(line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("host: "))


def build_rust() -> Path:
    """Build the Rust targets with coverage instrumentation; returns the folder of the binaries."""
    triple = host_triple()
    env = dict(os.environ, RUSTFLAGS=" ".join(RUST_FLAGS), CARGO_TARGET_DIR=str(RUST_TARGET_DIR))
    command = ["cargo", "build", "--release", "--locked", "--bins", "--target", triple]
    subprocess.run(command, check=True, cwd=RUST_CRATE, env=env)
    return RUST_TARGET_DIR / triple / "release"


def run_target(
    name: str, command: list[str], *, seconds: int | None, runs: int | None, found: Path, seed: int | None
) -> dict:
    """Fuzz one target, new inputs going to ``found/<name>``; returns its outcome (``ok``, inputs, seconds, log)."""
    corpus = found / name
    artifacts = BUILD / "artifacts" / name
    corpus.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    options = [
        f"-timeout={INPUT_TIMEOUT_S}",
        f"-max_len={MAX_LEN}",
        "-rss_limit_mb=3072",
        f"-artifact_prefix={artifacts}/",
        "-print_final_stats=1",
    ]
    if seconds is not None:
        options.append(f"-max_total_time={seconds}")
    if runs is not None:
        options.append(f"-runs={runs}")
    if seed is not None:
        options.append(f"-seed={seed}")
    seeds = FUZZ / "corpus" / name
    folders = [str(corpus)] + ([str(seeds)] if seeds.is_dir() else [])
    start = time.monotonic()
    limit = (seconds or 0) + (runs or 0) * INPUT_TIMEOUT_S + 300
    try:
        done = subprocess.run(command + options + folders, capture_output=True, text=True, cwd=ROOT, timeout=limit)
        code, log = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        code, log = -1, f"{expired.stdout or ''}{expired.stderr or ''}\nstopped after {limit} s"
    elapsed = time.monotonic() - start
    executed = re.findall(r"stat::number_of_executed_units:\s*(\d+)", log)
    found = sorted(str(p.relative_to(ROOT)) for p in artifacts.iterdir())
    return {
        "target": name,
        "ok": code == 0 and not found,
        "code": code,
        "inputs": int(executed[-1]) if executed else None,
        "seconds": elapsed,
        "artifacts": found,
        "log": log,
    }


def main(argv: list[str] | None = None) -> int:
    """Command line: which targets, for how long; exit status 1 if any target failed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", help="targets to run (default: all of the chosen languages)")
    parser.add_argument("--seconds", type=int, help="fuzzing time per target")
    parser.add_argument("--runs", type=int, help="inputs per target (besides the corpus)")
    parser.add_argument("--python", action="store_true", help="the Python targets (default: both languages)")
    parser.add_argument("--rust", action="store_true", help="the Rust targets (default: both languages)")
    parser.add_argument("--jobs", type=int, default=1, help="targets fuzzed at the same time")
    parser.add_argument("--keep", action="store_true", help="keep artifacts of earlier runs (default: cleared)")
    parser.add_argument(
        "--found", type=Path, default=BUILD / "corpus", help="where new inputs go (default: build/fuzz/corpus)"
    )
    parser.add_argument("--seed", type=int, help="libFuzzer's random seed (default: a new one each run)")
    args = parser.parse_args(argv)
    if args.seconds is None and args.runs is None:
        parser.error("give --seconds or --runs (or both)")
    both = not (args.python or args.rust)
    chosen_python = python_targets() if (args.python or both) else []
    chosen_rust = rust_targets() if (args.rust or both) else []
    if args.targets:
        unknown = set(args.targets) - set(python_targets()) - set(rust_targets())
        if unknown:
            parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
        chosen_python = [t for t in python_targets() if t in args.targets]
        chosen_rust = [t for t in rust_targets() if t in args.targets]
    jobs: list[tuple[str, list[str]]] = []
    for name in chosen_python:
        jobs.append((name, [sys.executable, str(FUZZ / "python" / f"{name}.py")]))
    if chosen_rust:
        binaries = build_rust()
        jobs.extend((name, [str(binaries / name)]) for name in chosen_rust)
    if not args.keep:
        for name, _ in jobs:
            shutil.rmtree(BUILD / "artifacts" / name, ignore_errors=True)
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    scratch = tempfile.TemporaryDirectory(prefix="confide-fuzz-")
    os.environ["CONFIDE_FUZZ_SCRATCH"] = scratch.name  # files the harnesses write, removed below
    start = time.monotonic()
    with scratch, ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [
            pool.submit(
                run_target, name, command, seconds=args.seconds, runs=args.runs, found=args.found, seed=args.seed
            )
            for name, command in jobs
        ]
        results = []
        for future in futures:
            result = future.result()
            results.append(result)
            status = "ok" if result["ok"] else f"FAILED (exit {result['code']})"
            print(
                f"{result['target']:22s} {status:18s} {result['inputs']} inputs in {result['seconds']:.1f} s",
                flush=True,
            )
            if not result["ok"]:
                print("\n".join(result["log"].splitlines()[-40:]))
                for artifact in result["artifacts"]:
                    print(f"  reproducer: {artifact}")
    failed = [r["target"] for r in results if not r["ok"]]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed in {time.monotonic() - start:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
