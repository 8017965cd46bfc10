#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Confide container image, built offline: no base image is pulled from anywhere.
#
#   scripts/build-image.sh            -> localhost/confide:<version> in podman's storage, and
#                                        build/image/confide-<version>.oci.tar, .sbom.cdx.json, .json
#
# 1. mmdebstrap makes a Debian bookworm root file system from Debian's packages: the essential set,
#    python3, ca-certificates and libstdc++6 (numpy, scipy and pyarrow need it); documentation, manuals and translations left out. Its time
#    stamps are SOURCE_DATE_EPOCH (the last commit's), so the same packages give the same tree.
# 2. The wheel and its pinned dependencies (build/wheelhouse, scripts/build-wheelhouse.sh) go
#    into /opt/confide/lib with no index; bytecode is compiled there once (unchecked-hash: no time
#    stamps), since the root file system is read-only when the image runs.
# 3. A user `confide` (10001) with no login shell owns /var/lib/confide, the state volume. Every
#    file newer than SOURCE_DATE_EPOCH (what the hooks wrote) is dated to it.
# 4. buildah commits it from scratch: user 10001, entry point `python3 -m confide container`
#    (the role is the command: `run controller|aggregator|agent ...`), a health check
#    (`confide container health`), OCI labels (version, revision, created) and the SBOM
#    (scripts/sbom.py, CycloneDX) both inside (/usr/share/confide/sbom.cdx.json) and beside it.
#
# One image for every role: the roles share every byte but the command (the same wheel and
# dependencies), so one build, one SBOM and one digest to pin cover a site; a per-role image would
# repeat 95% of its layers. Needs root, podman, buildah and mmdebstrap (scripts/ensure-podman.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export BUILDAH_FORMAT=docker
export CONTAINERS_CONF="${CONTAINERS_CONF:-$ROOT/build/containers/containers.conf}"
MIRROR="${CONFIDE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
VERSION=$(.venv/bin/python -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
IMAGE="localhost/confide:$VERSION"
OUT=build/image
SITE=/opt/confide/lib

./scripts/build-wheelhouse.sh
mkdir -p "$OUT"
started=$(date +%s)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"; [[ -n "${ctr:-}" ]] && buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT

python3 -m pip install --quiet --root-user-action=ignore --no-index --no-compile --no-warn-script-location --no-warn-conflicts --find-links build/wheelhouse \
    --target "$WORK/site" --python-version 3.11 --implementation cp --only-binary=:all: \
    "confide==$VERSION"
rm -rf "$WORK/site/bin"

mmdebstrap --quiet --variant=essential --include=python3,ca-certificates,libstdc++6 \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook="mkdir -p \"\$1$SITE\" && cp -a '$WORK/site/.' \"\$1$SITE/\"" \
    --customize-hook="chroot \"\$1\" python3 -m compileall -q -j 0 --invalidation-mode unchecked-hash $SITE >/dev/null" \
    --customize-hook='echo "confide:x:10001:10001:Confide:/var/lib/confide:/usr/sbin/nologin" >> "$1/etc/passwd"' \
    --customize-hook='echo "confide:x:10001:" >> "$1/etc/group"' \
    --customize-hook='mkdir -p "$1/var/lib/confide" "$1/etc/confide" "$1/run/confide" "$1/usr/share/confide" && chown 10001:10001 "$1/var/lib/confide" "$1/run/confide"' \
    --customize-hook="python3 '$ROOT/scripts/sbom.py' \"\$1\" $SITE confide $VERSION > \"\$1/usr/share/confide/sbom.cdx.json\"" \
    --customize-hook="cp \"\$1/usr/share/confide/sbom.cdx.json\" '$WORK/sbom.cdx.json'" \
    --customize-hook='rm -rf "$1/var/cache/apt" "$1/var/lib/apt/lists" "$1/var/log"/*' \
    --customize-hook='find "$1" \( -path "$1/proc" -o -path "$1/sys" -o -path "$1/dev" \) -prune -o -newermt "@$SOURCE_DATE_EPOCH" -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +' \
    bookworm "$WORK/rootfs.tar" "$MIRROR"

ctr=$(buildah from scratch)
buildah add --quiet "$ctr" "$WORK/rootfs.tar" / >/dev/null
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
buildah config \
    --user 10001:10001 \
    --workingdir /var/lib/confide \
    --env PYTHONPATH=$SITE --env PYTHONDONTWRITEBYTECODE=1 --env PYTHONUNBUFFERED=1 \
    --env HOME=/var/lib/confide --env MPLCONFIGDIR=/tmp --env CONFIDE_RUN_DIR=/run/confide \
    --env CONFIDE_SECRETS_ROOT=/etc/confide \
    --entrypoint '["/usr/bin/python3", "-m", "confide", "container"]' --cmd '["health"]' \
    --healthcheck 'CMD /usr/bin/python3 -m confide container health' \
    --healthcheck-interval 10s --healthcheck-timeout 8s --healthcheck-retries 3 --healthcheck-start-period 30s \
    --volume /var/lib/confide \
    --label org.opencontainers.image.title=confide \
    --label org.opencontainers.image.description="Confide: cross-silo federated learning (controller, aggregator node, party agent)" \
    --label org.opencontainers.image.version="$VERSION" \
    --label org.opencontainers.image.revision="$REVISION" \
    --label org.opencontainers.image.created="$created" \
    --label org.opencontainers.image.licenses=Apache-2.0 \
    --label io.confide.sbom=/usr/share/confide/sbom.cdx.json \
    --label io.confide.roles="controller aggregator agent" \
    "$ctr"
buildah commit --quiet --format docker --timestamp "$SOURCE_DATE_EPOCH" --rm "$ctr" "$IMAGE" >/dev/null
ctr=
rm -f "$OUT/confide-$VERSION.oci.tar"
podman save --quiet --format oci-archive -o "$OUT/confide-$VERSION.oci.tar" "$IMAGE"
cp "$WORK/sbom.cdx.json" "$OUT/confide-$VERSION.sbom.cdx.json"
seconds=$(($(date +%s) - started))
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
digest=$(podman image inspect --format '{{.Digest}}' "$IMAGE")
id=$(podman image inspect --format '{{.Id}}' "$IMAGE")
printf '{"image": "%s", "id": "%s", "digest": "%s", "size_bytes": %s, "build_seconds": %s, "revision": "%s"}\n' \
    "$IMAGE" "$id" "$digest" "$size" "$seconds" "$REVISION" > "$OUT/confide-$VERSION.json"
echo "build-image: $IMAGE, $((size / 1048576)) MiB, built in ${seconds} s; $OUT/confide-$VERSION.oci.tar"
