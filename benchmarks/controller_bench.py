"""Controller API benchmark: latency and throughput under load from a second process on loopback.

The controller runs as its own OS process (``python -m confide controller``, SQLite store in a
temporary directory, the default deployment). This process is the load generator: it creates a
federation of ``--parties`` party identities (one dataset each, metadata only), one aggregator
service and one developer, registers them all and grants the developer every dataset. Every
identity then holds one mutual-TLS connection (an ``httpx.AsyncClient`` with its own certificate,
all on one asyncio loop) and the phases are:

0. idle: one party, sequential requests, nothing else running: GET /v1/health, then
   POST /v1/agent/sync (the service time of one request, without queueing);
1. anchor: every party (and the aggregator) requests GET /v1/health in a closed loop for
   ``--seconds``; the floor that TLS + HTTP + uvicorn + FastAPI routing sets on this machine;
2. heartbeat: every party (and the aggregator) calls POST /v1/agent/sync in a closed loop for
   ``--seconds`` (no sessions yet: an empty report list, no instructions);
3. jobs: every agent heartbeats at the agent's default pace (``--heartbeat``, 1 s, staggered)
   while the developer submits ``--jobs`` jobs one after the other (``--job-parties`` parties
   each, every party in the same number of jobs), then reads every session's status and log;
   after each submission it requests GET /v1/health, which anchors these latencies under the
   same background load;
4. heartbeat with live sessions: every party now receives its session's instruction and reports
   on it as an agent does (applied_seq, run, status, round); the aggregator, a recipient of every
   session, reports on all of them. First at the agents' pace for ``--seconds``
   (``controller.sync.paced.*``), then in a closed loop (``controller.sync.sessions.*``).

"Closed loop" means each identity sends its next request as soon as the previous answer
arrives (``--interval`` adds a pause), so the figures are the controller's saturation
throughput and the latency at that load, with ``--parties`` requests always outstanding.
Latency is measured in this process around each request (client overhead included; both
processes share the machine's cores). CPU seconds of the controller process (from /proc) are
divided by the requests of each phase. The fsync floor of the store is measured in the same
run: a one-row UPDATE committed with SQLite WAL + synchronous=FULL (the controller's settings)
in the same directory, before the controller starts.

``--stores sqlite,postgres`` runs everything a second time on PostgreSQL (a throw-away cluster
from tests/postgres.py; records ``controller.postgres.*``); the default, SQLite only, takes
about 2 minutes, both about 4.5.

``--capacity`` runs instead the capacity run (records in ``controller_capacity.json``, about 3
minutes): one controller with ``--workers`` processes on PostgreSQL (tests/postgres.py), and
``--agents`` simulated agents (default 250,500,750,1000, one step after another), each with its
own client certificate and mutual-TLS connection, every one heartbeating every ``--heartbeat``
seconds (no sessions, staggered starts) for ``--capacity-seconds``. The load generator is a
bare HTTP/1.1 client over asyncio TLS streams (httpx costs ~1.5 ms of CPU per request, more
than the controller's heartbeat), in this one process, sharing the machine's cores with the
controller and PostgreSQL. A step *holds* when the heartbeats answered reach 95% of those
offered and their p99 latency stays under the interval; ``controller.agents_held`` is the
largest step that held. The anchor is ``GET /v1/health`` from the largest step's agents at the
same pace, measured first in the same run. Controller CPU is summed over the parent and its
workers (/proc), PostgreSQL's over its server processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import machine, record, results_table, write, write_markdown_block  # noqa: E402

from confide.transport.certs import CA_CERT_FILE, init_federation  # noqa: E402

ANCHOR = "GET /v1/health, same connections, same load"
DATASET = "records"


@dataclass
class Identity:
    """One identity's mutual-TLS connection and, for agents, what it has applied."""

    name: str
    role: str
    http: httpx.AsyncClient
    sessions: dict[str, dict] = field(default_factory=dict)
    round: int = 0

    def reports(self) -> list[dict]:
        """One report per session, as a party agent sends them."""
        return [
            {"session": token, "applied_seq": s["seq"], "run": s["run"], "status": "running", "round": self.round}
            for token, s in self.sessions.items()
        ]

    def follow(self, answer: dict) -> None:
        """Apply the instructions (the agent would start, reconfigure or stop its process)."""
        for instruction in answer.get("instructions", []):
            if instruction.get("command") == "stop":
                self.sessions.pop(instruction["session"], None)
            else:
                self.sessions[instruction["session"]] = {"seq": instruction["seq"], "run": instruction["run"]}


class Failed(Exception):
    pass


def client(url: str, certs: Path, name: str, role: str) -> Identity:
    context = ssl.create_default_context(cafile=str(certs / CA_CERT_FILE))
    context.load_cert_chain(str(certs / f"{name}.crt"), str(certs / f"{name}.key"))
    http = httpx.AsyncClient(
        base_url=url,
        verify=context,
        timeout=120.0,
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=300),
    )
    return Identity(name, role, http)


