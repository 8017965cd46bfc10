"""A local federation from one command: an aggregator and every party as separate OS processes.

:func:`run_local` makes the federation's certificates (once per work directory), starts the
aggregator on a free loopback port and one ``confide party`` process per party, shows one
progress bar tick per completed round, and assembles the job report from the parties' own
reports: per-round loss and AUC, bytes on the wire, time and crypto time, the protection that
actually ran and what the aggregator could see; then a loss/AUC plot. Processes talk only
through gRPC with mutual TLS, as they would across sites.

The launcher supervises what it started (every 0.2 s): a child that dies without having said
why (SIGKILL, a segfault, the OOM killer) is named at once with how it died and the round the
job was at, and started again, up to ``max_restarts`` times each. The aggregator comes back on
its port with its stored rounds and the parties reconnect; a cluster node (``--nodes``) comes
back on its port and the parties re-admit it at a round boundary (meanwhile the next live node
serves its share); a party comes back with ``--rejoin``
and its peers admit it at the next round boundary (:mod:`confide.party.rejoin`). A party that
failed and said why in its report is a dropout, not restarted. ``resume=True`` (``confide run
--resume``) goes on with a stopped job from the last round every party checkpointed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from confide import metrics
from confide.errors import ConfideError, JobFailedError, ServerStartError
from confide.local.cluster import Cluster
from confide.local.processes import Processes
from confide.party.data import embedded_classes, embedded_federation
from confide.reports import JobReport, JobRound
from confide.spec import JobSpec
from confide.transport.certs import init_federation

__all__ = ["LocalFederation", "run_local"]

CERTS = "certs"


@dataclass
class LocalFederation:
    """Processes of a running local federation."""

    spec: JobSpec
    workdir: Path
    aggregator: subprocess.Popen | None = None
    port: int = 0
    parties: dict[str, subprocess.Popen] = field(default_factory=dict)
    aggregator_args: list[str] = field(default_factory=list)
    cluster: Cluster | None = None
    #: Party -> its dataset catalog (YAML/JSON), for jobs that provision data as FL_Data.
    catalogs: dict[str, str] = field(default_factory=dict)
    #: Party -> its compute engine for partitioned data (``confide party --compute``).
    compute: dict[str, str] = field(default_factory=dict)
    #: Party -> environment variables added to its process (kept for its restarts).
    party_env: dict[str, dict[str, str]] = field(default_factory=dict)
    #: The job's id at the aggregator (a resumed run gets its own).
    runtime_job_id: str | None = None
    #: ``--resume-round`` given to every party at its first start.
    resume_round: int = 0
    #: Restarts allowed per process (0: a dead child is a dropout, or fails the job).
    max_restarts: int = 3
    #: Every restart: {"process", "pid", "how", "round", "restart"}.
    restarts: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.children = Processes(self.workdir / "logs")
        self._handled: set[int] = set()
        #: Restarted parties not yet admitted back -> how many rejoins their report showed before.
        self._rejoining: dict[str, int] = {}
        #: Restarted parties the job ended without (it finished before a peer admitted them).
        self.never_admitted: dict[str, str] = {}

    @property
    def target(self) -> str:
        """What parties dial: the aggregator, or every node of the cluster."""
        return self.cluster.target if self.cluster is not None else f"127.0.0.1:{self.port}"

    def start_cluster(self, nodes: int) -> list[str]:
        """Start an aggregator cluster of ``nodes`` processes instead of one aggregator."""
        transport = self.spec.transport
        self.cluster = Cluster(
            nodes,
            self.certs,
            self.workdir / "aggregator-state",
            extra_args=[
                "--round-timeout",
                str(transport.round_timeout_s),
                "--dropout-grace",
                str(transport.dropout_grace_s),
                *self.aggregator_args,
            ],
        )
        return self.cluster.start()

    @property
    def certs(self) -> Path:
        """The federation's certificate directory."""
        return self.workdir / CERTS

    def prepare(self) -> None:
        """Certificates (kept if present), the resolved job file, and nothing left of an earlier run.

        A job id names one run: the aggregator's stored rounds and the parties' checkpoints of a
        previous run in the same work directory are removed, or the new run would meet them.
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        for stale in ("aggregator-state", "parties", "logs"):
            shutil.rmtree(self.workdir / stale, ignore_errors=True)
        for stale in ("report.json", "report.png", "aggregator.port"):
            (self.workdir / stale).unlink(missing_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        if not (self.certs / "ca.crt").exists():
            init_federation(self.certs, parties=self.spec.parties, services=["aggregator"], admins=["runner"])
        (self.workdir / "job.json").write_text(self.spec.model_dump_json(indent=1))

    def start_aggregator(self, port: int = 0) -> int:
        """Start (or restart, on the same port) the aggregator process; returns its port."""
        port_file = self.workdir / "aggregator.port"
        port_file.unlink(missing_ok=True)
        transport = self.spec.transport
        self.aggregator = self.children.spawn(
            "aggregator",
            [
                "aggregator",
                "--listen",
                f"127.0.0.1:{port}",
                "--certs",
                str(self.certs),
                "--state",
                str(self.workdir / "aggregator-state"),
                "--port-file",
                str(port_file),
                "--round-timeout",
                str(transport.round_timeout_s),
                "--dropout-grace",
                str(transport.dropout_grace_s),
                *self.aggregator_args,
            ],
        )
        try:
            self.port = self.children.wait_port("aggregator", port_file, 60)
        except ServerStartError as error:  # it exited while starting: a restart may try again
            raise ServerStartError(f"the aggregator did not start: {error}") from None
        except ConfideError as error:
            raise JobFailedError(f"the aggregator did not start: {error}") from None
        return self.port

    def thread_env(self) -> dict[str, str]:
        """The machine's cores shared among the parties it runs: ``OMP_NUM_THREADS`` for each.

        Every party process of a local federation shares one machine. PyTorch (and OpenMP BLAS)
        would each start a thread per core, and OpenMP threads spin while they wait: with more
        threads than cores a tiny transformer's round took 5-8 s instead of 0.3 s (2 parties on
        2 cores). A variable the caller set wins.
        """
        if "OMP_NUM_THREADS" in os.environ:
            return {}
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return {"OMP_NUM_THREADS": str(max(1, cores // max(1, len(self.spec.parties))))}

    def start_party(self, party: str, env: dict[str, str] | None = None, *, rejoin: bool = False) -> subprocess.Popen:
        """Start one party process (``env`` adds environment variables, e.g. fault injection).

        ``rejoin``: it replaces a process of this party that died mid-job.
        """
        env = {**self.thread_env(), **(env if env is not None else self.party_env.get(party) or {})}
        command = [
            "party",
            "--job",
            str(self.workdir / "job.json"),
            "--party",
            party,
            "--aggregator",
            self.target,
            "--certs",
            str(self.certs),
            "--workdir",
            str(self.workdir / "parties"),
        ]
        if party in self.catalogs:
            command += ["--datasets", str(Path(self.catalogs[party]).resolve())]
        if party in self.compute:
            command += ["--compute", self.compute[party]]
        if self.runtime_job_id:
            command += ["--runtime-job-id", self.runtime_job_id]
        if rejoin:
            command.append("--rejoin")
        elif self.resume_round:
            command += ["--resume-round", str(self.resume_round)]
        self.parties[party] = self.children.spawn(party, command, env)
        return self.parties[party]

    def resume_point(self) -> tuple[int, dict[str, dict]]:
        """The last round every party checkpointed, and the parties' reports of the stopped run.

        Raises :class:`JobFailedError` when there is nothing to go on from.
        """
        from confide.checkpoints import round_name

        rounds = None
        for party in self.spec.parties:
            directory = self.workdir / "parties" / f"{party}.checkpoints"
            held = {n for n in range(1, self.spec.rounds + 1) if (directory / round_name(n) / "state.json").exists()}
            rounds = held if rounds is None else rounds & held
        if not rounds:
            raise JobFailedError(
                f"cannot resume in {self.workdir}: no round is checkpointed by every party "
                f"(checkpoint_interval is {self.spec.checkpoint_interval}); run the job again from the start"
            )
        earlier = {p: self.report_of(p) or {"rounds": []} for p in self.spec.parties}
        if max(rounds) >= self.spec.rounds:
            raise JobFailedError(
                f"the job in {self.workdir} has run all its {self.spec.rounds} rounds: nothing to resume"
            )
        for party in self.spec.parties:
            # Out of the way: a stopped run's "stopped" must not read as the new process's word.
            report = self.workdir / "parties" / f"{party}.report.json"
            if report.exists():
                report.replace(report.with_name(f"{party}.report.before-resume.json"))
        return max(rounds), earlier

    def supervise(self, echo, reports: dict[str, dict | None]) -> None:
        """Name every child that died without saying why, and start it again (within its budget).

        ``reports``: each party's report as read this tick (the launcher reads them once a tick).
        """
        at = max((_last_round(r) for r in reports.values()), default=0) + 1
        aggregator = self.aggregator
        if aggregator is not None and aggregator.poll() is not None and aggregator.pid not in self._handled:
            if any(p.poll() is None for p in self.parties.values()):
                self._handled.add(aggregator.pid)
                self._restart("aggregator", aggregator, at, echo, lambda: self.start_aggregator(self.port))
        if self.cluster is not None and any(p.poll() is None for p in self.parties.values()):
            for node, process in self.cluster.processes().items():
                if process.poll() is not None and process.pid not in self._handled:
                    self._handled.add(process.pid)
                    self._restart(f"node-{node}", process, at, echo, lambda node=node: self.cluster.restart(node))
        for party, process in list(self.parties.items()):
            code = process.poll()
            if code in (None, 0) or process.pid in self._handled:
                continue
            report = reports.get(party) or {}
            if report.get("status") in ("failed", "stopped", "completed") or not report.get("rounds"):
                continue  # it said why (a dropout), or it never ran a round (the job fails fast)
            if all(p.poll() is not None for n, p in self.parties.items() if n != party):
                continue  # nobody left to rejoin
            self._handled.add(process.pid)
            if self._restart(party, process, at, echo, lambda party=party: self.start_party(party, rejoin=True)):
                self._rejoining[party] = len(report.get("rejoins") or [])
        for party, before in list(self._rejoining.items()):
            if len((reports.get(party) or {}).get("rejoins") or []) > before:
                del self._rejoining[party]  # admitted back
        if self._rejoining and all(p.poll() is not None for n, p in self.parties.items() if n not in self._rejoining):
            # Everyone else is done: nobody is left to admit the restarted parties.
            waiting = sorted(self._rejoining)
            self.children.stop(waiting)
            for party in waiting:
                self.never_admitted[party] = (
                    f"crashed at round {at}; restarted, but the job ended before a peer admitted it back"
                )
                del self._rejoining[party]

    def _restart(self, name: str, process: subprocess.Popen, at: int, echo, start) -> bool:
        """Start ``name`` again if its budget allows (True); a party past it is a dropout."""
        how = _how_it_ended(process.returncode)
        used = sum(1 for r in self.restarts if r["process"] == name)
        where = f"at round {at} of {self.spec.rounds}"
        if used >= self.max_restarts:
            if name != "aggregator":
                others = (
                    "the other nodes serve its share" if name.startswith("node-") else "the others go on without it"
                )
                budget = f"not restarted (max_restarts {self.max_restarts})"
                echo(f"{name} (pid {process.pid}) {how} {where}; {budget}: {others}")
                return False
            raise JobFailedError(
                f"{name} (pid {process.pid}) {how} {where}; it was restarted {used} time(s) already "
                f"(max_restarts {self.max_restarts}):\n{self._tail(name)}"
            )
        echo(f"{name} (pid {process.pid}) {how} {where}: restarting it ({used + 1}/{self.max_restarts})")
        metrics.RESTARTS.labels("node" if name.startswith("node-") else name if name == "aggregator" else "party").inc()
        started = time.perf_counter()
        try:
            start()
        except ServerStartError as error:
            # It died again while starting (killed once more, as the soak does, or a crash at start):
            # the next tick finds the new process dead and restarts it, within the budget.
            echo(f"{name} exited while starting ({str(error).splitlines()[0]}); it will be restarted again")
        self.restarts.append(
            {
                "process": name,
                "pid": process.pid,
                "how": how,
                "round": at,
                "restart": used + 1,
                "seconds_to_restart": round(time.perf_counter() - started, 3),
            }
        )
        return True

    def report_of(self, party: str) -> dict | None:
        """A party's latest report, if it has written one."""
        path = self.workdir / "parties" / f"{party}.report.json"
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def stop(self) -> None:
        """Terminate whatever still runs."""
        self.children.stop()
        if self.cluster is not None:
            self.cluster.stop()

    def _tail(self, name: str, lines: int = 15) -> str:
        return self.children.tail(name, lines)


