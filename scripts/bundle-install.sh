#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install Confide from this offline bundle: no network is used.
#
#   ./install.sh PREFIX            a venv at PREFIX with confide and its dependencies (CPython 3.11)
#   ./install.sh PREFIX --image    the same, and the container image loaded into podman's storage
#
# Checks SHA256SUMS first; a file that does not match stops the install before anything is written.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PREFIX="${1:?usage: install.sh PREFIX [--image]}"
IMAGE="${2:-}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [[ "$version" != "3.11" ]]; then
    echo "install.sh: the bundle's wheels are for CPython 3.11; $PYTHON is $version (set PYTHON=...)" >&2
    exit 2
fi
(cd "$HERE" && sha256sum --quiet --check SHA256SUMS) || { echo "install.sh: SHA256SUMS does not match" >&2; exit 2; }
"$PYTHON" -m venv "$PREFIX"
"$PREFIX/bin/python" -m pip install --quiet --no-index --find-links "$HERE/wheels" confide
echo "installed: $PREFIX/bin/confide"
if [[ "$IMAGE" == "--image" ]]; then
    archive=$(ls "$HERE"/images/confide-*.oci.tar 2>/dev/null | head -1)
    [[ -n "$archive" ]] || { echo "install.sh: this bundle has no image (see MANIFEST)" >&2; exit 2; }
    podman load --quiet --input "$archive"
fi
