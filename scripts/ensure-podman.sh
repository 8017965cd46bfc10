#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Podman, Buildah and mmdebstrap for the container image and the containerized federation's tests
# (tests/integration/test_containers.py), and build/containers/containers.conf, which the image
# build and the tests pass to every podman call through CONTAINERS_CONF. Podman runs as root here
# with runc, the cgroupfs manager and no default ulimits: the default runtime (crun) refuses this
# kind of machine's hybrid cgroups and its rlimits. Idempotent; without apt-get or root it says so
# and exits 0 (the tests that need podman then skip, naming what is missing).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONF="$ROOT/build/containers/containers.conf"

missing=()
for tool in podman buildah mmdebstrap runc catatonit; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if ((${#missing[@]})); then
    if ! command -v apt-get >/dev/null 2>&1 || [[ "$(id -u)" -ne 0 ]]; then
        echo "ensure-podman: ${missing[*]} missing and not installable here (needs apt-get as root):" \
            "the image and container tests will skip" >&2
        exit 0
    fi
    echo "installing Debian's podman, buildah, mmdebstrap and runc for the container tests"
    apt-get update -qq >/dev/null
    # catatonit: the pause process of a pod (podman kube play); fuse-overlayfs and slirp4netns are
    # podman's fallbacks; uidmap for its user namespaces.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman buildah mmdebstrap \
        runc catatonit uidmap slirp4netns fuse-overlayfs containernetworking-plugins >/dev/null
fi
mkdir -p "$(dirname "$CONF")"
cat > "$CONF.tmp" <<'EOF'
# Written by scripts/ensure-podman.sh; passed to podman and buildah through CONTAINERS_CONF.
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
mv "$CONF.tmp" "$CONF"