async def call(who: Identity, method: str, path: str, body=None) -> tuple[float, dict]:
    """One request; returns (seconds, decoded JSON)."""
    start = time.perf_counter()
    response = await who.http.request(method, path, json=body)
    elapsed = time.perf_counter() - start
    if response.status_code >= 400:
        raise Failed(f"{who.name} {method} {path}: {response.status_code} {response.text[:300]}")
    return elapsed, response.json()


async def health(who: Identity) -> float:
    elapsed, _ = await call(who, "GET", "/v1/health")
    return elapsed


async def sync(who: Identity) -> float:
    elapsed, answer = await call(who, "POST", "/v1/agent/sync", {"reports": who.reports()})
    who.follow(answer)
    who.round += 1
    return elapsed


class CpuClock:
    """CPU seconds of this process and of the controller process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.tick = os.sysconf("SC_CLK_TCK")

    def server(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.tick

    def snapshot(self) -> tuple[float, float, float]:
        return time.perf_counter(), self.server(), time.process_time()


async def closed_loop(who_all: list[Identity], request, seconds: float, interval: float, stagger: bool = False) -> dict:
    """Every identity repeats ``request`` until ``seconds`` pass; latencies of requests that ended in time.

    ``interval``: pause after each answer (an agent's sync interval); ``stagger``: start each
    identity at a random point of the first interval (agents are not started in lockstep).
    """
    latencies: dict[str, list[float]] = {w.name: [] for w in who_all}
    end = time.perf_counter() + seconds
    rng = random.Random(2)

    async def loop(who: Identity) -> None:
        if stagger:
            await asyncio.sleep(rng.uniform(0, interval))
        while time.perf_counter() < end:
            elapsed = await request(who)
            if time.perf_counter() <= end:
                latencies[who.name].append(elapsed)
            if interval:
                await asyncio.sleep(interval)

    start = time.perf_counter()
    await asyncio.gather(*(loop(w) for w in who_all))
    return {"latencies": latencies, "wall": time.perf_counter() - start, "seconds": seconds}


def pct(values: list[float], q: float) -> float:
    """Percentile q in [0, 100] (linear interpolation between order statistics), in ms."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return 1000 * (ordered[low] + (ordered[high] - ordered[low]) * (position - low))


def summary(latencies: list[float], seconds: float | None = None) -> dict:
    out = {"n": len(latencies), "p50": pct(latencies, 50), "p95": pct(latencies, 95), "p99": pct(latencies, 99)}
    out["max"] = 1000 * max(latencies) if latencies else float("nan")
    if seconds:
        out["rps"] = len(latencies) / seconds
    return out


def sqlite_commit_ms(directory: Path, commits: int = 200) -> float:
    """Median ms of committing a one-row UPDATE with WAL + synchronous=FULL (the store's settings)."""
    path = directory / "fsync-probe.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v REAL)")
    db.execute("INSERT INTO t VALUES (1, 0)")
    times = []
    for i in range(commits):
        start = time.perf_counter()
        db.execute("BEGIN")
        db.execute("UPDATE t SET v = ? WHERE id = 1", (float(i),))
        db.execute("COMMIT")
        times.append(time.perf_counter() - start)
    db.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return 1000 * statistics.median(times)


