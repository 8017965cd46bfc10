#!/usr/bin/env bash
# Debian's Chromium for the console's browser tests (tests/e2e drive it with Playwright; Playwright's
# own browser download cannot work on a closed network). Idempotent; installs the distribution's
# "chromium" package quietly when missing (sudo only when not root).
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-chromium: no chromium and no apt-get to install it; install Chromium yourself" \
        "(the browser tests skip without it)" >&2
    exit 0
fi
if [[ "$(id -u)" -eq 0 ]]; then
    SUDO=()
else
    SUDO=(sudo)
fi
echo "installing Debian's chromium for the console's browser tests"
"${SUDO[@]}" apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq chromium >/dev/null
