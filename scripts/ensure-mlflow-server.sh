#!/usr/bin/env bash
# MLflow's tracking server for tests/integration/test_tracking.py: full MLflow (its server, SQLite
# backend store, artifact proxy) in its own venv, build/mlflow-venv, so that its many dependencies
# never meet the product's. The product itself uses only the client (mlflow-skinny, the pyproject
# extra mlflow). Instant when the venv of this version is there; the tests skip with the reason
# when it cannot be installed.
set -euo pipefail

VERSION="3.17.2"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/build/mlflow-venv"
STAMP="$DEST/.confide-mlflow-$VERSION"

if [[ -x "$DEST/bin/mlflow" && -f "$STAMP" ]]; then
    exit 0
fi
rm -rf "$DEST"
if ! python3 -m venv "$DEST"; then
    echo "ensure-mlflow-server: cannot make a venv; the tracking tests will skip" >&2
    exit 0
fi
UV="$ROOT/.venv/bin/uv"
if [[ -x "$UV" ]]; then
    VIRTUAL_ENV="$DEST" "$UV" pip install -q "mlflow==$VERSION" || { echo "ensure-mlflow-server: install failed; the tracking tests will skip" >&2; exit 0; }
else
    "$DEST/bin/pip" install -q "mlflow==$VERSION" || { echo "ensure-mlflow-server: install failed; the tracking tests will skip" >&2; exit 0; }
fi
touch "$STAMP"
