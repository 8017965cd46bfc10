#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Helm for the chart's tests (tests/integration/test_containers.py renders deploy/helm/confide with
# `helm template`): Helm is not a Debian package here, so it is built from the Go module proxy
# into build/helm/ once; instant when the binary of this version is there. Without Go it says so
# and exits 0: the tests that need helm then skip with that reason.
set -euo pipefail

VERSION="v3.22.0"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/build/helm"
STAMP="$DEST/.confide-helm-$VERSION"

if [[ -x "$DEST/helm" && -f "$STAMP" ]]; then
    exit 0
fi
GO="$(command -v go || true)"
if [[ -z "$GO" && -x /usr/local/go/bin/go ]]; then
    GO=/usr/local/go/bin/go
fi
if [[ -z "$GO" ]]; then
    echo "ensure-helm: no Go toolchain: the chart tests (tests/integration/test_containers.py) will skip;" \
        "install Go to run them" >&2
    exit 0
fi
echo "building Helm $VERSION into build/helm (Go module proxy)"
mkdir -p "$DEST"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
if ! CGO_ENABLED=0 GOBIN="$WORK" "$GO" install "helm.sh/helm/v3/cmd/helm@$VERSION"; then
    echo "ensure-helm: building Helm $VERSION failed (no module proxy?): the chart tests will skip" >&2
    exit 0
fi
mv "$WORK/helm" "$DEST/helm.tmp"
mv "$DEST/helm.tmp" "$DEST/helm"
touch "$STAMP"
