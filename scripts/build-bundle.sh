#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The offline bundle (make bundle): one archive an air-gapped site installs from, with no network.
#
#   dist/confide-bundle-<version>-linux-x86_64.tar, unpacking to confide-bundle-<version>/:
#     install.sh        pip install --no-index from wheels/ into a venv; podman load of the image
#     wheels/           the confide wheel and every dependency at the suite's pinned versions
#                       (CPython 3.11, x86-64 Linux: scripts/build-wheelhouse.sh)
#     images/           the image as an OCI archive, its SBOM and its digest (scripts/build-image.sh)
#     chart/            the Helm chart, packaged (helm package) when helm is built, else as files
#     deploy/           compose file, systemd units, Grafana dashboard
#     examples/         the demo job (breast cancer: its data ships inside scikit-learn)
#     SHA256SUMS        every file above; install.sh checks it first
# The image part is left out, and said so in the archive's MANIFEST, where the image was not built.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VERSION=$(.venv/bin/python -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
NAME="confide-bundle-$VERSION"
STAGE="build/bundle/$NAME"
OUT="dist/$NAME-linux-x86_64.tar"

./scripts/build-wheelhouse.sh
rm -rf "build/bundle"
mkdir -p "$STAGE"/{wheels,images,chart,deploy,examples}
cp build/wheelhouse/*.whl "$STAGE/wheels/"
manifest=("confide $VERSION ($(git rev-parse HEAD 2>/dev/null || echo unknown))" "wheels: $(ls "$STAGE/wheels" | wc -l)")
if [[ -f "build/image/confide-$VERSION.oci.tar" ]]; then
    cp "build/image/confide-$VERSION.oci.tar" "build/image/confide-$VERSION.sbom.cdx.json" \
        "build/image/confide-$VERSION.json" "$STAGE/images/"
    manifest+=("image: images/confide-$VERSION.oci.tar (localhost/confide:$VERSION)")
else
    manifest+=("image: not built here (make image needs root and podman); install the wheels only")
fi
if [[ -x build/helm/helm ]]; then
    build/helm/helm package --destination "$STAGE/chart" deploy/helm/confide >/dev/null
else
    cp -r deploy/helm/confide "$STAGE/chart/"
fi
cp -r deploy/compose deploy/systemd deploy/grafana "$STAGE/deploy/"
cp examples/breast_cancer.yaml "$STAGE/examples/"
cp scripts/bundle-install.sh "$STAGE/install.sh"
printf '%s\n' "${manifest[@]}" > "$STAGE/MANIFEST"
(cd "$STAGE" && find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort | xargs sha256sum > SHA256SUMS)
mkdir -p dist
# Reproducible: sorted names, fixed owner and the last commit's time.
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" -cf "$OUT.tmp" -C build/bundle "$NAME"
mv "$OUT.tmp" "$OUT"
echo "build-bundle: $OUT, $(($(stat -c %s "$OUT") / 1048576)) MiB"
