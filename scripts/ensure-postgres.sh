#!/usr/bin/env bash
# PostgreSQL server binaries for the test suite (tests/postgres.py starts a throw-away cluster).
# Idempotent and instant when initdb is already under /usr/lib/postgresql/*/bin; otherwise
# installs the distribution's "postgresql" package quietly (sudo only when not root).
set -euo pipefail

have_initdb() {
    local candidate
    for candidate in /usr/lib/postgresql/*/bin/initdb; do
        [[ -x "$candidate" ]] && return 0
    done
    return 1
}

if have_initdb; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-postgres: no initdb under /usr/lib/postgresql/*/bin and no apt-get to install it;" \
        "install the PostgreSQL server package yourself (or set CONFIDE_SKIP_POSTGRES=1 to skip those tests)" >&2
    exit 1
fi

if [[ "$(id -u)" -eq 0 ]]; then
    SUDO=()
else
    SUDO=(sudo)
fi

echo "installing PostgreSQL (server binaries for the store tests)"
export DEBIAN_FRONTEND=noninteractive
# The package's own cluster is not used: the tests start their own.
"${SUDO[@]}" apt-get update -qq >/dev/null
"${SUDO[@]}" apt-get install -y -qq postgresql >/dev/null

if ! have_initdb; then
    echo "ensure-postgres: installed 'postgresql' but found no initdb under /usr/lib/postgresql/*/bin" >&2
    exit 1
fi
