"""``confide certs ... | aggregator | cluster | party | run`` and the controller commands (cli/controller.py).

``certs``: init, add, request, sign, revoke, rotate, crl.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import MutableMapping
from pathlib import Path

from confide.cli import container as container_commands
from confide.cli import controller as controller_commands
from confide.cli import model as model_commands
from confide.cli import stop as stop_commands
from confide.errors import ConfideError, InvalidParameterError

__all__ = ["main"]


class JsonLines(logging.Formatter):
    """One JSON object a line (``--log-format json``): time (UTC, ISO 8601), level, logger, message, pid."""

    def format(self, record: logging.LogRecord) -> str:
        import datetime
        import json

        entry = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="confide", description="Cross-silo federated learning.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=os.environ.get("CONFIDE_LOG_FORMAT") or "text",
        help="text lines, or one JSON object a line for a log shipper (default: $CONFIDE_LOG_FORMAT, else text)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    certs = commands.add_parser(
        "certs", help="the federation's PKI: a local federation, or per-site enrollment by signing request"
    )
    certs_commands = certs.add_subparsers(dest="certs_command", required=True)
    init = certs_commands.add_parser(
        "init", help="one directory with a CA and every identity (a local federation, tests, demos)"
    )
    init.add_argument("--dir", required=True, help="directory for ca.crt and <name>.crt/.key")
    init.add_argument("--parties", default="", help="comma-separated party names")
    init.add_argument("--services", default="controller,aggregator", help="comma-separated service names")
    init.add_argument(
        "--admins",
        default="runner",
        help="comma-separated admin names (runner: the admin a local deployment on one machine uses; "
        'a CA for separate machines: --services "" --admins "", every identity then enrolls by request)',
    )
    init.add_argument("--developers", default="", help="comma-separated developer names")
    init.add_argument("--hosts", default="localhost,127.0.0.1", help="names/IPs services answer on")
    init.add_argument("--days", type=int, default=365, help="validity of the CA and every certificate")
    init.add_argument("--force", action="store_true", help="replace an existing federation (every identity)")
    add = certs_commands.add_parser("add", help="issue one more identity from the CA directory (key made there)")
    add.add_argument("--dir", required=True, help="the federation's CA directory")
    add.add_argument("--name", required=True)
    add.add_argument("--role", required=True, choices=["party", "service", "admin", "developer"])
    add.add_argument("--hosts", default="localhost,127.0.0.1", help="names/IPs a service answers on")
    add.add_argument("--days", type=int, default=365)
    request = certs_commands.add_parser(
        "request", help="at a site: make its own key and a signing request (the key never leaves the site)"
    )
    request.add_argument("--dir", required=True, help="the site's certificate directory")
    request.add_argument("--name", required=True, help="the site's identity, e.g. hospital-d")
    request.add_argument("--role", default="party", choices=["party", "service", "admin", "developer"])
    request.add_argument("--hosts", default="localhost,127.0.0.1", help="names/IPs a service answers on")
    sign = certs_commands.add_parser(
        "sign", help="at the federation operator: check a site's signing request and sign it with the CA"
    )
    sign.add_argument("csr", help="the <name>.csr a site sent")
    sign.add_argument("--ca-dir", required=True, help="the federation's CA directory (ca.crt, ca.key)")
    sign.add_argument("--role", required=True, choices=["party", "service", "admin", "developer"])
    sign.add_argument("--out", required=True, help="directory for <name>.crt and a copy of ca.crt, sent back")
    sign.add_argument("--days", type=int, default=365)
    sign.add_argument(
        "--replace", action="store_true", help="re-enroll a site that lost its key (its old certificates are revoked)"
    )
    revoke = certs_commands.add_parser(
        "revoke", help="revoke every certificate of an identity; services refuse it within a second"
    )
    revoke.add_argument("name", help="the identity to revoke, e.g. hospital-c")
    revoke.add_argument("--dir", required=True, help="the federation's CA directory (ca.crt, ca.key, issued.json)")
    revoke.add_argument(
        "--reason",
        default=None,
        help="why (kept in the ledger); a CRL reason name such as key_compromise also sets the reason code",
    )
    rotate = certs_commands.add_parser(
        "rotate", help="a fresh key and certificate for an identity (same role and hosts); the old one is revoked"
    )
    rotate.add_argument("--dir", required=True, help="the federation's CA directory (holding the identity's key)")
    rotate.add_argument("--name", required=True)
    rotate.add_argument("--days", type=int, default=365)
    crl = certs_commands.add_parser("crl", help="sign the revocation list again (a fresh next-update date)")
    crl.add_argument("--dir", required=True, help="the federation's CA directory")

    aggregator = commands.add_parser("aggregator", help="run the aggregator service")
    aggregator.add_argument("--listen", default="127.0.0.1:50051", help="host:port (port 0 picks a free one)")
    aggregator.add_argument("--certs", required=True, help="federation certificate directory")
    aggregator.add_argument("--name", default="aggregator", help="identity to serve as")
    aggregator.add_argument(
        "--crl", default=None, help="the federation's revocation list (default: revoked.crl.pem in --certs)"
    )
    aggregator.add_argument("--state", default=None, help="directory for completed rounds (survives restarts)")
    aggregator.add_argument("--port-file", default=None, help="write the bound port here once listening")
    aggregator.add_argument(
        "--metrics",
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus metrics on HOST:PORT (default: $CONFIDE_METRICS)",
    )
    aggregator.add_argument("--round-timeout", type=float, default=120.0, help="seconds a participant may be absent")
    aggregator.add_argument("--dropout-grace", type=float, default=5.0, help="seconds to resume a broken stream")
    aggregator.add_argument("--controller", default=None, help="follow this controller (https://host:port)")
    aggregator.add_argument("--advertise", default=None, help="address parties dial (default: the bound one)")
    aggregator.add_argument("--workers", type=int, default=0, help="data-plane workers (0: one per core)")
    aggregator.add_argument("--max-staged-mb", type=int, default=256, help="partial sums held in memory, MiB")
    aggregator.add_argument(
        "--mailbox-memory-mb",
        type=int,
        default=512,
        help="deliveries the relay holds in memory, MiB (beyond it they wait on disk for their readers)",
    )
    aggregator.add_argument("--max-streams", type=int, default=128, help="gRPC threads (two per connected party)")
    aggregator.add_argument(
        "--data-port",
        type=int,
        default=0,
        help="port of the Rust data path for slices (0: any free port, reported in Health; -1: none, "
        "slices go through the Python gRPC server)",
    )

    cluster = commands.add_parser("cluster", help="run an aggregator cluster (N aggregator processes)")
    cluster.add_argument("--nodes", type=int, required=True, help="number of aggregator nodes")
    cluster.add_argument("--certs", required=True, help="federation certificate directory")
    cluster.add_argument("--workdir", required=True, help="per-node state, logs and port files")
    cluster.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    cluster.add_argument("--name", default="aggregator", help="identity every node serves as")
    cluster.add_argument("--addresses-file", default=None, help="write the parties' --aggregator value here")

    party = commands.add_parser("party", help="run one party of a job")
    source = party.add_mutually_exclusive_group(required=True)
    source.add_argument("--job", help="job specification (YAML or JSON)")
    source.add_argument("--config", help="execution configuration from the controller (JSON; agents use it)")
    party.add_argument("--party", required=True, help="this party's name")
    party.add_argument("--aggregator", required=True, help="aggregator host:port")
    party.add_argument("--certs", required=True, help="federation certificate directory")
    party.add_argument("--workdir", required=True, help="reports (and checkpoints, unless --checkpoints)")
    party.add_argument("--checkpoints", default=None, help="checkpoint directory")
    party.add_argument(
        "--metrics",
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus metrics on HOST:PORT (default: $CONFIDE_METRICS)",
    )
    party.add_argument("--runtime-job-id", default=None, help="job id at the aggregator (one per run)")
    party.add_argument("--resume-round", type=int, default=0, help="continue after this checkpointed round")
    party.add_argument("--datasets", default=None, help="this party's dataset catalog (FL_Data jobs)")
    party.add_argument("--joining", default="", help="parties without the resume checkpoint (comma-separated)")
    party.add_argument(
        "--rejoin",
        action="store_true",
        help="this process replaces one of this party that died mid-job: reload the latest checkpoint, "
        "ask the peers to take it back, go on from the round they admit it to",
    )
    party.add_argument(
        "--model-from",
        default=None,
        help="a scoring job's trained model: the training session's folder at this site (agents pass it), "
        "or a folder of <party>.model.zip files",
    )
    party.add_argument(
        "--stop-file", default=None, help="stop at the next round boundary once this file exists (agents use it)"
    )
    party.add_argument(
        "--keras-backend",
        choices=["jax", "torch", "tensorflow"],
        default=None,
        help="this party's Keras backend (model.algorithm keras); wins over the job's model.backends",
    )

    party.add_argument(
        "--compute",
        default=None,
        help="where a partitioned dataset's rows are held and worked on: inline (default), ray (a Ray "
        "instance on this machine) or ray:ADDRESS (the silo's Ray cluster, e.g. ray:auto)",
    )

    run = commands.add_parser("run", help="run a job on a local federation (aggregator + parties as processes)")
    run.add_argument("job", nargs="?", default=None, help="job specification (YAML or JSON)")
    run.add_argument("--workdir", default=None, help="default: reports/<job_id>")
    run.add_argument(
        "--metrics",
        default=None,
        metavar="HOST:PORT",
        help="serve the launcher's Prometheus metrics (restarts) on HOST:PORT (default: $CONFIDE_METRICS)",
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="go on with the job stopped in --workdir (or reports/<job_id>) from the last round every party "
        "checkpointed",
    )
    run.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        help="times each crashed process (aggregator, cluster node or party) is started again; 0: never (default 3)",
    )
    run.add_argument("--mode", default=None, help="override protection.mode")
    run.add_argument("--split", default=None, help="override data.split (iid or label_skew)")
    run.add_argument("--rounds", type=int, default=None, help="override rounds")
    run.add_argument("--no-progress", action="store_true", help="print round lines without a progress bar")
    run.add_argument("--nodes", type=int, default=1, help="aggregator nodes (more than 1: a cluster)")
    run.add_argument(
        "--catalog",
        action="append",
        default=[],
        metavar="PARTY=PATH",
        help="a party's dataset catalog, for jobs with fl_data (repeat once per party)",
    )
    run.add_argument(
        "--compute",
        action="append",
        default=[],
        metavar="PARTY=ENGINE",
        help="where a party's partitioned dataset is held and worked on: inline, ray or ray:ADDRESS",
    )
    controller_commands.add_commands(commands)
    model_commands.add_commands(commands)
    container_commands.add_commands(commands)
    stop_commands.add_commands(commands)
    for name in ("controller", "aggregator", "agent"):
        stop_commands.add_pid_file_option(commands.choices[name])
    tracking = commands.add_parser("tracking", help="records kept for an MLflow server that was not reached")
    tracking_commands = tracking.add_subparsers(dest="tracking_command", required=True)
    replay = tracking_commands.add_parser("replay", help="send a kept record (mlflow-pending.json) to its server")
    replay.add_argument("record", help="the mlflow-pending.json a job wrote next to its report")
    replay.add_argument("--uri", default=None, help="another tracking server than the one the job named")
    return parser


#: Settings for the numeric libraries a Confide process loads, unless its operator set them.
#: After every call, OpenBLAS's idle threads spin for 2^28 cycles (about 0.1 s) before sleeping,
#: on the cores that the Paillier engine, the gRPC threads and any process beside this one need;
#: 2^4 cycles lets them sleep at once. Measured with ``perf`` on runtime shape (b) (4 parties and
#: the aggregator on 2 cores): 18 % of all CPU was ``blas_thread_server`` spinning; with the
#: setting, a paillier round went from 0.56 to 0.46 s and a plain one from 0.14 to 0.05 s
#: (docs/runtime.md, "Where a round's time goes").
NUMERIC_ENVIRONMENT = {"OPENBLAS_THREAD_TIMEOUT": "4"}


def settle_numeric_threads(environ: MutableMapping[str, str] = os.environ) -> None:
    """Apply :data:`NUMERIC_ENVIRONMENT` where unset; must run before numpy is first imported."""
    for name, value in NUMERIC_ENVIRONMENT.items():
        environ.setdefault(name, value)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    settle_numeric_threads()
    return run_parsed(_parser().parse_args(argv))


def run_parsed(args: argparse.Namespace) -> int:
    """Run a command line already parsed (``confide container run`` parses its role's options)."""
    if args.log_format not in ("text", "json"):  # from the environment: argparse checks only the flag
        print(f"confide: error: CONFIDE_LOG_FORMAT must be text or json, got {args.log_format!r}", file=sys.stderr)
        return 2
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonLines()
        if args.log_format == "json"
        else logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s")
    )
    logging.basicConfig(
        level=logging.INFO
        if args.verbose or args.command in ("aggregator", "party", "controller", "agent", "container")
        else logging.WARNING,
        handlers=[handler],
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per controller sync otherwise
    try:
        if getattr(args, "pid_file", None):
            stop_commands.write_pid_file(args.pid_file)
        if args.command == "certs":
            return _certs(args)
        if args.command == "aggregator":
            return _aggregator(args)
        if args.command == "cluster":
            return _cluster(args)
        if args.command == "party":
            return _party(args)
        if args.command in controller_commands.COMMANDS:
            return controller_commands.dispatch(args)
        if args.command == "model":
            return model_commands.dispatch(args)
        if args.command == "stop":
            lines = stop_commands.stop(args.paths, args.timeout)
            print("\n".join(lines))
            return 1 if any("still running" in line for line in lines) else 0
        if args.command == "container":
            return container_commands.dispatch(args, _parser().parse_args, run_parsed)
        if args.command == "tracking":
            from confide.tracking import replay

            sent = replay(args.record, args.uri)
            print(
                f"sent: MLflow run {sent['run_id']}"
                + (f", model version {sent['model_version']}" if sent["model_version"] else "")
            )
            return 0
        return _launch(args)
    except ConfideError as error:
        print(f"confide: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`confide model predict ... | head`): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as error:
        # A path the user gave: missing, a directory, too long, not permitted. The message names it.
        where = f": {error.filename}" if error.filename else ""
        print(f"confide: error: {error.strerror or error}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _certs(args) -> int:
    from confide.transport import certs

    if args.certs_command == "init":
        paths = certs.init_federation(
            args.dir,
            parties=_names(args.parties),
            services=_names(args.services),
            admins=_names(args.admins),
            developers=_names(args.developers),
            hosts=_names(args.hosts),
            days=args.days,
            overwrite=args.force,
        )
        print(f"federation CA and {len(paths)} identities in {args.dir}: {', '.join(paths)}")
    elif args.certs_command == "add":
        path = certs.issue_identity(args.dir, args.name, args.role, hosts=_names(args.hosts), days=args.days)
        print(f"issued {args.role} {args.name}: {path} (and its key next to it)")
    elif args.certs_command == "request":
        path = certs.make_request(args.dir, args.name, args.role, hosts=_names(args.hosts))
        print(
            f"key {Path(args.dir) / (args.name + '.key')} (stays here) and signing request {path}: send the .csr "
            "to the federation operator, and put the .crt and ca.crt they send back into this directory"
        )
    elif args.certs_command == "revoke":
        done = certs.revoke_identity(args.dir, args.name, reason=args.reason)
        _print_revocation(done)
    elif args.certs_command == "rotate":
        done = certs.rotate_identity(args.dir, args.name, days=args.days)
        print(f"issued a new certificate for {done.name}: {done.issued} (and its key next to it)")
        _print_revocation(done)
    elif args.certs_command == "crl":
        print(f"signed {certs.write_crl(args.dir)} again")
    else:
        csr = Path(args.csr)
        if not csr.is_file():
            raise InvalidParameterError(f"{csr}: no such signing request file")
        name, pem = certs.sign_request(
            args.ca_dir, csr.read_bytes(), role=args.role, days=args.days, replace=args.replace
        )
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.crt").write_bytes(pem)
        (out / certs.CA_CERT_FILE).write_bytes((Path(args.ca_dir) / certs.CA_CERT_FILE).read_bytes())
        print(f"signed {args.role} {name}: {out / (name + '.crt')} and {out / certs.CA_CERT_FILE} go back to the site")
    return 0


def _print_revocation(done) -> None:
    for entry in done.revoked:
        print(f"revoked {entry['role']} {done.name}: serial {entry['serial']} (issued {entry['issued_at']})")
    for entry in done.already:
        print(f"already revoked: serial {entry['serial']} ({entry['revoked_at']}, {entry['reason']})")
    if not done.revoked and not done.already:
        print(f"{done.name} had no other certificate to revoke")
    print(
        f"revocation list {done.crl} (CRL number {done.crl_number}): services that read it (their certificate "
        "directory's copy, or --crl) refuse these certificates within a second; copy it to services elsewhere"
    )


def _aggregator(args) -> int:
    from confide.aggregator import AggregatorConfig, serve
    from confide.crypto.identity import Identity
    from confide.transport.revocation import crl_path_for

    for flag, value in (("--max-staged-mb", args.max_staged_mb), ("--mailbox-memory-mb", args.mailbox_memory_mb)):
        if value < 0:
            raise InvalidParameterError(f"{flag} must be at least 0 (MiB), got {value}")
    from confide import metrics

    identity = Identity.load(args.certs, args.name)
    metrics.serve_from(args.metrics)  # first: a port in use stops the node before it takes rounds
    config = AggregatorConfig(
        round_timeout_s=args.round_timeout,
        dropout_grace_s=args.dropout_grace,
        state_dir=args.state,
        workers=args.workers,
        max_staged_bytes=args.max_staged_mb * 1024**2,
        mailbox_memory_bytes=args.mailbox_memory_mb * 1024**2,
        max_workers=args.max_streams,
        data_port=None if args.data_port < 0 else args.data_port,
        crl_path=str(crl_path_for(args.certs, args.crl)),
    )
    server, port, core = serve(identity, args.listen, config)
    metrics.watch(
        lambda: {
            "open_rounds": core.open_rounds(),
            "staged_bytes": core.dataplane.stats()["staged_bytes"],
            "relay_memory_bytes": core.mailboxes.retained_bytes,
            "relay_spilled_bytes": core.mailboxes.spilled_bytes,
        },
        metrics.AGGREGATOR_QUEUE,
        "What the node holds now: open round attempts, partial sums staged, relayed messages in memory and on disk",
    )
    if args.port_file:
        temporary = Path(args.port_file + ".tmp")
        temporary.write_text(str(port))
        temporary.replace(args.port_file)
    logging.getLogger("confide.aggregator").info("aggregator %s listening on port %d", identity.name, port)
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    agent = None
    if args.controller:
        from confide.agent import Agent
        from confide.agent.client import ControllerClient
        from confide.aggregator.agent import AggregatorWorker

        host = args.listen.rpartition(":")[0] or "127.0.0.1"
        advertise = args.advertise or f"{host}:{port}"
        client = ControllerClient(args.controller, certs_dir=args.certs, name=identity.name)
        agent = Agent(client, AggregatorWorker(core), Path(args.state or "aggregator-state"), address=advertise)
        threading.Thread(target=agent.run_forever, name="confide-agent", daemon=True).start()
    stopped.wait()
    if agent is not None:
        agent.stop()
    server.stop(grace=2).wait()
    core.close()
    return 0


def _cluster(args) -> int:
    from confide.local import Cluster

    cluster = Cluster(args.nodes, args.certs, args.workdir, host=args.host, name=args.name)
    addresses = cluster.start()
    if args.addresses_file:
        temporary = Path(args.addresses_file + ".tmp")
        temporary.write_text(cluster.target)
        temporary.replace(args.addresses_file)
    print(f"aggregator cluster of {args.nodes} nodes: {cluster.target}", flush=True)
    print("parties: --aggregator " + ",".join(addresses) + "  (the first live node also relays)", flush=True)
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    reported: set[int] = set()
    while not stopped.wait(1.0):
        for k in set(range(args.nodes)) - set(cluster.alive()) - reported:
            reported.add(k)
            print(
                f"aggregator node {k} exited; parties re-route its share (and the relay, if it relayed) to the "
                "next live node, and re-admit it at a round boundary once it runs again on its port",
                flush=True,
            )
    cluster.stop()
    return 0


def _party(args) -> int:
    import json

    from confide import metrics
    from confide.party import run_party
    from confide.spec import load_job, parse_job

    metrics.serve_from(args.metrics)

    session = None
    if args.config is not None:
        config = json.loads(Path(args.config).read_text())
        spec, session = parse_job(config["spec"]), config.get("session")
    else:
        spec = load_job(args.job)
    catalog = None
    if args.datasets:
        from confide.data.catalog import Catalog
        from confide.party.runner import report_failure

        try:
            catalog = Catalog.load(args.datasets)
        except Exception as error:
            # The developer learns why through the report the agent forwards (never a value).
            dataset = spec.datasets().get(args.party)
            report_failure(args.workdir, spec.job_id, args.party, error, stage="data", dataset=dataset)
            raise
    report = run_party(
        spec,
        args.party,
        aggregator=args.aggregator,
        certs_dir=args.certs,
        workdir=args.workdir,
        runtime_job_id=args.runtime_job_id,
        checkpoint_dir=args.checkpoints,
        resume_round=args.resume_round,
        catalog=catalog,
        joining=_names(args.joining),
        keras_backend=args.keras_backend,
        stop_file=args.stop_file,
        session=session,
        compute=args.compute,
        rejoin=args.rejoin,
        model_from=args.model_from,
    )
    logging.getLogger("confide.party").info(
        "%s: %s after %d rounds", args.party, report["status"], len(report["rounds"])
    )
    return 0


def _launch(args) -> int:
    """``confide run``: SIGTERM stops the federation as Ctrl-C does, and says how to go on."""
    import signal

    def interrupted(_signal, _frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        return _run(args)
    except KeyboardInterrupt:
        where = f" --workdir {args.workdir}" if args.workdir else f" {args.job}"
        print(f"\nconfide run: stopped; go on from the last checkpoint with: confide run --resume{where}")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args) -> int:
    from confide import metrics
    from confide.local import run_local
    from confide.spec import load_job, parse_job

    metrics.serve_from(args.metrics)

    if args.job is None and not (args.resume and args.workdir):
        raise InvalidParameterError("confide run needs a job file (or --resume --workdir DIR)")
    if args.max_restarts < 0:
        raise InvalidParameterError(f"--max-restarts must be 0 or more, got {args.max_restarts}")
    if args.resume:
        return _resume(args, load_job)
    spec = load_job(args.job)
    overrides = spec.model_dump()
    if args.mode:
        overrides["protection"]["mode"] = args.mode
    if args.split:
        overrides["data"]["split"] = args.split
    if args.rounds:
        overrides["rounds"] = args.rounds
    spec = parse_job(overrides)
    workdir = Path(args.workdir or Path("reports") / spec.job_id)
    print(
        f"confide run: job {spec.job_id!r}, {len(spec.parties)} parties ({', '.join(spec.parties)}), "
        f"{spec.rounds} rounds, {spec.model.algorithm}, mode {spec.protection.mode}, "
        f"data {'FL_Data over the parties catalogs' if spec.fl_data is not None else spec.data.dataset}"
    )
    aggregators = f"an aggregator cluster of {args.nodes} nodes" if args.nodes > 1 else "an aggregator"
    print(f"starting {aggregators} and {len(spec.parties)} party processes on loopback (gRPC + mutual TLS)")
    catalogs = _per_party("--catalog", "PARTY=PATH", args.catalog)
    compute = _per_party("--compute", "PARTY=ENGINE", args.compute)
    report = run_local(
        spec,
        workdir,
        progress=not args.no_progress,
        nodes=args.nodes,
        catalogs=catalogs,
        compute=compute,
        max_restarts=args.max_restarts,
    )
    print_summary(report)
    _track(spec, report, workdir)
    return 0


def _resume(args, load_job) -> int:
    """``confide run --resume``: the job as it was started (``job.json`` in its work directory)."""
    from confide.local import run_local

    if args.mode or args.split or args.rounds:
        raise InvalidParameterError("--resume goes on with the job as it was started: drop --mode, --split, --rounds")
    workdir = Path(args.workdir) if args.workdir else Path("reports") / load_job(args.job).job_id
    started = workdir / "job.json"
    if not started.exists():
        raise InvalidParameterError(f"--resume: {started} does not exist (no job was started in {workdir})")
    spec = load_job(started)
    if args.job is not None and load_job(args.job).job_id != spec.job_id:
        raise InvalidParameterError(
            f"--resume: {workdir} holds job {spec.job_id!r}, not {load_job(args.job).job_id!r} from {args.job}"
        )
    print(f"confide run --resume: job {spec.job_id!r} in {workdir}")
    report = run_local(
        spec,
        workdir,
        progress=not args.no_progress,
        nodes=args.nodes,
        catalogs=_per_party("--catalog", "PARTY=PATH", args.catalog),
        compute=_per_party("--compute", "PARTY=ENGINE", args.compute),
        max_restarts=args.max_restarts,
        resume=True,
    )
    print_summary(report)
    _track(spec, report, workdir)
    return 0


def _track(spec, report: dict, workdir) -> None:
    """Record the job in MLflow where its ``tracking`` section says (a server down warns, never fails)."""
    if spec.tracking is not None:
        from confide.tracking import track

        track(spec, report, workdir)


def _per_party(option: str, form: str, items: list[str]) -> dict[str, str]:
    """``PARTY=VALUE`` options, by party."""
    out = {}
    for item in items:
        party, separator, value = item.partition("=")
        if not separator or not party or not value:
            raise InvalidParameterError(f"{option} takes {form}, got {item!r}")
        out[party] = value
    return out


def _print_vertical_summary(report: dict) -> None:
    metrics = report.get("metrics") or {}
    shown = "  ".join(f"{name} {value:.4f}" for name, value in metrics.items())
    parties = report["parties"]
    sent = sum((p.get("bytes") or {}).get("sent", 0) for p in parties.values())
    hosts = ", ".join(report["hosts"])
    print(f"\nprotection that ran: paillier ({report['algorithm']}, guest {report['guest']}, hosts {hosts})")
    print(
        f"PSI: {report['psi']['intersection']} common records; "
        f"{report['samples']} training, {report['test_samples']} test"
    )
    print(f"test metrics at the guest: {shown}")
    losses = report.get("validation_loss")
    if losses:
        best = report.get("best_round")
        kept = (
            f"early stopping kept round {best + 1} of {len(losses)} ({report.get('trees_kept')} trees)"
            if best is not None
            else "every round kept"
        )
        print(f"validation loss: first {losses[0]:.4f}, last {losses[-1]:.4f}, best {min(losses):.4f}; {kept}")
    print(f"bytes sent (all parties): {sent / 1e6:.2f} MB; job wall time {report['wall_seconds']:.1f} s")
    engines = {p: r["paillier_engine"]["crypto_engine"] for p, r in parties.items() if r.get("paillier_engine")}
    if engines:
        print("Paillier engine: " + ", ".join(f"{p} {engine}" for p, engine in engines.items()))
    _print_compute(parties)
    print(f"report: {report['files']['json']}")


def _print_compute(parties: dict[str, dict]) -> None:
    """One line per party whose local work ran on a compute engine other than its own process."""
    for party, entry in sorted(parties.items()):
        compute = entry.get("compute")
        if not compute:
            continue
        where = compute.get("engine", "?")
        if compute.get("address") not in (None, "local"):
            where += f" at {compute['address']}"
        if compute.get("nodes"):
            where += f", {compute['nodes']} node{'s' if compute['nodes'] != 1 else ''}"
        work = compute.get("work")
        if work is None and compute.get("partitions"):
            work = [f"{compute['partitions']} partitions held"]
        shown = "; ".join(work) if isinstance(work, list) else (work or "")
        print(f"compute at {party}: {where}" + (f" ({shown})" if shown else ""))


def print_summary(report: dict) -> None:
    """Print the job report's headline figures."""
    if "algorithm" in report:
        _print_vertical_summary(report)
        return
    from confide.reports import JobReport

    job = JobReport.model_validate(report)
    print(f"\nprotection that ran: {job.mode}  (aggregator saw: {job.aggregator_saw})")
    protection = job.protection
    verification = protection.get("verification")
    if verification is not None:
        refused = sum(len(r.refused) for r in job.rounds)
        print(
            f"  sums verified by every party ({verification['arithmetic']}); {refused} attempt(s) refused"
            if verification["ran"]
            else f"  sums not verified: {verification['reason']}"
        )
    if job.mode == "paillier":
        print(
            f"  Paillier {protection['key_bits']}-bit, BatchCrypt {protection['quantization_bits']}-bit quantization, "
            f"{protection['clipping']} clipping (last alpha {protection['last_alpha']:.4g}); {protection['decryption']}"
        )
    if job.mode == "tee":
        enclave = protection.get("enclave", {})
        print(f"  {protection['note']}  (enclave report: mode {enclave.get('mode')!r}, {enclave.get('note', '')})")
    if job.mode == "threshold":
        print(
            f"  threshold Paillier {protection['key_bits']}-bit: {protection['secret_key_holders']}; key generation "
            f"{protection['keygen']} ({protection['keygen_seconds']:.1f} s); {protection['decryption']}"
        )
    if job.mode in ("paillier", "threshold") and protection.get("crypto_engine"):
        print(f"  Paillier engine: {protection['crypto_engine']} ({protection['crypto_engine_reason']})")
    privacy = (protection or {}).get("privacy")
    if privacy:
        print(
            f"differential privacy: epsilon {privacy['epsilon_spent']:.3f} spent of {privacy['epsilon_budget']:g} "
            f"(delta {privacy['delta']:g}), {privacy['mechanism']}; unit: {privacy['unit']}; noise multiplier "
            f"{privacy['noise_multiplier']:.3g}, clip {privacy['clip_norm']:g}; accountant {privacy['accountant']}"
        )
        if "stopped_before_round" in privacy:
            print(f"  budget spent: stopped before round {privacy['stopped_before_round']}")
    if job.model is not None:
        model = job.model
        backend = f", backend {model.backend}" if model.backend else ""
        strategy = (job.strategy or {}).get("name", "fedavg")
        print(
            f"model: {model.algorithm} ({model.parameters:,} weights in {model.tensors} tensors, "
            f"{model.layers} layer{'s' if model.layers != 1 else ''}{backend}); strategy {strategy}"
        )
        if model.base_sha256:
            adapter = "adapter lora" if model.adapter == "lora" else "full fine-tuning"
            print(
                f"  pretrained base: {model.base_parameters:,} weights, SHA-256 {model.base_sha256[:16]}... "
                f"(the same at every party); {adapter}"
            )
    central = job.centralized
    for metric, label, final in (("auc", "AUC", job.final_auc), ("accuracy", "accuracy", job.final_accuracy)):
        if final is None:
            continue
        line = f"final test {label} {final:.4f}"
        if central.get(f"pooled_{metric}") is not None:
            line += (
                f"   centralized on pooled data: {central[f'pooled_{metric}']:.4f} "
                f"(same model, {central['epochs']} epochs)"
            )
        if metric == "auc" and central.get("sklearn_lr_pooled_auc") is not None:
            line += f", scikit-learn LR {central['sklearn_lr_pooled_auc']:.4f}"
        print(line)
    mean_bytes = sum(r.bytes_sent for r in job.rounds) / len(job.rounds)
    print(
        f"bytes sent per round (all parties): {mean_bytes / 1e3:.1f} KB mean; "
        f"key set-up {job.setup_seconds:.2f} s; job wall time {job.wall_seconds:.1f} s"
    )
    _print_compute(job.parties)
    for restart in job.restarts:
        print(f"restarted: {restart['process']} {restart['how']} at round {restart['round']}")
    for party, entry in job.parties.items():
        for rejoin in entry.get("rejoins") or []:
            missed = rejoin["missed_rounds"]
            gap = f"missed rounds {missed[0]}-{missed[-1]}" if missed else "missed no round"
            print(f"  {party} rejoined at round {rejoin['at_round']} ({gap}; admitted by {rejoin['admitted_by']})")
    for party, why in job.dropped.items():
        print(f"dropped: {party}: {why}")
    print(f"report: {job.files['json']}\nplot:   {job.files['plot']}")
