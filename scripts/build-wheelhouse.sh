#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# build/wheelhouse: the wheel (make wheel) and every dependency it needs, at the versions the suite
# pins (requirements-dev.txt), as binary wheels for CPython 3.11 on x86-64 Linux with glibc 2.28 or
# later (manylinux_2_28 and older tags only: RHEL/Rocky 8), the Python of the image's Debian
# (bookworm) and of this machine. The image installs from it with no index, and so
# does the offline bundle (make bundle). Idempotent: done when the stamp is newer than the wheel.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DEST=build/wheelhouse
wheel=$(ls dist/confide-*.whl 2>/dev/null | head -1)
[[ -n "$wheel" ]] || { echo "build-wheelhouse: no wheel in dist/: run make wheel first" >&2; exit 1; }
if [[ -f "$DEST/.stamp" && "$DEST/.stamp" -nt "$wheel" && "$DEST/.stamp" -nt requirements-dev.txt ]]; then
    exit 0
fi
rm -rf "$DEST.tmp"
mkdir -p "$DEST.tmp" build
sed -E 's/\[[^]]*\]//' requirements-dev.txt > build/wheel-constraints.txt
.venv/bin/python -m pip download --quiet --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --dest "$DEST.tmp" --constraint build/wheel-constraints.txt "$wheel"
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
touch "$DEST/.stamp"
echo "build-wheelhouse: $(ls "$DEST"/*.whl | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST"