def _how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code} without a report of why"


def _last_round(report: dict | None) -> int:
    rounds = (report or {}).get("rounds") or []
    return rounds[-1]["round"] if rounds else 0


def _entry(report: dict, number: int) -> dict | None:
    for entry in reversed(report.get("rounds") or []):
        if entry["round"] == number:
            return entry
    return None


def _checked_against_catalogs(spec: JobSpec, catalogs: dict[str, str]) -> JobSpec:
    """What the controller does at submit, from the catalogs' published metadata.

    Encodings get their categories agreed; a pipeline that does not fit a party's schema is
    refused before any process starts.
    """
    from confide.data.catalog import Catalog
    from confide.data.schemas import agree_categories, check_schemas
    from confide.spec import parse_job

    fl_data = spec.fl_data_object()
    schemas = {}
    for party, dataset in fl_data.datasets().items():
        published = {d["name"]: d for d in Catalog.load(catalogs[party]).metadata()}
        if dataset not in published:
            raise JobFailedError(f"party {party}'s catalog has no dataset {dataset!r}; it has {sorted(published)}")
        schemas[party] = published[dataset]["schema"]
    agreed = agree_categories(fl_data, schemas)
    problems = check_schemas(agreed, schemas, vertical=spec.vertical_layout())
    if problems:
        raise JobFailedError(
            "fl_data does not fit the parties' datasets:\n  " + "\n  ".join(p.text() for p in problems[:20])
        )
    if agreed.version == fl_data.version:
        return spec
    return parse_job({**spec.model_dump(mode="json"), "fl_data": agreed.to_dict()})


