#!/usr/bin/env bash
# Debian's Prometheus server for the metrics test (tests/integration/test_metrics_prometheus.py
# scrapes a running federation with it and reads a round count back through PromQL). Idempotent;
# installs the distribution's "prometheus" package quietly when missing (sudo only when not root).
# The test runs its own server on a free port, whatever the package's service does.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-prometheus: no prometheus and no apt-get to install it; install Prometheus yourself" \
        "(the scrape test skips without it)" >&2
    exit 0
fi
if [[ "$(id -u)" -eq 0 ]]; then
    SUDO=()
else
    SUDO=(sudo)
fi
echo "installing Debian's prometheus for the metrics test"
"${SUDO[@]}" apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends prometheus >/dev/null
