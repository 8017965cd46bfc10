#!/usr/bin/env bash
# Vendor the console's front-end libraries (web/package-lock.json, from the npm registry) into
# python/confide/web/static/vendor, so the console fetches nothing from a CDN at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v npm >/dev/null; then
  if command -v apt-get >/dev/null; then
    echo "installing Node.js and npm (the console's front-end libraries come from the npm registry)"
    sudo=(); [[ "$(id -u)" -eq 0 ]] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq nodejs npm >/dev/null
  else
    echo "npm not found and no apt-get: install Node.js and npm (the console's libraries come from npm)" >&2
    exit 1
  fi
fi
(cd web && npm ci --no-audit --no-fund --loglevel=error)
out=python/confide/web/static/vendor
mkdir -p "$out"
cp web/node_modules/htmx.org/dist/htmx.min.js "$out/"
cp web/node_modules/uplot/dist/uPlot.iife.min.js web/node_modules/uplot/dist/uPlot.min.css "$out/"
cp web/node_modules/cytoscape/dist/cytoscape.min.js "$out/"
# The job editor: CodeMirror 6 + the job schema's completion and checks, bundled into one file.
web/node_modules/.bin/esbuild web/src/editor.js --bundle --minify --format=iife --target=es2020 \
  --log-level=error --outfile="$out/editor.js"
for package in htmx.org uplot cytoscape codemirror codemirror-json-schema; do
  cp "web/node_modules/$package/LICENSE" "$out/LICENSE.$package" 2>/dev/null || true
done
touch "$out/.built"