def run_local(
    spec: JobSpec,
    workdir: str | os.PathLike,
    *,
    progress: bool = True,
    echo=print,
    party_env: dict[str, dict[str, str]] | None = None,
    nodes: int = 1,
    catalogs: dict[str, str] | None = None,
    compute: dict[str, str] | None = None,
    max_restarts: int = 3,
    resume: bool = False,
    baseline: bool = True,
    aggregator_args: list[str] | None = None,
) -> dict:
    """Run ``spec`` on a local federation in ``workdir``; returns the job report.

    ``party_env`` adds environment variables per party (fault injection in tests); ``nodes`` > 1
    runs an aggregator cluster of that many processes instead of one aggregator. ``catalogs``
    gives each party its dataset catalog for jobs whose ``fl_data`` names catalog datasets;
    ``compute`` a party's engine for a partitioned dataset (``inline``, ``ray``, ``ray:ADDRESS``).
    ``max_restarts``: how often each crashed child is started again (0: never). ``resume``: go on
    with the job stopped in ``workdir`` from the last round every party checkpointed. ``baseline``:
    also train the centralized baseline the report shows beside the federated model (embedded
    data only; off, the report's ``centralized`` is empty). ``aggregator_args``: more options for
    ``confide aggregator`` (``--mailbox-memory-mb 64``).
    """
    if spec.fl_data is not None:
        missing = [p for p in spec.parties if p not in (catalogs or {})]
        if missing:
            raise JobFailedError(
                f"the job provisions data as FL_Data; give each party its catalog (--catalog PARTY=PATH): "
                f"missing for {missing}"
            )
        spec = _checked_against_catalogs(spec, catalogs)
    unknown = sorted(set(compute or {}) - set(spec.parties))
    if unknown:
        raise JobFailedError(f"--compute names {unknown}, which are not parties of the job {spec.parties}")
    federation = LocalFederation(
        spec,
        Path(workdir),
        catalogs=dict(catalogs or {}),
        compute=dict(compute or {}),
        party_env=dict(party_env or {}),
        max_restarts=0 if spec.vertical else max_restarts,
        aggregator_args=list(aggregator_args or []),
    )
    earlier: dict[str, dict] = {}
    if resume:
        if spec.vertical:
            raise JobFailedError("--resume goes on with horizontal jobs; a vertical job runs again from the start")
        federation.resume_round, earlier = federation.resume_point()
        federation.runtime_job_id = f"{spec.job_id}.resume-{federation.resume_round}-{time.time_ns()}"
        echo(f"resuming after round {federation.resume_round} (the last round every party checkpointed)")
    else:
        federation.prepare()
    started = time.perf_counter()
    try:
        if nodes > 1:
            federation.start_cluster(nodes)
        else:
            federation.start_aggregator()
        for party in spec.parties:
            federation.start_party(party)
        if spec.vertical:
            _follow_vertical(federation, echo)
        else:
            _follow(federation, progress, echo)
    finally:
        federation.stop()
    if spec.vertical:
        return _vertical_report(federation, time.perf_counter() - started)
    reports = {p: federation.report_of(p) or {"status": "failed", "rounds": []} for p in spec.parties}
    for party, before in earlier.items():
        kept = [r for r in before.get("rounds") or [] if r["round"] <= federation.resume_round]
        reports[party] = {**reports[party], "rounds": kept + list(reports[party].get("rounds") or [])}
    completed = [r for r in reports.values() if r.get("status") == "completed"]
    final = set(completed[0]["rounds"][-1]["participants"]) if completed else set()
    failed = [p for p, proc in federation.parties.items() if proc.returncode != 0]
    if not completed or final & set(failed):
        reasons = [f"{p}: {reports[p].get('error') or federation._tail(p)}" for p in failed]
        raise JobFailedError("job failed:\n  " + "\n  ".join(reasons or ["no party completed"]))
    dropped = {p: reports[p].get("error") or f"exited with status {federation.parties[p].returncode}" for p in failed}
    dropped.update(federation.never_admitted)
    report = build_report(spec, reports, time.perf_counter() - started, dropped, baseline=baseline)
    report["restarts"] = federation.restarts
    report["resumed_after_round"] = federation.resume_round
    paths = write_report(report, Path(workdir))
    report["files"] = {k: str(v) for k, v in paths.items()}
    return report


