"""The controller path end to end, as ``make demo`` shows it after the runtime demo.

Starts a controller (SQLite store), an aggregator and three hospital agents as separate
processes (HTTPS and gRPC, all mutual TLS), then runs the ``confide`` commands a developer and
the data owners would type: a job refused for lack of a grant, the grants, the job, a tuning
whose deltas go only to the parties, a resume from the last checkpoint, and the session log.

``--vertical``: the same for a vertical job: a hospital and a lab holding different columns of
the same patients in their own CSV exports (``examples/vertical_csv``), a Hetero NN whose
checkpoints bind both sites' training state under one Merkle root.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from confide.local import LocalDeployment

JOB = Path(__file__).with_name("breast_cancer_controller.yaml")
VERTICAL = Path(__file__).with_name("vertical_csv")


def main() -> int:
    """Run the demo; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", default="reports/demo-controller")
    parser.add_argument("--vertical", action="store_true", help="a vertical job over two sites' own CSV exports")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    for stale in ("controller.db", "controller.db-wal", "controller.db-shm", "parties", "aggregator-state", "logs"):
        target = workdir / stale
        shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)

    if args.vertical:
        catalogs = {}
        for site in ("hospital", "lab"):
            catalog = yaml.safe_load((VERTICAL / site / "catalog.yaml").read_text())
            for entry in catalog["datasets"].values():
                entry["path"] = str((VERTICAL / site / entry["path"]).resolve())
            catalogs[site] = catalog
        deployment = LocalDeployment(workdir, parties=list(catalogs), catalogs=catalogs)
        print("starting a controller, an aggregator and the agents of a hospital and a lab (own CSV exports)")
    else:
        deployment = LocalDeployment(workdir)
        print("starting a controller (SQLite), an aggregator and 3 hospital agents (HTTPS/gRPC, mutual TLS)")
    deployment.start()
    env = {**os.environ, "CONFIDE_CONTROLLER": deployment.url, "CONFIDE_CERTS": str(deployment.certs)}

    def confide(identity: str, *argv: str, check: bool = True) -> str:
        shown = " ".join(argv)
        print(f"\n$ confide {shown}    # as {identity}")
        done = subprocess.run(
            [sys.executable, "-m", "confide", *argv],
            env={**env, "CONFIDE_IDENTITY": identity},
            capture_output=True,
            text=True,
        )
        output = (done.stdout + done.stderr).rstrip()
        print(output)
        if check and done.returncode != 0:
            raise SystemExit(f"confide {shown} failed")
        return output

    try:
        if args.vertical:
            job = str(VERTICAL / "job.yaml")
            confide("alice", "data", "list")
            confide("alice", "job", "submit", job, check=False)
            confide("hospital", "grant", "add", "--dataset", "records", "--developer", "alice")
            confide("lab", "grant", "add", "--dataset", "panel", "--developer", "alice")
            token = confide("alice", "job", "submit", job, "--wait").split()[1]
            confide("alice", "job", "status", token)
            confide("alice", "session", "log", token)
            return 0
        confide("alice", "data", "list")
        confide("alice", "job", "submit", str(JOB), check=False)
        for party in deployment.parties:
            confide(party, "grant", "add", "--dataset", "breast-cancer", "--developer", "alice")
        submitted = confide("alice", "job", "submit", str(JOB), "--wait")
        token = submitted.split()[1]
        confide("alice", "job", "status", token)
        confide("alice", "job", "tune", token, "--set", "model.learning_rate=0.1", "--set", "rounds=15")
        confide("alice", "job", "resume", token, "--wait")
        confide("alice", "session", "log", token)
        confide("runner", "audit")
    finally:
        deployment.stop()
    print(f"\nlogs and checkpoints: {workdir}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
