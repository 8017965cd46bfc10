#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build GMP 6.3.0 into build/gmp, tuned for this CPU, from the source that the
# gmp-mpfr-sys crate vendors (no download beyond crates.io).
#
# Why: GMP 6.3.0's config.guess does not know AMD family 26 (Zen 5), so both a
# default build and a "fat" build fall back to generic x86-64 code without
# mulx/adx. Measured on this machine kind (2048-bit, docs/crypto.md):
#   CRT decryption  Debian 6.2.1: 551/s   fat 6.3.0: ~450/s   zen4-tuned 6.3.0: 663/s
# Otherwise (config.guess names the CPU, e.g. "nehalem" on the virtualised Xeons of this machine
# kind, or it lacks adx/bmi2) the build is fat: GMP then picks its code for the CPU at run time.
#
# With --portable it builds a fat GMP (every x86-64 code path, chosen at run time) into
# build/gmp-portable instead: the one a wheel for other machines links (scripts/build-wheel.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
portable=""
[ "${1:-}" = "--portable" ] && portable=1
prefix="$root/build/gmp${portable:+-portable}"
stamp="$prefix/.confide-gmp-6.3.0"
[ -f "$stamp" ] && [ -f "$prefix/lib/libgmp.a" ] && exit 0

# The development GMP is itself fat wherever config.guess names the CPU (most hosts): the portable
# one would be the same build, so it is copied rather than built again (about 70 s on two cores).
dev="$root/build/gmp"
if [ -n "$portable" ] && [ -f "$dev/.confide-gmp-6.3.0" ] && [ -f "$dev/lib/libgmp.a" ] \
   && [ "$(nm "$dev/lib/libgmp.a" 2>/dev/null | grep -c __gmpn_cpuvec)" -gt 0 ]; then
    rm -rf "$prefix" && cp -a "$dev" "$prefix"
    echo "fat-copy" > "$stamp"
    echo "build-gmp: the development GMP is fat: copied to ${prefix#"$root/"}"
    exit 0
fi

command -v m4 >/dev/null || { echo "build-gmp: installing m4 (apt)"; apt-get update -qq && apt-get install -y -qq m4 >/dev/null; }

cd "$root"
cargo fetch --quiet
src=$(cargo metadata --format-version 1 2>/dev/null | python3 -c '
import json, os, sys
meta = json.load(sys.stdin)
for p in meta["packages"]:
    if p["name"] == "gmp-mpfr-sys":
        print(os.path.join(os.path.dirname(p["manifest_path"]), "gmp-6.3.0-c"))
        break
')
[ -d "$src" ] || { echo "build-gmp: GMP source not found in the gmp-mpfr-sys crate ($src)" >&2; exit 1; }

guess=$("$src/config.guess")
host=""
if [ -z "$portable" ] && [ "$guess" = "x86_64-pc-linux-gnu" ] && grep -qw adx /proc/cpuinfo && grep -qw bmi2 /proc/cpuinfo; then
    if grep -q AuthenticAMD /proc/cpuinfo; then host="zen4-pc-linux-gnu"; else host="skylake-pc-linux-gnu"; fi
fi
work="$root/build/gmp${portable:+-portable}-build"
rm -rf "$work" "$prefix" && mkdir -p "$work"
cd "$work"
jobs=$(nproc)
if [ -n "$host" ] && "$src/configure" --host="$host" --prefix="$prefix" --disable-shared --with-pic >configure.log 2>&1 \
   && make -j"$jobs" >make.log 2>&1 && make install >install.log 2>&1; then
    echo "build-gmp: GMP 6.3.0 built for $host (config.guess said $guess)"
else
    host=""  # the stamp names what was built: the fat fallback, not the tuned host that failed
    [ -n "$host" ] && echo "build-gmp: tuned build for $host failed; building a portable (fat) GMP" >&2
    rm -rf "$work"/* "$prefix"
    "$src/configure" --enable-fat --prefix="$prefix" --disable-shared --with-pic >configure.log 2>&1
    make -j"$jobs" >make.log 2>&1 && make install >install.log 2>&1
    echo "build-gmp: GMP 6.3.0 built (fat)"
fi
echo "${host:-${portable:+fat-}$guess}" > "$stamp"
