"""Web console benchmark: page loads with a federation of 200 parties and 50 jobs registered.

The controller runs as its own OS process (``python -m confide controller --console``, SQLite
store in a temporary directory, the default deployment). This process fills its store the way
agents and people would, through the same Controller operations on the same database: ``--parties``
parties (one dataset each, metadata only), one aggregator, one developer granted every dataset,
``--jobs`` sessions of ``--job-parties`` parties each, and ``--rounds`` rounds of per-round metrics
reported by every party of every session (what the curves draw). Then one signed-in browser
(an ``httpx.Client`` with the session cookie, no client certificate) loads each page
``--loads`` times in turn, sequentially, measuring the time to the last byte of the HTML (or
JSON) on the client side:

* ``console.job_page``: ``/jobs/{token}`` of a random session (status, metrics of every party,
  log, lineage; the issue's target: p95 under 300 ms);
* ``console.jobs_page``, ``console.federation_page``, ``console.data_page``, ``console.audit_page``;
* ``console.metrics_json``: ``/jobs/{token}/metrics.json`` (what a chart reload reads).

Anchor, in the same run: ``GET /v1/sessions/{token}`` on the controller's mutual-TLS REST API
(the developer's certificate, a kept-alive connection), the cheapest read of the same session;
the ratio is what rendering a whole page costs over it. Each figure is a median of ``--repeats``
passes (p50 and p95 per pass).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchutil  # noqa: E402

from confide.controller.service import Caller, Controller  # noqa: E402
from confide.controller.store import open_store  # noqa: E402
from confide.transport.certs import init_federation  # noqa: E402
from confide.web.accounts import Accounts  # noqa: E402

PASSWORD = "benchmark password"


def populate(database: str, args) -> list[str]:
    """Parties, datasets, grants, sessions and their metrics; returns the session tokens."""
    store = open_store(database)
    controller = Controller(store)
    schema = [{"name": f"x{i}", "dtype": "float"} for i in range(30)] + [{"name": "label", "dtype": "int"}]
    parties = [f"site-{i:03d}" for i in range(args.parties)]
    controller.register(Caller("aggregator", "service"), address="127.0.0.1:1", datasets=[], cert_sha256="1" * 64)
    for name in parties:
        caller = Caller(name, "party")
        controller.register(
            caller, address=None, datasets=[{"name": "records", "schema": schema, "rows": 5000}], cert_sha256="0" * 64
        )
        controller.grant(caller, dataset="records", developer="dev")
    tokens = []
    for j in range(args.jobs):
        members = [parties[(j * args.job_parties + k) % len(parties)] for k in range(args.job_parties)]
        spec = {
            "job_id": f"bench-job-{j:03d}",
            "rounds": args.rounds,
            "checkpoint_interval": 10,
            "fl_data": {
                "label": "label",
                "participants": {p: {"dataset": "records"} for p in members},
                "pipeline": [{"name": "scaled", "op": "scale", "params": {"method": "standard"}}],
            },
            "protection": {"mode": "paillier"},
        }
        token = controller.submit(Caller("dev", "developer"), spec)["session"]
        tokens.append(token)
        for party in members:
            rows = [
                {
                    "round": r,
                    "loss": 0.7 / r,
                    "auc": 0.9,
                    "seconds": 0.2,
                    "crypto_s": 0.05,
                    "train_s": 0.1,
                    "bytes_sent": 800_000,
                    "bytes_received": 500_000,
                }
                for r in range(1, args.rounds + 1)
            ]
            report = {"session": token, "run": 1, "status": "running", "round": args.rounds, "metrics": rows}
            report["protection"] = {"mode": "paillier", "key_bits": 2048, "quantization_bits": 16}
            controller.sync(Caller(party, "party"), [report])
    Accounts(store).create("dev", "developer", PASSWORD)
    store.close()
    return tokens


def wait_port(path: Path, process: subprocess.Popen, timeout_s: float = 60) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        if process.poll() is not None:
            raise SystemExit(f"the controller exited with code {process.returncode}")
        time.sleep(0.05)
    raise SystemExit("the controller did not start")


def timed(client: httpx.Client, path: str) -> float:
    start = time.perf_counter()
    reply = client.get(path)
    elapsed = time.perf_counter() - start
    if reply.status_code != 200:
        raise SystemExit(f"GET {path}: {reply.status_code} {reply.text[:300]}")
    return elapsed * 1000


def percentiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parties", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--job-parties", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=100, help="rounds of metrics per party per session")
    parser.add_argument("--loads", type=int, default=100, help="loads of each page per pass")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="write benchmarks/results/console.json")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="confide-console-bench-") as tmp:
        root = Path(tmp)
        init_federation(root / "certs", parties=[], developers=["dev"])
        database = f"sqlite:///{root / 'controller.db'}"
        started = time.perf_counter()
        tokens = populate(database, args)
        print(f"store filled in {time.perf_counter() - started:.1f} s: {args.parties} parties, {len(tokens)} jobs")
        command = [sys.executable, "-m", "confide", "controller", "--certs", str(root / "certs"), "--db", database]
        command += ["--listen", "127.0.0.1:0", "--port-file", str(root / "port"), "--alive", "3600"]
        command += ["--console", "127.0.0.1:0", "--console-port-file", str(root / "console-port")]
        with open(root / "controller.log", "wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
        try:
            console_port = wait_port(root / "console-port", process)
            rest_port = wait_port(root / "port", process)
            figures = measure(root, console_port, rest_port, tokens, args)
        finally:
            process.terminate()
            process.wait(30)

    params = {"parties": args.parties, "jobs": args.jobs, "job_parties": args.job_parties, "rounds": args.rounds}
    params |= {"loads": args.loads, "repeats": args.repeats, "store": "sqlite"}
    anchor_p50, anchor_p95 = figures.pop("anchor")
    results = []
    for name, (p50, p95) in figures.items():
        results.append(benchutil.record(f"{name}.p95_ms", p95, "ms", "rest.session_status.p95_ms", anchor_p95, params))
        results.append(benchutil.record(f"{name}.p50_ms", p50, "ms", "rest.session_status.p50_ms", anchor_p50, params))
    print(f"{'record':<36} {'value':>9}  anchor (REST status) ratio")
    for r in results:
        print(f"{r['name']:<36} {r['value']:>7.1f} ms {r['anchor_value']:>7.1f} ms  {r['ratio']:.2f}x")
    if args.write:
        path = benchutil.write("console", benchutil.machine(), results)
        benchutil.write_markdown_block("console", "Web console", benchutil.results_table(results, ".1f", ".1f"))
        print(f"wrote {path}")


def measure(root: Path, console_port: int, rest_port: int, tokens: list[str], args) -> dict:
    context = ssl.create_default_context(cafile=root / "certs" / "ca.crt")
    browser = httpx.Client(base_url=f"https://127.0.0.1:{console_port}", verify=context, timeout=30)
    form = browser.get("/signin")
    token = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
    signed = browser.post("/signin", data={"csrf": token, "name": "dev", "password": PASSWORD, "next": "/jobs"})
    if signed.status_code != 303:
        raise SystemExit(f"sign-in failed: {signed.status_code}")
    rest_context = ssl.create_default_context(cafile=root / "certs" / "ca.crt")
    rest_context.load_cert_chain(root / "certs" / "dev.crt", root / "certs" / "dev.key")
    rest = httpx.Client(base_url=f"https://127.0.0.1:{rest_port}", verify=rest_context, timeout=30)
    pages = {
        "console.job_page": lambda: f"/jobs/{random.choice(tokens)}",
        "console.jobs_page": lambda: "/jobs",
        "console.federation_page": lambda: "/federation",
        "console.data_page": lambda: "/data",
        "console.audit_page": lambda: "/audit",
        "console.metrics_json": lambda: f"/jobs/{random.choice(tokens)}/metrics.json",
    }
    passes: dict[str, list[tuple[float, float]]] = {name: [] for name in [*pages, "anchor"]}
    random.seed(7)
    for path in pages.values():  # warm-up: templates compiled, connections open
        timed(browser, path())
    timed(rest, f"/v1/sessions/{tokens[0]}")
    for _ in range(args.repeats):
        passes["anchor"].append(
            percentiles([timed(rest, f"/v1/sessions/{random.choice(tokens)}") for _ in range(args.loads)])
        )
        for name, path in pages.items():
            passes[name].append(percentiles([timed(browser, path()) for _ in range(args.loads)]))
    browser.close()
    rest.close()
    return {
        name: (statistics.median(p[0] for p in values), statistics.median(p[1] for p in values))
        for name, values in passes.items()
    }


if __name__ == "__main__":
    main()