def _follow(federation: LocalFederation, progress: bool, echo) -> None:
    from tqdm import tqdm

    spec = federation.spec
    # The bar only where someone watches a terminal; logs and pipes get the round lines alone.
    progress = progress and sys.stderr.isatty()
    bar = tqdm(total=spec.rounds, desc=f"{spec.job_id} [{spec.protection.mode}]", unit="round", disable=not progress)
    shown = federation.resume_round
    bar.update(shown)
    try:
        while True:
            by_party = {p: federation.report_of(p) for p in spec.parties}  # read once per tick
            federation.supervise(lambda line: bar.write(line) if progress else echo(line), by_party)
            alive = [p for p in federation.parties.values() if p.poll() is None]
            # Parties still in the job: a dead one (until it rejoins) and a dropout do not hold the line back.
            running = [
                r
                for p, r in by_party.items()
                if r and r.get("status") != "failed" and (federation.parties[p].poll() in (None, 0))
            ]
            done = [_last_round(r) for r in running]
            # A live party that has not written its report yet has finished no round: wait for it,
            # or the line would count only the parties that happened to write first.
            silent = [p for p, r in by_party.items() if r is None and federation.parties[p].poll() is None]
            finished = min(done) if done and not silent else 0
            _fail_fast(federation, by_party)
            while shown < finished:
                shown += 1
                line = _round_line(spec, shown, running)
                bar.write(line) if progress else echo(line)
                bar.update(1)
            if not alive:
                return
            time.sleep(0.2)
    finally:
        bar.close()