def start_controller(workdir: Path, certs: Path, database: str, workers: int = 1) -> tuple[subprocess.Popen, int]:
    port_file = workdir / "controller.port"
    port_file.unlink(missing_ok=True)
    log = open(workdir / "controller.log", "wb")  # noqa: SIM115 - owned by the child
    process = subprocess.Popen(
        [sys.executable, "-m", "confide", "controller", "--certs", str(certs), "--name", "controller"]
        + ["--db", database, "--listen", "127.0.0.1:0", "--port-file", str(port_file)]
        + (["--workers", str(workers)] if workers != 1 else []),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise Failed("controller did not start:\n" + (workdir / "controller.log").read_text()[-3000:])
        time.sleep(0.05)
    return process, int(port_file.read_text().strip())


def stop_controller(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def dataset_metadata(columns: int) -> dict:
    schema = [{"name": f"x{i}", "dtype": "float"} for i in range(columns)] + [{"name": "label", "dtype": "int"}]
    return {"name": DATASET, "schema": schema, "rows": 10_000, "description": "benchmark dataset", "source": "bench"}


def job_spec(index: int, parties: list[str]) -> dict:
    return {
        "job_id": f"bench-{index}",
        "rounds": 20,
        "protection": {"mode": "secagg"},
        "fl_data": {
            "label": "label",
            "participants": {p: {"dataset": DATASET} for p in parties},
            "pipeline": [{"name": "scaled", "op": "scale", "params": {"method": "standard"}}],
        },
    }


async def gather_timed(coroutines) -> list[float]:
    return list(await asyncio.gather(*coroutines))


async def run(args, url: str, certs: Path, clock: CpuClock) -> dict:
    names = [f"party-{i:03d}" for i in range(args.parties)]
    parties = [client(url, certs, n, "party") for n in names]
    aggregator = client(url, certs, "aggregator", "service")
    developer = client(url, certs, "dev", "developer")
    agents = [*parties, aggregator]
    everyone = [*agents, developer]
    out: dict = {}
    try:
        # Connect (one mutual-TLS handshake each) before any clock runs.
        await asyncio.gather(*(health(w) for w in everyone))

        # Setup: registration with dataset metadata, grants, the aggregator's address.
        meta = dataset_metadata(args.columns)
        register = await gather_timed(
            call(p, "POST", "/v1/register", {"address": None, "datasets": [meta]}) for p in parties
        )
        grant = await gather_timed(
            call(p, "POST", "/v1/grants", {"dataset": DATASET, "developer": "dev"}) for p in parties
        )
        await call(aggregator, "POST", "/v1/register", {"address": "127.0.0.1:50051", "datasets": []})
        await call(developer, "POST", "/v1/register", {"address": None, "datasets": []})
        out["register"] = summary([t for t, _ in register])
        out["grant"] = summary([t for t, _ in grant])

        # 0. idle: one request at a time.
        probe = parties[0]
        for _ in range(20):
            await health(probe)
            await sync(probe)
        out["idle_health"] = summary([await health(probe) for _ in range(args.idle_requests)])
        out["idle_sync"] = summary([await sync(probe) for _ in range(args.idle_requests)])

        # 1. anchor: GET /v1/health from every agent at once.
        before = clock.snapshot()
        loop = await closed_loop(agents, health, args.seconds, args.interval)
        out["health"] = phase(loop, before, clock.snapshot(), [p.name for p in parties])
        print(f"  health under load: {fmt(out['health'])}", flush=True)

        # 2. heartbeat: POST /v1/agent/sync from every agent at once, no sessions.
        before = clock.snapshot()
        loop = await closed_loop(agents, sync, args.seconds, args.interval)
        out["sync"] = phase(loop, before, clock.snapshot(), [p.name for p in parties])
        print(f"  sync, no sessions: {fmt(out['sync'])}", flush=True)

        # 3. jobs, submitted while every agent heartbeats at the agent's pace.
        stop = asyncio.Event()
        background: dict[str, list[float]] = {w.name: [] for w in agents}
        rng = random.Random(1)

        async def heartbeat(who: Identity, offset: float) -> None:
            await asyncio.sleep(offset)
            while not stop.is_set():
                background[who.name].append(await sync(who))
                try:
                    await asyncio.wait_for(stop.wait(), args.heartbeat)
                except asyncio.TimeoutError:
                    pass

        before = clock.snapshot()
        tasks = [asyncio.create_task(heartbeat(w, rng.uniform(0, args.heartbeat))) for w in agents]
        await asyncio.sleep(args.heartbeat + 1.0)  # the background load is running before the first submit
        submit, status, log, anchor, tokens = [], [], [], [], []
        try:
            for j in range(args.jobs):
                chosen = [names[(j * args.job_parties + k) % len(names)] for k in range(args.job_parties)]
                elapsed, answer = await call(developer, "POST", "/v1/jobs", {"spec": job_spec(j, chosen)})
                submit.append(elapsed)
                tokens.append(answer["session"])
                anchor.append(await health(developer))
            for token in tokens:
                status.append((await call(developer, "GET", f"/v1/sessions/{token}"))[0])
                log.append((await call(developer, "GET", f"/v1/sessions/{token}/log"))[0])
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        after = clock.snapshot()
        out["submit"] = summary(submit)
        out["submit"]["rps"] = len(submit) / sum(submit)
        out["status"] = summary(status)
        out["log"] = summary(log)
        out["dev_health"] = summary(anchor)
        out["jobs_background"] = {
            **summary([t for p in parties for t in background[p.name]]),
            "rps": sum(len(v) for v in background.values()) / (after[0] - before[0]),
        }
        for key in ("submit", "status", "log", "dev_health"):
            print(f"  {key} (one developer, agents heartbeating every {args.heartbeat:g} s): {fmt(out[key])}")
        print(f"  background sync meanwhile: {fmt(out['jobs_background'])}", flush=True)

        # 4. heartbeat with live sessions: parties report on their session, the aggregator on all;
        # first at the agents' pace, then in a closed loop.
        for _ in range(3):  # let every agent pick up its instructions and the aggregator report run 1
            await asyncio.gather(*(sync(w) for w in agents))
        out["sessions_per_party"] = statistics.mean(len(p.sessions) for p in parties)
        out["aggregator_sessions"] = len(aggregator.sessions)
        before = clock.snapshot()
        loop = await closed_loop(agents, sync, args.seconds, args.heartbeat, stagger=True)
        out["sync_paced"] = phase(loop, before, clock.snapshot(), [p.name for p in parties])
        out["sync_paced"]["offered_rps"] = len(agents) / args.heartbeat
        print(f"  sync, {len(tokens)} live sessions, every {args.heartbeat:g} s: {fmt(out['sync_paced'])}")
        before = clock.snapshot()
        loop = await closed_loop(agents, sync, args.seconds, args.interval)
        out["sync_sessions"] = phase(loop, before, clock.snapshot(), [p.name for p in parties])
        out["sync_sessions_aggregator"] = summary(loop["latencies"]["aggregator"])
        print(f"  sync, {len(tokens)} live sessions, closed loop: {fmt(out['sync_sessions'])}")
        print(f"  aggregator sync ({len(aggregator.sessions)} sessions): {fmt(out['sync_sessions_aggregator'])}")
        commands = await call(parties[0], "POST", "/v1/agent/sync", {"reports": parties[0].reports()})
        out["party_commands"] = sorted({i.get("command") for i in commands[1]["instructions"]})
    finally:
        await asyncio.gather(*(w.http.aclose() for w in everyone), return_exceptions=True)
    return out


def phase(loop: dict, before, after, measured: list[str]) -> dict:
    """Latency over the measured identities, throughput over every identity, CPU per request."""
    latencies = [t for name in measured for t in loop["latencies"][name]]
    total = sum(len(v) for v in loop["latencies"].values())
    out = summary(latencies)
    out["rps"] = total / loop["seconds"]
    out["requests"] = total
    out["server_cpu_ms"] = 1000 * (after[1] - before[1]) / max(total, 1)
    out["client_cpu_ms"] = 1000 * (after[2] - before[2]) / max(total, 1)
    out["server_cpu_share"] = (after[1] - before[1]) / (after[0] - before[0])
    return out


def fmt(s: dict) -> str:
    text = f"n={s['n']:,} p50 {s['p50']:.1f} ms, p95 {s['p95']:.1f} ms, p99 {s['p99']:.1f} ms, max {s['max']:.1f} ms"
    if "rps" in s:
        text += f", {s['rps']:,.0f} req/s"
    if "server_cpu_ms" in s:
        text += f", controller CPU {s['server_cpu_ms']:.2f} ms/req ({100 * s['server_cpu_share']:.0f}% of a core)"
        text += f", load generator CPU {s['client_cpu_ms']:.2f} ms/req"
    return text


STORES = {
    "sqlite": ("controller", "sqlite (WAL, synchronous=FULL), file in a temp dir"),
    "postgres": ("controller.postgres", "PostgreSQL (tests/postgres.py: local cluster on 127.0.0.1, fsync on)"),
}


def records(m: dict, args, store: str) -> list[dict]:
    root, described = STORES[store]
    base = {
        "parties": args.parties,
        "seconds": args.seconds,
        "interval_s": args.interval,
        "store": described,
        "transport": "HTTPS/1.1, mutual TLS (ECDSA P-256), one connection per identity, loopback",
    }
    out: list[dict] = []
    idle = {**base, "concurrency": 1, "requests": args.idle_requests}
    h = m["idle_health"]["p50"]
    out.append(record(f"{root}.health.idle.p50_ms", h, "ms", params=idle))
    out.append(record(f"{root}.sync.idle.p50_ms", m["idle_sync"]["p50"], "ms", "GET /v1/health, idle", h, idle))

    def loaded(prefix: str, s: dict, anchor: dict, params: dict) -> None:
        for q in ("p50", "p95", "p99"):
            out.append(record(f"{prefix}.{q}_ms", s[q], "ms", ANCHOR, anchor[q], params))
        out.append(record(f"{prefix}.rps", s["rps"], "req/s", ANCHOR, anchor["rps"], params))
        cpu = s["server_cpu_ms"]
        out.append(record(f"{prefix}.server_cpu_ms", cpu, "ms/req", ANCHOR, anchor["server_cpu_ms"], params))

    concurrent = {**base, "concurrency": args.parties + 1}
    for q in ("p50", "p95", "p99"):
        out.append(record(f"{root}.health.{q}_ms", m["health"][q], "ms", params=concurrent))
    out.append(record(f"{root}.health.rps", m["health"]["rps"], "req/s", params=concurrent))
    out.append(record(f"{root}.health.server_cpu_ms", m["health"]["server_cpu_ms"], "ms/req", params=concurrent))
    loaded(f"{root}.sync", m["sync"], m["health"], {**concurrent, "sessions": 0})
    live = {
        **concurrent,
        "sessions": args.jobs,
        "parties_per_job": args.job_parties,
        "sessions_per_party": m["sessions_per_party"],
    }
    loaded(f"{root}.sync.sessions", m["sync_sessions"], m["health"], live)
    paced = {**live, "concurrency": None, "interval_s": args.heartbeat, "offered_rps": m["sync_paced"]["offered_rps"]}
    for q in ("p50", "p95", "p99"):
        value = m["sync_paced"][q]
        out.append(
            record(f"{root}.sync.paced.{q}_ms", value, "ms", "GET /v1/health, idle", m["idle_health"]["p50"], paced)
        )
    out.append(record(f"{root}.sync.paced.rps", m["sync_paced"]["rps"], "req/s", params=paced))
    agg = {**live, "aggregator_sessions": m["aggregator_sessions"]}
    for q in ("p50", "p99"):
        value = m["sync_sessions_aggregator"][q]
        out.append(record(f"{root}.sync.aggregator.{q}_ms", value, "ms", ANCHOR, m["health"][q], agg))
    dev = {
        **base,
        "interval_s": args.heartbeat,
        "jobs": args.jobs,
        "parties_per_job": args.job_parties,
        "concurrency": 1,
        "background": f"{args.parties} parties + aggregator syncing every {args.heartbeat:g} s",
    }
    anchor = "GET /v1/health by the developer between its calls, same load"
    d = m["dev_health"]
    for op in ("submit", "status", "log"):
        for q in ("p50", "p95"):
            out.append(record(f"{root}.{op}.{q}_ms", m[op][q], "ms", anchor, d[q], dev))
    out.append(record(f"{root}.submit.rps", m["submit"]["rps"], "jobs/s", params=dev))
    out.append(record(f"{root}.jobs.background_sync.rps", m["jobs_background"]["rps"], "req/s", params=dev))
    for step in ("register", "grant"):
        params = {**base, "concurrency": args.parties}
        out.append(record(f"{root}.{step}.p50_ms", m[step]["p50"], "ms", params=params))
    return out


def write_markdown(info: dict, results: list[dict], notes: list[str]) -> None:
    lines = [
        f"Measured {info['date']} on {info['cpu']} ({info['cores']} cores), commit {info['commit']}; "
        f"controller process and load-generator process share the cores; anchor {ANCHOR} "
        "(and, for the developer's calls, GET /v1/health between them), same run.",
        "",
        *results_table(results, value=",.4g", anchor=",.4g", ratio=".3g"),
    ]
    lines.extend(["", *[f"- {note}" for note in notes]])
    write_markdown_block("controller_bench", "Controller API under load (latest run)", lines)


def postgres_server():
    """A throw-away PostgreSQL cluster from tests/postgres.py, or (None, why not)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    try:
        from postgres import start_postgres
    except ImportError as error:
        return None, f"tests/postgres.py not importable ({error})"
    try:
        return start_postgres(), ""
    except Exception as error:  # noqa: BLE001 - not installed, or it failed to start: skip, say why
        return None, f"{type(error).__name__}: {str(error)[:300]}"


def measure(store: str, database: str, args, workdir: Path, certs: Path) -> dict:
    """Start a controller on ``database``, run every phase against it, stop it."""
    started = time.perf_counter()
    process, port = start_controller(workdir, certs, database)
    try:
        print(
            f"[{store}] controller pid {process.pid} on port {port}; {args.parties} parties + aggregator, "
            f"closed loop, {args.seconds:g} s per phase; anchor: {ANCHOR}",
            flush=True,
        )
        measured = asyncio.run(run(args, f"https://127.0.0.1:{port}", certs, CpuClock(process.pid)))
        if process.poll() is not None:
            raise Failed("controller exited")
        print(f"[{store}] done in {time.perf_counter() - started:.0f} s", flush=True)
        return measured
    except BaseException:
        print((workdir / "controller.log").read_text(errors="replace")[-3000:], file=sys.stderr)
        raise
    finally:
        stop_controller(process)


def notes_of(store: str, m: dict, args) -> list[str]:
    return [
        f"{store}: {args.parties} parties + 1 aggregator in a closed loop (one request outstanding each); "
        f"{m['sessions_per_party']:.2f} sessions per party and {m['aggregator_sessions']} for the aggregator in "
        f"the live-session phase (parties' command then: {', '.join(m['party_commands'])})",
        f"{store}: controller CPU per request: health {m['health']['server_cpu_ms']:.2f} ms, sync "
        f"{m['sync']['server_cpu_ms']:.2f} ms, sync with sessions {m['sync_sessions']['server_cpu_ms']:.2f} ms; "
        f"busy {100 * m['health']['server_cpu_share']:.0f}% / {100 * m['sync']['server_cpu_share']:.0f}% / "
        f"{100 * m['sync_sessions']['server_cpu_share']:.0f}% of one core in these phases; load generator "
        f"{m['sync']['client_cpu_ms']:.2f} ms CPU per sync",
    ]


# ---------------------------------------------------------------------------------------------- capacity

CAPACITY_ANCHOR = "GET /v1/health from the same agents at the same pace, same run"


class RawAgent:
    """One agent's mutual-TLS connection speaking bare HTTP/1.1 (a light load generator)."""

    def __init__(self, name: str, context: ssl.SSLContext) -> None:
        self.name = name
        self.context = context
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self, port: int) -> None:
        self.port = port
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port, ssl=self.context)

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[float, bytes]:
        head = f"{method} {path} HTTP/1.1\r\nhost: controller\r\ncontent-length: {len(body)}\r\n"
        if body:
            head += "content-type: application/json\r\n"
        start = time.perf_counter()
        try:
            self.writer.write(head.encode() + b"\r\n" + body)
            status_and_headers = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            # The controller closed a connection idle past its keep-alive (as an agent's client
            # does, connect again; the handshake counts in this request's latency).
            await self.close()
            await self.connect(self.port)
            self.writer.write(head.encode() + b"\r\n" + body)
            status_and_headers = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in status_and_headers.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == b"content-length":
                length = int(value)
        answer = await self.reader.readexactly(length)
        elapsed = time.perf_counter() - start
        if not status_and_headers.startswith(b"HTTP/1.1 200"):
            raise Failed(f"{self.name} {method} {path}: {status_and_headers[:40]!r} {answer[:300]!r}")
        return elapsed, answer

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()


