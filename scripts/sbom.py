#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A CycloneDX 1.5 SBOM of an image's root file system: its Debian packages and Python distributions.

    sbom.py ROOTFS PYTHON_SITE NAME VERSION > sbom.cdx.json

Debian packages come from ``ROOTFS/var/lib/dpkg/status`` (name, version, architecture: a
``pkg:deb/debian`` purl); Python distributions from the ``*.dist-info/METADATA`` files under
``ROOTFS/PYTHON_SITE`` (a ``pkg:pypi`` purl). The output is sorted and carries no time of its
own but ``SOURCE_DATE_EPOCH``'s, so the same root file system gives the same bytes.
"""

from __future__ import annotations

import datetime
import email.parser
import json
import os
import sys
from pathlib import Path


def debian_packages(rootfs: Path) -> list[dict]:
    """The installed packages of dpkg's status file, as CycloneDX components."""
    status = (rootfs / "var/lib/dpkg/status").read_text()
    out = []
    for stanza in status.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line[0].isspace())
        if not fields.get("Package") or "installed" not in fields.get("Status", ""):
            continue
        name, version, arch = fields["Package"], fields["Version"], fields.get("Architecture", "all")
        out.append(
            {
                "type": "library",
                "name": name,
                "version": version,
                "purl": f"pkg:deb/debian/{name}@{version}?arch={arch}&distro=bookworm",
            }
        )
    return out


def python_distributions(site: Path) -> list[dict]:
    """The distributions installed in ``site``, as CycloneDX components."""
    out = []
    for metadata in site.glob("*.dist-info/METADATA"):
        headers = email.parser.Parser().parsestr(metadata.read_text(errors="replace"), headersonly=True)
        name, version = headers["Name"], headers["Version"]
        component = {"type": "library", "name": name, "version": version, "purl": f"pkg:pypi/{name.lower()}@{version}"}
        if headers.get("License-Expression") or headers.get("License"):
            text = (headers.get("License-Expression") or headers.get("License") or "").strip().splitlines()[0][:200]
            component["licenses"] = [{"license": {"name": text}}]
        out.append(component)
    return out


def main() -> int:
    """Write the SBOM to standard output."""
    rootfs, site, name, version = Path(sys.argv[1]), sys.argv[2].lstrip("/"), sys.argv[3], sys.argv[4]
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    components = sorted(
        debian_packages(rootfs) + python_distributions(rootfs / site), key=lambda c: (c["purl"], c["name"])
    )
    document = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "timestamp": datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc)
            .isoformat()
            .replace("+00:00", "Z"),
            "component": {"type": "container", "name": name, "version": version},
        },
        "components": components,
    }
    json.dump(document, sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