def _fail_fast(federation: LocalFederation, reports: dict[str, dict | None]) -> None:
    """Fail the job now where waiting cannot save it.

    - A party that failed before its first round (bad model, missing framework): its peers would
      otherwise wait out the set-up timeout for it.
    - Parties that failed for good later (they said why in their report, so they are not started
      again) leaving fewer than ``protection.min_parties`` that can still take part, or any with
      ``on_dropout: fail``: the others would wait out the round timeout and fail anyway. With
      enough left, a failed party is a dropout, which the others survive (``on_dropout``).
    """
    failed: dict[str, str] = {}
    for name, process in federation.parties.items():
        if process.poll() in (None, 0):
            continue
        report = reports.get(name) or {}
        if not report.get("rounds"):
            raise JobFailedError(
                f"job failed before round 1:\n  {name}: {report.get('error') or federation._tail(name)}"
            )
        if report.get("status") == "failed":
            failed[name] = report.get("error") or federation._tail(name)
    if not failed:
        return
    protection = federation.spec.protection
    left = len(federation.parties) - len(failed)
    reasons = "\n  ".join(f"{name}: {reason}" for name, reason in sorted(failed.items()))
    if left < protection.min_parties:
        raise JobFailedError(
            f"job failed: {left} parties left, protection.min_parties is {protection.min_parties}:\n  {reasons}"
        )
    if protection.on_dropout == "fail":
        raise JobFailedError(f"job failed: a party dropped out; on_dropout is 'fail':\n  {reasons}")