SYNC_BODY = json.dumps({"reports": []}).encode()


def group_cpu(group: int) -> float:
    """CPU seconds of every process in process group ``group`` (the controller and its workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def postgres_cpu(server) -> float:
    """CPU seconds of the PostgreSQL server's processes (postmaster and its children)."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        postmaster = int((server.data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid = int(stat.parent.name)
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            continue
        if pid == postmaster:  # its own time and that of its children that ended (connections)
            total += sum(int(v) for v in fields[11:15]) / tick
        elif int(fields[1]) == postmaster:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def paced(agents: list[RawAgent], method: str, path: str, body: bytes, seconds: float, interval: float) -> dict:
    """Every agent sends one request every ``interval`` (staggered start; a late answer delays the next)."""
    latencies: list[float] = []
    offered = 0
    end = time.perf_counter() + seconds
    rng = random.Random(3)

    async def loop(agent: RawAgent) -> None:
        nonlocal offered
        next_at = time.perf_counter() + rng.uniform(0, interval)
        while True:
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            if time.perf_counter() >= end:
                return
            offered += 1
            elapsed, _ = await agent.request(method, path, body)
            if time.perf_counter() <= end:
                latencies.append(elapsed)
            next_at += interval

    await asyncio.gather(*(loop(a) for a in agents))
    return {**summary(latencies), "offered": offered, "answered": len(latencies)}


