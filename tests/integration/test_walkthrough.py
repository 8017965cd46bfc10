"""examples/hospital_csv/README.md, run as written: its shell blocks, in one shell, as separate processes.

Sections 1-3 (identities by signing request, the services and agents, grants and the developer's
job) with the job cut to 3 rounds; between 2 and 3 the test waits until the hospitals' datasets
are published, as a reader typing the commands would. It checks that the job completed and that
the CA key exists in the operator's folder and nowhere else: no identity, the services' and the
developer's included, was made or used from there.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "examples" / "hospital_csv" / "README.md"

WAIT_FOR_DATASETS = """
for i in $(seq 120); do
  [ "$(confide data list --controller https://127.0.0.1:8443 --certs $W/alice --as alice 2>/dev/null \\
      | grep -cE '^hospital-[abc] +patients ')" = 3 ] && break
  sleep 0.5
done
"""


def test_the_hospital_walkthrough_runs_as_written_and_the_ca_key_stays_with_the_operator(tmp_path):
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    identities, services, job = blocks[:3]
    (stop,) = [block for block in blocks if block.startswith("confide stop")]
    short = tmp_path / "job.yaml"
    short.write_text((ROOT / "examples" / "hospital_csv" / "job.yaml").read_text().replace("rounds: 30", "rounds: 3"))
    ports = "127.0.0.1:8443", "127.0.0.1:50051", "50052"
    script = "\n".join(
        [
            "set -euo pipefail",
            identities.replace("W=/tmp/flc", f"W={tmp_path / 'flc'}"),
            services,
            WAIT_FOR_DATASETS,
            job.replace("examples/hospital_csv/job.yaml", str(short)),
            'ls "$W/run"',
            stop,
            '[ -z "$(ls -A "$W/run")" ] && echo "every pid file removed"',
        ]
    )
    for port in ports:  # the walkthrough's fixed ports: refuse to start over someone else's service
        assert port in script
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    log = tmp_path / "walkthrough.log"
    with open(log, "w") as out:  # a file, not a pipe: the services it starts keep writing after it ends
        process = subprocess.Popen(
            ["bash", "-c", script], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            process.wait(timeout=300)
        finally:
            try:
                os.killpg(process.pid, signal.SIGTERM)  # the services and agents it left running
            except ProcessLookupError:
                pass
    output = log.read_text()
    assert process.returncode == 0, output[-4000:]
    assert re.search(r"session \w+: completed \(run 1, round 3\)", output), output[-4000:]
    # `confide stop` ended the five services it started and removed their pid files.
    assert output.count(": stopped process ") == 5, output[-4000:]
    assert "every pid file removed" in output
    keys = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("ca.key"))
    assert keys == ["flc/operator/ca.key"], keys
    held = sorted(p.name for p in (tmp_path / "flc").rglob("*.key") if p.name != "ca.key")
    assert held == sorted(f"{name}.key" for name in ["controller", "aggregator", "alice", *HOSPITALS])
    assert [p.name for p in (tmp_path / "flc" / "operator").glob("*.key")] == ["ca.key"]


HOSPITALS = ["hospital-a", "hospital-b", "hospital-c"]