def _follow_vertical(federation: LocalFederation, echo) -> None:
    """Print the guest's progress (PSI, then one line per tree or epoch) until every party exits."""
    spec, shown, psi_shown = federation.spec, 0, False
    unit = "tree" if spec.model.algorithm == "secureboost" else "epoch"
    # Multi-class SecureBoost grows one tree per class per round.
    per_round = spec.model.num_class if unit == "tree" and spec.model.objective == "multi:softprob" else 1
    total = spec.rounds * (per_round or 1)
    while True:
        alive = [p for p in federation.parties.values() if p.poll() is None]
        guest = federation.report_of(spec.guest) or {}
        if not psi_shown and guest.get("psi"):
            psi = guest["psi"]
            echo(f"PSI: {guest.get('records')} guest records -> {psi['intersection']} common records")
            psi_shown = True
        for entry in guest.get("rounds", [])[shown:]:
            shown += 1
            extra = f"  loss {entry['loss']:.4f}" if entry.get("loss") is not None else ""
            extra += f"  splits {entry['splits']}" if "splits" in entry else ""
            if per_round and per_round > 1 and "class" in entry:
                extra = f"  round {shown // per_round + (shown % per_round > 0)} class {entry['class']}" + extra
            if entry.get("validation_loss") is not None:
                extra += f"  validation loss {entry['validation_loss']:.4f}"
            echo(f"{unit} {shown:>3}/{total}{extra}  {entry.get('seconds', 0.0):.2f} s")
        if not alive:
            return
        time.sleep(0.2)


def _scoring_summary(federation: LocalFederation, guest: dict) -> dict:
    """A scoring job's outcome: records scored, and the guest's scores file (scores stay in it)."""
    if guest.get("task") != "score":
        return {}
    scores = federation.workdir / "parties" / guest["scores"]
    return {"task": "score", "scored": guest.get("scored"), "scores": str(scores)}


def _vertical_report(federation: LocalFederation, wall_seconds: float) -> dict:
    spec = federation.spec
    reports = {p: federation.report_of(p) or {"status": "failed"} for p in spec.parties}
    failed = [p for p, r in reports.items() if r.get("status") != "completed"]
    if failed:
        reasons = [f"{p}: {reports[p].get('error') or federation._tail(p)}" for p in failed]
        raise JobFailedError("job failed:\n  " + "\n  ".join(reasons))
    guest = reports[spec.guest]
    report = {
        "job_id": spec.job_id,
        "algorithm": spec.model.algorithm,
        "mode": "paillier" if spec.score is None else "none (the prediction protocol of a scoring job)",
        **_scoring_summary(federation, guest),
        "guest": spec.guest,
        "hosts": [p for p in spec.parties if p != spec.guest],
        "psi": guest.get("psi"),
        "samples": guest.get("samples"),
        "test_samples": guest.get("test_samples"),
        "metrics": guest.get("metrics"),
        **{k: guest[k] for k in ("validation_loss", "best_round", "trees_kept") if guest.get(k) is not None},
        "rounds": guest.get("rounds"),
        "parties": {
            p: {
                "role": r.get("role"),
                "features": r.get("features"),
                "bytes": r.get("bytes"),
                "seconds": r.get("seconds"),
                **({"compute": r["compute"]} if r.get("compute") else {}),
                **({"paillier_engine": r["paillier_engine"]} if r.get("paillier_engine") else {}),
            }
            for p, r in reports.items()
        },
        "wall_seconds": wall_seconds,
        "spec": json.loads(spec.model_dump_json()),
    }
    path = federation.workdir / "report.json"
    path.write_text(json.dumps(report, indent=1))
    report["files"] = {"json": str(path)}
    return report


def _round_line(spec: JobSpec, number: int, reports: list[dict]) -> str:
    entries = [e for e in (_entry(r, number) for r in reports) if e is not None]
    loss = _weighted_loss(number, reports)
    sent = sum(e["bytes_sent"] for e in entries)
    shown = ""
    for name, label in (("auc", "AUC"), ("accuracy", "accuracy")):
        value = _round_metric(entries, name)
        shown += f"  {label} {value:.4f}" if value is not None else ""
    return (
        f"round {number:>3}/{spec.rounds}  loss {loss:.4f}{shown}  parties {len(entries[0]['participants'])}"
        f"  sent {_size(sent)}  {max(e['seconds'] for e in entries):.2f} s"
    )


