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
stage=$(mktemp -d /tmp/confide-wheel-XXXXXX)
trap 'rm -rf "$stage"' EXIT
git ls-files -z | xargs -0 cp --parents -t "$stage"
cp -r --parents python/confide/v1 -t "$stage"
[ -d python/confide/web/static/vendor ] && cp -r --parents python/confide/web/static/vendor -t "$stage"
mkdir -p dist
(cd "$stage" && CPATH="$gmp/include" LIBRARY_PATH="$gmp/lib" \
    "$root/.venv/bin/maturin" build --release --target-dir "$root/target/wheel" --out "$root/dist" --quiet)
wheel=$(ls dist/confide-*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || { echo "build-wheel: maturin made no wheel" >&2; exit 1; }
python3 - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for needed in ("confide/v1/runtime_pb2.py", "confide/v1/runtime_pb2_grpc.py", "confide/_native.abi3.so"):
    if needed not in names:
        sys.exit(f"build-wheel: {sys.argv[1]} lacks {needed}")
print(f"build-wheel: {sys.argv[1]} ({len(names)} files)")
PY