async def capacity_run(args, port: int, certs: Path, group: int, server) -> dict:
    steps = sorted(int(n) for n in args.agents.split(","))
    names = [f"agent-{i:04d}" for i in range(max(steps))]
    ca = str(certs / CA_CERT_FILE)
    agents = []
    for name in names:
        context = ssl.create_default_context(cafile=ca)
        context.load_cert_chain(str(certs / f"{name}.crt"), str(certs / f"{name}.key"))
        agents.append(RawAgent(name, context))
    out: dict = {"steps": []}
    try:
        for start in range(0, len(agents), 100):  # handshakes and registrations in batches
            batch = agents[start : start + 100]
            await asyncio.gather(*(a.connect(port) for a in batch))
            body = json.dumps({"address": None, "datasets": []}).encode()
            await asyncio.gather(*(a.request("POST", "/v1/register", body) for a in batch))
        for agent in agents[:20]:
            await agent.request("POST", "/v1/agent/sync", SYNC_BODY)
        idle = [(await agents[0].request("GET", "/v1/health"))[0] for _ in range(args.idle_requests)]
        out["idle_health"] = summary(idle)
        idle = [(await agents[0].request("POST", "/v1/agent/sync", SYNC_BODY))[0] for _ in range(args.idle_requests)]
        out["idle_sync"] = summary(idle)

        async def measured(count: int, method: str, path: str, body: bytes) -> dict:
            wall, server_cpu, pg_cpu, own = (
                time.perf_counter(),
                group_cpu(group),
                postgres_cpu(server),
                time.process_time(),
            )
            phase = await paced(agents[:count], method, path, body, args.capacity_seconds, args.heartbeat)
            wall = time.perf_counter() - wall
            phase["agents"] = count
            phase["rps"] = phase["answered"] / args.capacity_seconds
            phase["offered_rps"] = count / args.heartbeat
            answered = max(phase["answered"], 1)
            phase["server_cpu_ms"] = 1000 * (group_cpu(group) - server_cpu) / answered
            phase["postgres_cpu_ms"] = 1000 * (postgres_cpu(server) - pg_cpu) / answered
            phase["client_cpu_ms"] = 1000 * (time.process_time() - own) / answered
            phase["server_cpu_share"] = (group_cpu(group) - server_cpu) / wall
            phase["held"] = phase["answered"] >= 0.95 * phase["offered"] and phase["p99"] < 1000 * args.heartbeat
            return phase

        out["health"] = await measured(max(steps), "GET", "/v1/health", b"")
        print(f"  health, {max(steps)} agents every {args.heartbeat:g} s: {fmt_capacity(out['health'])}", flush=True)
        for count in steps:
            phase = await measured(count, "POST", "/v1/agent/sync", SYNC_BODY)
            out["steps"].append(phase)
            print(f"  sync, {count} agents every {args.heartbeat:g} s: {fmt_capacity(phase)}", flush=True)
    finally:
        await asyncio.gather(*(a.close() for a in agents), return_exceptions=True)
    return out