def _weighted_loss(number: int, reports: list[dict]) -> float:
    """Sample-weighted mean of the parties' training losses in round ``number``."""
    pairs = [(r["samples"], e["train_loss"]) for r in reports if (e := _entry(r, number)) is not None]
    samples = np.array([p[0] for p in pairs], dtype=float)
    return float(np.dot(samples, [p[1] for p in pairs]) / samples.sum())


def _round_metric(entries: list[dict], name: str) -> float | None:
    """Mean over the parties of the global model's ``test_<name>`` (one shared test set: all equal)."""
    values = [e[f"test_{name}"] for e in entries if f"test_{name}" in e]
    return float(np.mean(values)) if values else None


def centralized_baseline(spec: JobSpec) -> dict:
    """The same model trained on the pooled data (what federation must match).

    Embedded data sets only (nobody can pool a real federation's rows). The model is built by
    the same registry as the parties', trained for ``rounds x local_epochs`` epochs; for
    ``homo_lr`` scikit-learn's LR is reported beside it. A network trains in a child process,
    like the parties: the launcher never loads a model framework (JAX, for one, forbids forking
    the process that loaded it).
    """
    if spec.data.dataset not in ("breast_cancer", "digits", "text") or spec.fl_data is not None or spec.vertical:
        return {}
    if spec.model.algorithm == "custom":
        return {}
    if spec.model.algorithm != "homo_lr":
        done = subprocess.run(
            [sys.executable, "-c", "from confide.local.federation import _baseline_child; _baseline_child()"],
            input=spec.model_dump_json(),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            tail = "\n".join(done.stderr.splitlines()[-5:])
            return {"error": f"the centralized baseline failed: {tail}"}
        return json.loads(done.stdout.splitlines()[-1])
    return _baseline(spec)


def _baseline_child() -> None:
    """Entry of the child process: the job spec on stdin, the baseline as the last line of stdout."""
    from confide.spec import parse_job

    print(json.dumps(_baseline(parse_job(json.loads(sys.stdin.read())))))


def _baseline(spec: JobSpec) -> dict:
    from confide.ml import FitConfig, build_model

    federation = embedded_federation(spec)
    X_test, y_test = federation.test
    X = np.concatenate([p[0] for p in federation.parts])
    y = np.concatenate([p[1] for p in federation.parts])
    # hf: the first party's copy of the pretrained model (model.hf.pretrained may name one per party).
    pooled = spec.parties[0] if spec.model.algorithm == "hf" else "pooled"
    model = build_model(spec.model, seed=spec.seed, party_id=pooled, network=spec.network())
    model.build(tuple(X.shape[1:]), embedded_classes(spec))
    epochs = spec.rounds * spec.model.local_epochs
    model.fit(X, y, FitConfig(round=1, seed=(spec.seed, 0), epochs=epochs))
    metrics = model.evaluate(X_test, y_test, ["auc", "accuracy"])
    out = {"algorithm": spec.model.algorithm, "epochs": epochs, **{f"pooled_{k}": v for k, v in metrics.items()}}
    if spec.model.algorithm == "homo_lr":
        from sklearn.linear_model import LogisticRegression
        from sklearn.metrics import roc_auc_score

        sklearn_model = LogisticRegression(max_iter=5000).fit(X, y)
        out["homo_lr_pooled_auc"] = metrics["auc"]
        out["sklearn_lr_pooled_auc"] = float(roc_auc_score(y_test, sklearn_model.decision_function(X_test)))
    return out


def build_report(
    spec: JobSpec, reports: dict[str, dict], wall_seconds: float, dropped: dict[str, str], *, baseline: bool = True
) -> dict:
    """The job report from the parties' reports (``dropped``: parties that left, and why)."""
    first = next(r for r in reports.values() if r.get("status") == "completed")
    rounds = []
    for number in range(1, spec.rounds + 1):
        entries = [e for e in (_entry(r, number) for r in reports.values()) if e is not None]
        rounds.append(
            {
                "round": number,
                "participants": entries[0]["participants"],
                "attempts": max(e["attempts"] for e in entries),
                "loss": _weighted_loss(number, list(reports.values())),
                "auc": _round_metric(entries, "auc"),
                "accuracy": _round_metric(entries, "accuracy"),
                "bytes_sent": sum(e["bytes_sent"] for e in entries),
                "bytes_received": sum(e["bytes_received"] for e in entries),
                "seconds": max(e["seconds"] for e in entries),
                "crypto_s": float(np.mean([e.get("crypto_s", 0.0) for e in entries])),
                "train_s": float(np.mean([e["train_s"] for e in entries])),
                "verify_s": float(np.mean([e.get("verify_s", 0.0) for e in entries])),
                "refused": _refused({p: _entry(r, number) for p, r in reports.items()}),
            }
        )
    protection = dict(first["protection"])
    if "privacy" in protection:
        # DP-SGD calibrates per party (its own row count): the job states the worst party's epsilon.
        per_party = {
            p: r["protection"]["privacy"] for p, r in reports.items() if (r.get("protection") or {}).get("privacy")
        }
        worst = max(per_party.values(), key=lambda v: v["epsilon_spent"])
        protection["privacy"] = {
            **worst,
            "per_party": {
                p: {"epsilon_spent": v["epsilon_spent"], "noise_multiplier": v["noise_multiplier"]}
                for p, v in per_party.items()
            },
        }
    report = JobReport(
        job_id=spec.job_id,
        mode=protection["mode"],
        mode_requested=spec.protection.mode,
        aggregator_saw=protection["aggregator_sees"],
        protection=protection,
        parties={
            p: {
                "samples": r.get("samples"),
                "status": r["status"],
                **({"compute": r["compute"]} if r.get("compute") else {}),
                **({"rejoins": r["rejoins"]} if r.get("rejoins") else {}),
            }
            for p, r in reports.items()
        },
        dropped=dropped,
        rounds=[JobRound(**r) for r in rounds],
        final_auc=rounds[-1]["auc"],
        final_accuracy=rounds[-1]["accuracy"],
        model=_model_summary(reports),
        strategy=first.get("strategy"),
        centralized=centralized_baseline(spec) if baseline else {},
        wall_seconds=wall_seconds,
        setup_seconds=max(r.get("setup_seconds", 0.0) for r in reports.values()),
        reconnects=sum(r.get("reconnects", 0) for r in reports.values()),
        spec=json.loads(spec.model_dump_json()),
    )
    return report.model_dump(mode="json")


def _refused(entries: dict[str, dict | None]) -> list[dict]:
    """The refused attempts of a round, once each, with the parties that refused them."""
    out: dict[tuple, dict] = {}
    for party, entry in entries.items():
        for refusal in ((entry or {}).get("stats") or {}).get("verification_refused", []):
            key = (refusal["attempt"], refusal["kind"], tuple(refusal["slices"]))
            out.setdefault(key, {**refusal, "parties": []})["parties"].append(party)
    return list(out.values())


def _model_summary(reports: dict[str, dict]) -> dict | None:
    """The parties' model summary; with Keras backends that differ, each party's is named."""
    models = {p: r.get("model") for p, r in reports.items() if r.get("model")}
    if not models:
        return None
    summary = dict(next(iter(models.values())))
    backends = {p: m.get("backend") for p, m in models.items()}
    if len(set(backends.values())) > 1:
        summary["backend"] = ", ".join(f"{p} {b}" for p, b in sorted(backends.items()))
    return summary


def write_report(report: dict, workdir: Path) -> dict[str, Path]:
    """report.json and report.png (loss and AUC per round)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = {"json": workdir / "report.json", "plot": workdir / "report.png"}
    paths["json"].write_text(json.dumps(report, indent=1))
    rounds = [r["round"] for r in report["rounds"]]
    figure, loss_axis = plt.subplots(figsize=(7, 4))
    loss_axis.plot(rounds, [r["loss"] for r in report["rounds"]], "o-", color="tab:blue", label="loss")
    loss_axis.set_xlabel("round")
    loss_axis.set_ylabel("training loss (weighted mean)", color="tab:blue")
    metric = "auc" if all(r.get("auc") is not None for r in report["rounds"]) else "accuracy"
    values = [r.get(metric) for r in report["rounds"]]
    if all(a is not None for a in values):
        auc_axis = loss_axis.twinx()
        auc_axis.plot(rounds, values, "s-", color="tab:red", label=metric)
        auc_axis.set_ylabel(f"test {metric}", color="tab:red")
        central = report["centralized"].get(f"pooled_{metric}")
        if central is not None:
            auc_axis.axhline(central, color="tab:red", linestyle=":", label="pooled")
    loss_axis.set_title(f"{report['job_id']}: {report['mode']} mode")
    figure.tight_layout()
    figure.savefig(paths["plot"], dpi=100)
    plt.close(figure)
    return paths


def _size(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} GB"
