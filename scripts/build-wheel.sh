#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build the wheel other x86-64 Linux machines install: dist/confide-*-manylinux*.whl.
#
# - GMP is the portable (fat) build from scripts/build-gmp.sh --portable, linked statically:
#   every x86-64 code path is in it and GMP picks one for the CPU it runs on. The tuned GMP
#   of the development build (build/gmp) would use instructions another CPU may lack.
# - The AVX-512 IFMA Paillier engine is Rust code compiled for every x86-64 and chosen at run
#   time (CPUID), so it needs nothing here.
# - glibc 2.28 (manylinux_2_28: RHEL/Rocky 8, Ubuntu 20.04 and later): maturin links through zig
#   (the ziglang package, requirements-dev.txt) against glibc 2.28's symbol versions; linked by
#   this machine's gcc the extension needed glibc 2.34 (pthread_*, dlsym moved into libc then).
#   zig finds a library by its name only as a shared object, so build/gmp-zig/libgmp.so names the
#   portable GMP's static archive (the linker reads it as the archive it is); that is the only GMP
#   on the link's path, so the check below cannot look for GMP's symbols in the stripped result.
# - Its own target directory (target/manylinux): a different linker and C compiler, so sharing the
#   development build's would rebuild one or the other at every switch. The first build compiles
#   every crate (about 3 minutes on two cores); later ones relink (about a minute).
# - The venv's interpreter: pyo3's configuration (abi3, CPython 3.10 and later).
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
mkdir -p "$root/build/gmp-zig"
ln -sf "$gmp/lib/libgmp.a" "$root/build/gmp-zig/libgmp.so"
# maturin runs zig as `python3 -m ziglang` from PATH: the venv's.
PATH="$root/.venv/bin:$PATH" CPATH="$gmp/include" LIBRARY_PATH="$gmp/lib" \
    "$root/.venv/bin/maturin" build --release --quiet --zig --compatibility manylinux_2_28 \
    --interpreter "$root/.venv/bin/python" --target-dir "$root/target/manylinux" --out "$root/dist" \
    -- -L "native=$root/build/gmp-zig" -L "native=$gmp/lib"
wheel=$(ls dist/confide-*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || { echo "build-wheel: maturin made no wheel" >&2; exit 1; }
python3 - "$wheel" <<'PY'
import re, subprocess, sys, tempfile, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
names = wheel.namelist()
for needed in ("confide/v1/runtime_pb2.py", "confide/v1/runtime_pb2_grpc.py", "confide/_native.abi3.so"):
    if needed not in names:
        sys.exit(f"build-wheel: {sys.argv[1]} lacks {needed}")
# GMP is inside the extension rather than a shared library the system must have, and nothing it
# calls in glibc is newer than 2.28 (the wheel's platform tag says so too).
with tempfile.TemporaryDirectory() as where:
    native = wheel.extract("confide/_native.abi3.so", where)
    needed = subprocess.run(["readelf", "-d", native], capture_output=True, text=True).stdout
    if "libgmp" in needed:
        sys.exit("build-wheel: the extension needs a shared libgmp; GMP must be linked in")
    dynamic = subprocess.run(["objdump", "-T", native], capture_output=True, text=True).stdout
    versions = {tuple(map(int, v.split("."))) for v in re.findall(r"GLIBC_([0-9.]+)", dynamic)}
    if max(versions) > (2, 28):
        sys.exit(f"build-wheel: the extension needs glibc {'.'.join(map(str, max(versions)))} (> 2.28)")
if "manylinux_2_28_x86_64" not in sys.argv[1]:
    sys.exit(f"build-wheel: {sys.argv[1]} is not tagged manylinux_2_28")
print(f"build-wheel: {sys.argv[1]} ({len(names)} files, GMP inside, glibc <= 2.28)")
PY
