#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build the wheel other x86-64 Linux machines install: dist/confide-*-manylinux*.whl.
#
# - GMP is the portable (fat) build from scripts/build-gmp.sh --portable, linked statically:
#   every x86-64 code path is in it and GMP picks one for the CPU it runs on. The tuned GMP
#   of the development build (build/gmp) would use instructions another CPU may lack.
# - The AVX-512 IFMA Paillier engine is Rust code compiled for every x86-64 and chosen at run
#   time (CPUID), so it needs nothing here.
# - The development build's target directory (target/), so the wheel reuses every compiled crate:
#   its own directory and a staged copy of the sources took 141 s on two cores. Where the
#   development GMP is itself fat (config.guess names the CPU: most hosts) the development build
#   is the wheel's and this takes seconds. Where it is tuned, the crates above GMP compile again
#   against the portable one, and `-L` puts it first at the extension's link: those rustc
#   arguments are part of that crate's fingerprint, so cargo relinks it. The check below fails
#   the build if the tuned GMP got in.
# - The same interpreter as `maturin develop` (the venv's): pyo3's build configuration, and with it
#   every crate above pyo3, is then the one already built.
# - The generated gRPC modules (python/confide/v1) and the console's front-end libraries are
#   made by `make setup` first; git ignores them, so pyproject.toml's [tool.maturin] include
#   names them for the wheel.
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
mkdir -p dist
build=("$root/.venv/bin/maturin" build --release --quiet --interpreter "$root/.venv/bin/python"
    --target-dir "$root/target" --out "$root/dist")
if [ "$(cat "$gmp/.confide-gmp-6.3.0")" = "fat-copy" ]; then
    "${build[@]}"  # the development GMP is the portable one: the development link is the wheel's
else
    # GMP's build script reads these, so the crates above it compile again (about 2 min of CPU);
    # `-L` puts the portable GMP before the tuned one at the extension's link.
    CPATH="$gmp/include" LIBRARY_PATH="$gmp/lib" "${build[@]}" -- -L "native=$gmp/lib"
fi
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
