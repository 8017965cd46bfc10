#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build the wheel other x86-64 Linux machines install: dist/confide-*-manylinux*.whl.
#
# - GMP is the portable (fat) build from scripts/build-gmp.sh --portable, linked statically:
#   every x86-64 code path is in it and GMP picks one for the CPU it runs on. The tuned GMP
#   of the development build (build/gmp) would use instructions another CPU may lack.
# - The AVX-512 IFMA Paillier engine is Rust code compiled for every x86-64 and chosen at run
#   time (CPUID), so it needs nothing here.
# - Its own target directory (target/wheel): the development build links the tuned GMP.
# - The generated gRPC modules (python/confide/v1) and the console's front-end libraries are
#   made by `make setup` first and go inside the wheel with the rest of python/confide.
# - maturin checks the extension against the manylinux policies (auditwheel) and names the
#   wheel after the oldest one it satisfies.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
./scripts/build-gmp.sh --portable
gmp="$root/build/gmp-portable"
for generated in python/confide/v1/runtime_pb2.py python/confide/v1/runtime_pb2_grpc.py; do
    [ -f "$generated" ] || { echo "build-wheel: $generated is missing: run make setup first" >&2; exit 1; }
done
rm -f dist/confide-*.whl
# maturin leaves out of a wheel whatever git ignores, and the generated modules are ignored
# (they are build output): build from a copy of the tracked files plus them, outside the checkout.
# One fixed place per checkout, files copied with their times: cargo then rebuilds only what changed.
stage="${TMPDIR:-/tmp}/confide-wheel-src-$(id -u)-$(printf '%s' "$root" | cksum | cut -d' ' -f1)"
rm -rf "$stage" && mkdir -p "$stage"
git ls-files -z | xargs -0 cp -p --parents -t "$stage"
cp -rp --parents python/confide/v1 -t "$stage"
[ -d python/confide/web/static/vendor ] && cp -rp --parents python/confide/web/static/vendor -t "$stage"
mkdir -p dist
(cd "$stage" && CPATH="$gmp/include" LIBRARY_PATH="$gmp/lib" \
    "$root/.venv/bin/maturin" build --release --target-dir "$root/target/wheel" --out "$root/dist" --quiet)
wheel=$(ls dist/confide-*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || { echo "build-wheel: maturin made no wheel" >&2; exit 1; }
python3 - "$wheel" <<'PY'
import subprocess, sys, tempfile, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
names = wheel.namelist()
for needed in ("confide/v1/runtime_pb2.py", "confide/v1/runtime_pb2_grpc.py", "confide/_native.abi3.so"):
    if needed not in names:
        sys.exit(f"build-wheel: {sys.argv[1]} lacks {needed}")
# The portable GMP, not the tuned one: a fat GMP dispatches through its CPU vector table, and
# GMP is inside the extension rather than a shared library the system must have.
with tempfile.TemporaryDirectory() as where:
    native = wheel.extract("confide/_native.abi3.so", where)
    symbols = subprocess.run(["nm", native], capture_output=True, text=True).stdout
    if "__gmpn_cpuvec" not in symbols:
        sys.exit("build-wheel: the extension holds no fat GMP (__gmpn_cpuvec): the tuned GMP was linked")
    needed = subprocess.run(["readelf", "-d", native], capture_output=True, text=True).stdout
    if "libgmp" in needed:
        sys.exit("build-wheel: the extension needs a shared libgmp; GMP must be linked in")
print(f"build-wheel: {sys.argv[1]} ({len(names)} files, fat GMP inside)")
PY