def fmt_capacity(s: dict) -> str:
    return (
        f"{s['answered']:,}/{s['offered']:,} answered, p50 {s['p50']:.1f} ms, p95 {s['p95']:.1f} ms, "
        f"p99 {s['p99']:.1f} ms, max {s['max']:.1f} ms; controller CPU {s['server_cpu_ms']:.2f} ms/req "
        f"({100 * s['server_cpu_share']:.0f}% of a core), PostgreSQL {s['postgres_cpu_ms']:.2f} ms/req, "
        f"load generator {s['client_cpu_ms']:.2f} ms/req; {'held' if s['held'] else 'NOT held'}"
    )


def capacity(args, workdir: Path) -> tuple[list[dict], list[str]]:
    """The capacity run: records and notes."""
    steps = sorted(int(n) for n in args.agents.split(","))
    certs = workdir / "certs"
    started = time.perf_counter()
    names = [f"agent-{i:04d}" for i in range(max(steps))]
    init_federation(certs, parties=names, services=["controller"], developers=[])
    print(f"federation of {len(names) + 1} identities (ECDSA P-256) in {time.perf_counter() - started:.1f} s")
    server, why = postgres_server()
    if server is None:
        raise Failed(f"the capacity run needs PostgreSQL: {why}")
    try:
        process, port = start_controller(workdir, certs, server.create_database("bench"), workers=args.workers)
        try:
            print(
                f"[capacity] controller pid {process.pid}, {args.workers} worker(s), port {port}; agents "
                f"{', '.join(map(str, steps))} every {args.heartbeat:g} s, {args.capacity_seconds:g} s each; "
                "load generator, controller and PostgreSQL share the machine's cores",
                flush=True,
            )
            measured = asyncio.run(capacity_run(args, port, certs, process.pid, server))
            if process.poll() is not None:
                raise Failed("controller exited")
        except BaseException:
            print((workdir / "controller.log").read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            stop_controller(process)
    finally:
        server.stop()
    return capacity_records(measured, args)


def capacity_records(m: dict, args) -> tuple[list[dict], list[str]]:
    base = {
        "workers": args.workers,
        "interval_s": args.heartbeat,
        "seconds": args.capacity_seconds,
        "store": STORES["postgres"][1],
        "transport": "HTTPS/1.1, mutual TLS (ECDSA P-256), one connection per agent, loopback",
        "sessions": 0,
        "load_generator": "one asyncio process, bare HTTP/1.1, on the same 2 cores",
    }
    health = m["health"]
    out = []
    idle = {**base, "concurrency": 1, "requests": args.idle_requests}
    out.append(record("controller.capacity.health.idle.p50_ms", m["idle_health"]["p50"], "ms", params=idle))
    out.append(
        record(
            "controller.capacity.sync.idle.p50_ms",
            m["idle_sync"]["p50"],
            "ms",
            "GET /v1/health, idle",
            m["idle_health"]["p50"],
            idle,
        )
    )
    anchor_params = {**base, "agents": health["agents"]}
    for q in ("p50", "p99"):
        out.append(record(f"controller.capacity.health.{q}_ms", health[q], "ms", params=anchor_params))
    out.append(
        record("controller.capacity.health.server_cpu_ms", health["server_cpu_ms"], "ms/req", params=anchor_params)
    )
    held = [s for s in m["steps"] if s["held"]]
    best = max(held, key=lambda s: s["agents"]) if held else None
    largest = max(m["steps"], key=lambda s: s["agents"])
    cpu_step = best or largest
    params = {**base, "agents": cpu_step["agents"]}
    out.append(
        record(
            "controller.sync.server_cpu_ms",
            cpu_step["server_cpu_ms"],
            "ms/req",
            CAPACITY_ANCHOR,
            health["server_cpu_ms"],
            params,
        )
    )
    out.append(record("controller.sync.postgres_cpu_ms", cpu_step["postgres_cpu_ms"], "ms/req", params=params))
    steps_params = {
        **base,
        "steps": [s["agents"] for s in m["steps"]],
        "held_if": "answered >= 95% offered, p99 < interval",
    }
    out.append(record("controller.agents_held", best["agents"] if best else 0, "agents", params=steps_params))
    for step in m["steps"]:
        n = step["agents"]
        params = {**base, "agents": n, "offered": step["offered"], "answered": step["answered"], "held": step["held"]}
        for q in ("p50", "p95", "p99"):
            out.append(record(f"controller.sync.{n}agents.{q}_ms", step[q], "ms", CAPACITY_ANCHOR, health[q], params))
        out.append(record(f"controller.sync.{n}agents.rps", step["rps"], "req/s", params=params))
    notes = [
        f"capacity: {args.workers} controller worker(s) on PostgreSQL; agents heartbeat every {args.heartbeat:g} s "
        f"with no sessions; the load generator, the controller and PostgreSQL share the machine's "
        f"{os.cpu_count()} cores",
        "capacity steps: "
        + "; ".join(
            f"{s['agents']} agents: {s['answered']:,}/{s['offered']:,} answered, p99 {s['p99']:.0f} ms, controller "
            f"{s['server_cpu_ms']:.2f} ms CPU/req ({100 * s['server_cpu_share']:.0f}% of a core), PostgreSQL "
            f"{s['postgres_cpu_ms']:.2f}, load generator {s['client_cpu_ms']:.2f} -> "
            f"{'held' if s['held'] else 'not held'}"
            for s in m["steps"]
        ),
    ]
    return out, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parties", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--job-parties", type=int, default=4, help="parties per job")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each closed-loop phase")
    parser.add_argument("--interval", type=float, default=0.0, help="pause between requests in the closed loops")
    parser.add_argument(
        "--heartbeat",
        type=float,
        default=1.0,
        help="agents' sync interval while jobs are submitted and in the paced phase",
    )
    parser.add_argument("--idle-requests", type=int, default=50)
    parser.add_argument("--columns", type=int, default=20, help="feature columns per dataset")
    parser.add_argument(
        "--stores",
        default="sqlite",
        help="comma-separated: sqlite, postgres (skipped with a note when tests/postgres.py cannot start one)",
    )
    parser.add_argument("--workdir", default=None, help="parent of the temp dir (SQLite file, certificates)")
    parser.add_argument("--capacity", action="store_true", help="run the capacity run only (controller_capacity.json)")
    parser.add_argument("--agents", default="250,500,750,1000", help="capacity steps: agents heartbeating at once")
    parser.add_argument("--capacity-seconds", type=float, default=15.0, help="length of each capacity step")
    parser.add_argument("--workers", type=int, default=2, help="controller worker processes in the capacity run")
    parser.add_argument("--no-write", action="store_true", help="print only (no results file, no docs block)")
    args = parser.parse_args()
    if args.job_parties < 2 or args.job_parties > args.parties:
        parser.error("--job-parties must be in [2, --parties]")
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if not stores or set(stores) - set(STORES):
        parser.error(f"--stores must name some of {sorted(STORES)}")

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up the controller and PostgreSQL
    info = machine()
    if args.capacity:
        workdir = Path(tempfile.mkdtemp(prefix="controller-capacity-", dir=args.workdir))
        try:
            results, notes = capacity(args, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        print()
        for line in results_table(results, value=",.4g", anchor=",.4g", ratio=".3g"):
            print(line)
        for note in notes:
            print("note:", note)
        if not args.no_write:
            info["anchors"] = {"controller_capacity": CAPACITY_ANCHOR}
            print(f"wrote {write('controller_capacity', info, results)}")
            lines = [
                f"Measured {info['date']} on {info['cpu']} ({info['cores']} cores), commit {info['commit']}; the "
                f"controller ({args.workers} worker processes), PostgreSQL and the load generator share the cores; "
                f"anchor {CAPACITY_ANCHOR}.",
                "",
                *results_table(results, value=",.4g", anchor=",.4g", ratio=".3g"),
                "",
                *[f"- {note}" for note in notes],
            ]
            write_markdown_block("controller_capacity", "Controller capacity (latest run)", lines, "controller_bench")
        return
    results: list[dict] = []
    notes: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="controller-bench-", dir=args.workdir))
    try:
        certs = workdir / "certs"
        names = [f"party-{i:03d}" for i in range(args.parties)]
        started = time.perf_counter()
        init_federation(certs, parties=names, services=["controller", "aggregator"], developers=["dev"])
        print(f"federation of {len(names) + 3} identities (ECDSA P-256) in {time.perf_counter() - started:.1f} s")
        for store in stores:
            if store == "sqlite":
                commit_ms = sqlite_commit_ms(workdir)
                print(f"[sqlite] one-row commit (WAL, synchronous=FULL) in {workdir}: {commit_ms:.2f} ms median")
                measured = measure(store, f"sqlite:///{workdir / 'controller.db'}", args, workdir, certs)
                results.append(
                    record(
                        "controller.sqlite.commit_ms",
                        commit_ms,
                        "ms",
                        params={"what": "one-row UPDATE + COMMIT, WAL + synchronous=FULL, same directory, idle"},
                    )
                )
            else:
                server, why = postgres_server()
                if server is None:
                    print(f"[postgres] skipped: {why}")
                    notes.append(f"postgres: not measured ({why})")
                    continue
                try:
                    measured = measure(store, server.create_database("bench"), args, workdir, certs)
                finally:
                    server.stop()
            results.extend(records(measured, args, store))
            notes.extend(notes_of(store, measured, args))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print()
    for line in results_table(results, value=",.4g", anchor=",.4g", ratio=".3g"):
        print(line)
    for note in notes:
        print("note:", note)
    if args.no_write:
        return
    info["anchors"] = {"controller": ANCHOR}
    path = write("controller", info, results)
    print(f"wrote {path}")
    write_markdown(info, results, notes)


if __name__ == "__main__":
    main()
