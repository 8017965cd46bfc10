#!/usr/bin/env bash
# The GPU issue's one prepared run on a machine with a GPU (never in CI): the GPU tests and the
# GPU benchmark, results under $OUT (the device tool's folder) or benchmarks/results.
#
# Needs: python/confide/_native.abi3.so built here (`make setup`; it is abi3, so it travels), and
# a gmpy2 wheel for the machine's Python in .whl/ when it has none (see docs/crypto.md, "GPU engine").
# Usage: [GPU_TESTS="pytest -k expression"] scripts/gpu-check.sh [gpu_bench.py arguments]
set -uo pipefail
out=${OUT:-benchmarks/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
site=python
if ! python3 -c 'import gmpy2' 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    site=/tmp/site:python
fi
export PYTHONPATH=$site
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; lscpu | grep -E 'Model name|^CPU\(s\)|Flags' | cut -c1-300; } | tee "$out/gpu-host.txt"
python3 -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning tests/unit/crypto/test_gpu_engine.py \
    ${GPU_TESTS:+-k "$GPU_TESTS"} 2>&1 | tee "$out/gpu-tests.log"
tests=${PIPESTATUS[0]}
python3 benchmarks/gpu_bench.py --out "$out/crypto_gpu.json" "$@" 2>&1 | tee "$out/gpu-bench.log"
bench=${PIPESTATUS[0]}
echo "tests exit $tests, bench exit $bench"
[ "$tests" = 0 ] && [ "$bench" = 0 ]
