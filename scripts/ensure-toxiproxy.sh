#!/usr/bin/env bash
# Toxiproxy (Shopify's TCP fault proxy) for the namespace federation tests (tests/fixtures/netns.py):
# latency with jitter, resets and timeouts injected between separate hosts. Built from the Go
# module proxy into build/toxiproxy/ once; instant when the binary of this version is there.
# Without Go it says so and exits 0: the tests that need the proxy skip with that reason.
set -euo pipefail

VERSION="v2.5.0"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/build/toxiproxy"
STAMP="$DEST/.confide-toxiproxy-$VERSION"

if [[ -x "$DEST/toxiproxy-server" && -f "$STAMP" ]]; then
    exit 0
fi

GO="$(command -v go || true)"
if [[ -z "$GO" && -x /usr/local/go/bin/go ]]; then
    GO=/usr/local/go/bin/go
fi
if [[ -z "$GO" ]]; then
    echo "ensure-toxiproxy: no Go toolchain (go not on PATH, nor /usr/local/go/bin/go): the namespace" \
        "federation tests (tests/integration/test_wan.py) will skip; install Go >= 1.19 to run them" >&2
    exit 0
fi

echo "building Toxiproxy $VERSION into build/toxiproxy (Go module proxy)"
mkdir -p "$DEST"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
if ! GOBIN="$WORK" "$GO" install "github.com/Shopify/toxiproxy/v2/cmd/server@$VERSION"; then
    echo "ensure-toxiproxy: building Toxiproxy $VERSION failed (no module proxy? Go too old?): the" \
        "namespace federation tests (tests/integration/test_wan.py) will skip" >&2
    exit 0
fi
mv "$WORK/server" "$DEST/toxiproxy-server.tmp"
mv "$DEST/toxiproxy-server.tmp" "$DEST/toxiproxy-server"
touch "$STAMP"
