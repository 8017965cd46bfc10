"""Controller commands: ``confide controller | console | agent | data | grant | audit | job | session``.

Clients find the controller and their identity in ``--controller`` / ``--certs`` / ``--as``
or the environment (``CONFIDE_CONTROLLER``, ``CONFIDE_CERTS``, ``CONFIDE_IDENTITY``).
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import secrets
import signal
import sys
import threading
import time
from pathlib import Path

import yaml

from confide.errors import InvalidParameterError

__all__ = ["add_commands", "dispatch"]

COMMANDS = ("controller", "console", "agent", "data", "grant", "audit", "job", "session")


def _client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--controller", default=os.environ.get("CONFIDE_CONTROLLER"), help="https://host:port")
    parser.add_argument("--certs", default=os.environ.get("CONFIDE_CERTS"), help="federation certificate directory")
    parser.add_argument("--as", dest="identity", default=os.environ.get("CONFIDE_IDENTITY"), help="identity name")
    parser.add_argument("--json", action="store_true", help="print the controller's JSON answer")


def add_commands(commands) -> None:
    """Register the controller commands on the top-level subparsers."""
    controller = commands.add_parser("controller", help="run the controller (REST API over mutual TLS)")
    controller.add_argument("--certs", required=True, help="federation certificate directory")
    controller.add_argument("--name", default="controller", help="service identity to serve as")
    controller.add_argument(
        "--crl", default=None, help="the federation's revocation list (default: revoked.crl.pem in --certs)"
    )
    controller.add_argument("--db", default="controller.db", help="SQLite file or postgresql://... URL")
    controller.add_argument("--listen", default="127.0.0.1:8443", help="host:port (port 0 picks a free one)")
    controller.add_argument("--port-file", default=None, help="write the bound port here once listening")
    controller.add_argument(
        "--metrics",
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus metrics on HOST:PORT (default: $CONFIDE_METRICS)",
    )
    controller.add_argument(
        "--alive", type=float, default=30.0, help="seconds without a heartbeat before a party is shown down"
    )
    controller.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes sharing the port (PostgreSQL store only; the console runs in worker 0)",
    )
    controller.add_argument(
        "--console", default=None, metavar="HOST:PORT", help="also serve the web console there (HTTPS, sign-in)"
    )
    controller.add_argument("--console-port-file", default=None, help="write the console's bound port here")
    controller.add_argument("--console-cert", default=None, help="the console's TLS certificate (default: --name's)")
    controller.add_argument("--console-key", default=None, help="the console's TLS key (default: --name's)")

    console = commands.add_parser("console", help="web console accounts and API tokens (run on the controller host)")
    console_commands = console.add_subparsers(dest="console_command", required=True)
    user = console_commands.add_parser("user", help="console accounts")
    user_commands = user.add_subparsers(dest="user_command", required=True)
    add = user_commands.add_parser("add", help="create an account")
    add.add_argument("name")
    add.add_argument("--role", required=True, choices=("developer", "owner", "admin"))
    add.add_argument("--party", default=None, help="the party an owner administers (its certificate name)")
    for sub in (add, user_commands.add_parser("password", help="set an account's password (ends its sessions)")):
        if sub is not add:
            sub.add_argument("name")
        source = sub.add_mutually_exclusive_group()
        source.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
        source.add_argument("--generate", action="store_true", help="generate a password and print it once")
    user_commands.add_parser("disable", help="disable an account (sessions end, tokens stop)").add_argument("name")
    user_commands.add_parser("list", help="accounts")
    token = console_commands.add_parser("token", help="issue an API token for scripts (printed once)")
    token.add_argument("name")
    token.add_argument("--label", default="script")
    token.add_argument("--revoke", action="store_true", help="revoke the account's tokens with --label instead")
    opened = console_commands.add_parser(
        "open", help="serve a local deployment's controller with its console and print the URL and a sign-in"
    )
    opened.add_argument(
        "--workdir", default="reports/demo-controller", help="a LocalDeployment's directory (make demo)"
    )
    opened.add_argument("--listen", default="127.0.0.1:8444", help="the console's host:port")
    opened.add_argument("--account", default="demo", help="an admin account, created (or its password reset) now")
    for sub in (add, *(user_commands.choices[n] for n in ("password", "disable", "list")), token):
        sub.add_argument("--db", default="controller.db", help="the controller's store (SQLite file or URL)")

    agent = commands.add_parser("agent", help="run a party's agent: register datasets, follow the controller")
    agent.add_argument("--controller", required=True, help="https://host:port")
    agent.add_argument("--certs", required=True, help="federation certificate directory")
    agent.add_argument("--name", required=True, help="this party's identity")
    agent.add_argument("--workdir", required=True, help="session configurations, runs and checkpoints")
    agent.add_argument("--datasets", default=None, help="the party's dataset catalog (YAML)")
    agent.add_argument("--interval", type=float, default=1.0, help="seconds between syncs")
    agent.add_argument(
        "--alive-file",
        default=None,
        help="touch this file after every sync the controller answered (a health check reads its age)",
    )
    agent.add_argument(
        "--metrics",
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus metrics on HOST:PORT (default: $CONFIDE_METRICS)",
    )
    agent.add_argument(
        "--share-log-lines",
        type=int,
        default=0,
        help=(
            "share the last N lines of each run's party.log with the controller; the console shows them to the "
            "job's developer, the admins and this party's owners (0: share nothing)"
        ),
    )
    agent.add_argument(
        "--share-metrics-with-tracking",
        action="store_true",
        help="let this party's own per-round metrics go to the MLflow server of a job that names this party in "
        "tracking.party_metrics (without it they never do; the federated figures are recorded either way)",
    )

    data = commands.add_parser("data", help="datasets published to the controller (metadata only)")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    for name, text in (
        ("list", "published datasets"),
        ("parties", "registered parties and services"),
        ("uses", "sessions using your datasets: who, when, which pipeline, approval (run as the owner)"),
    ):
        _client_options(data_commands.add_parser(name, help=text))
    show = data_commands.add_parser("catalog", help="the metadata a catalog file would publish (offline)")
    show.add_argument("catalog", help="catalog YAML")

    grant = commands.add_parser("grant", help="data-access grants (run as the dataset's owner)")
    grant_commands = grant.add_subparsers(dest="grant_command", required=True)
    for name in ("add", "revoke"):
        help_text = (
            f"{name} a developer's use of one of your datasets"
            if name == "add"
            else "revoke a developer's use of one of your datasets; its running sessions stop at the next round"
        )
        sub = grant_commands.add_parser(name, help=help_text)
        sub.add_argument("--dataset", required=True)
        sub.add_argument("--developer", required=True)
        if name == "add":
            sub.add_argument("--expires", default=None, help="the grant lapses then: ISO 8601 with a zone")
            sub.add_argument("--job", default=None, help="only jobs with this job id may use the dataset")
            sub.add_argument(
                "--approval", action="store_true", help="every session waits for your 'confide job approve'"
            )
        _client_options(sub)
    _client_options(grant_commands.add_parser("list", help="grants you gave or received"))

    audit = commands.add_parser("audit", help="the audit log (access decisions and changes)")
    audit.add_argument("--after", type=int, default=0)
    audit.add_argument("--limit", type=int, default=200)
    _client_options(audit)

    job = commands.add_parser("job", help="jobs as sessions on the controller")
    job_commands = job.add_subparsers(dest="job_command", required=True)
    submit = job_commands.add_parser("submit", help="submit a job specification (YAML/JSON)")
    submit.add_argument("spec")
    submit.add_argument("--wait", action="store_true", help="wait until the session completes or fails")
    _client_options(submit)
    tune = job_commands.add_parser("tune", help="tune a session: settings, FL_Data, parties")
    tune.add_argument("session")
    tune.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", help="e.g. model.learning_rate=0.05")
    tune.add_argument("--fl-data", default=None, help="a new FL_Data (JSON/YAML file)")
    tune.add_argument("--add-party", action="append", default=[], metavar="PARTY=DATASET")
    tune.add_argument("--base-seq", type=int, default=None, help="the log entry you tuned from (race guard)")
    _client_options(tune)
    for name, text in (
        ("resume", "continue from the last checkpoint"),
        ("cancel", "stop"),
        ("status", "show"),
        ("approve", "approve (as a dataset's owner) the use of your datasets by"),
    ):
        sub = job_commands.add_parser(name, help=f"{text} a session")
        sub.add_argument("session")
        if name == "resume":
            sub.add_argument("--wait", action="store_true", help="wait until the session completes or fails")
        _client_options(sub)
    _client_options(job_commands.add_parser("list", help="your sessions (a party: the sessions using its data)"))

    session = commands.add_parser("session", help="session history")
    session_commands = session.add_subparsers(dest="session_command", required=True)
    log = session_commands.add_parser("log", help="the committed log with deltas and checkpoint roots")
    log.add_argument("session")
    log.add_argument("--entry", type=int, default=None, help="show one entry in full")
    _client_options(log)


def dispatch(args) -> int:
    """Run a controller command."""
    if args.command == "controller":
        return _controller(args)
    if args.command == "console":
        return _console(args)
    if args.command == "agent":
        return _agent(args)
    if args.command == "data" and args.data_command == "catalog":
        from confide.data.catalog import Catalog

        print(json.dumps(Catalog.load(args.catalog).metadata(), indent=1))
        return 0
    with _client(args) as client:
        return _CLIENT_COMMANDS[args.command](args, client)


def _client(args):
    from confide.agent.client import ControllerClient

    missing = [
        flag
        for flag, value in (("--controller", args.controller), ("--certs", args.certs), ("--as", args.identity))
        if not value
    ]
    if missing:
        raise InvalidParameterError(
            f"{', '.join(missing)} missing (or set CONFIDE_CONTROLLER, CONFIDE_CERTS, CONFIDE_IDENTITY)"
        )
    return ControllerClient(args.controller, certs_dir=args.certs, name=args.identity)


def _wait_signal() -> threading.Event:
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    return stopped


def _controller(args) -> int:
    from confide import metrics
    from confide.controller.server import serve
    from confide.web import create_console_app

    if (args.metrics or os.environ.get(metrics.VARIABLE)) and args.workers != 1:
        raise InvalidParameterError(
            f"--metrics needs --workers 1: the {args.workers} worker processes would each count their own requests"
        )
    metrics.serve_from(args.metrics)

    serve(
        certs_dir=args.certs,
        name=args.name,
        database=args.db,
        address=args.listen,
        port_file=args.port_file,
        alive_s=args.alive,
        console_address=args.console,
        console_app=create_console_app if args.console else None,
        console_port_file=args.console_port_file,
        console_cert=args.console_cert,
        console_key=args.console_key,
        crl=args.crl,
        workers=args.workers,
    )
    return 0


def _password(args) -> str:
    if args.generate:
        password = secrets.token_urlsafe(15)
        print(f"password: {password}")
        return password
    if args.password_stdin:
        return sys.stdin.readline().rstrip("\n")
    if not sys.stdin.isatty():
        raise InvalidParameterError("no terminal to ask for a password: use --password-stdin or --generate")
    first, second = getpass.getpass("password: "), getpass.getpass("again: ")
    if first != second:
        raise InvalidParameterError("the two passwords differ")
    return first


def _console_open(args) -> int:
    from confide.controller.server import serve
    from confide.controller.store import open_store
    from confide.web import create_console_app
    from confide.web.accounts import Accounts

    workdir = Path(args.workdir)
    certs, database = workdir / "certs", workdir / "controller.db"
    if not (certs / "controller.crt").exists() or not database.exists():
        raise InvalidParameterError(
            f"--workdir {workdir}: no controller.db and certs/ there; run 'make demo' first "
            "(or point --workdir at a deployment's directory)"
        )
    password = secrets.token_urlsafe(12)
    store = open_store(f"sqlite:///{database.resolve()}")
    try:
        accounts = Accounts(store)
        if args.account in {row["name"] for row in accounts.list()}:
            accounts.set_password(args.account, password)
        else:
            accounts.create(args.account, "admin", password)
    finally:
        store.close()
    host, _, port = args.listen.rpartition(":")
    print(f"console: https://{host or '127.0.0.1'}:{port}/  (sign in as {args.account} / {password})")
    print(f"the certificate is from the deployment's own CA ({certs / 'ca.crt'}): import it, or accept the warning")
    print("the demo's parties are not running, so the federation page shows them down; Ctrl-C stops the console")
    sys.stdout.flush()
    serve(
        certs_dir=certs,
        name="controller",
        database=f"sqlite:///{database.resolve()}",
        address="127.0.0.1:0",
        console_address=args.listen,
        console_app=create_console_app,
    )
    return 0


def _console(args) -> int:
    from confide.controller.store import open_store
    from confide.web.accounts import Accounts

    if args.console_command == "open":
        return _console_open(args)
    store = open_store(args.db)
    try:
        accounts = Accounts(store)
        if args.console_command == "token":
            if args.revoke:
                print(f"revoked {accounts.revoke_tokens(args.name, args.label)} token(s) of {args.name}")
            else:
                print(accounts.issue_token(args.name, args.label))
            return 0
        command = args.user_command
        if command == "add":
            account = accounts.create(args.name, args.role, _password(args), party=args.party)
            print(
                f"account {account['name']} ({account['role']}"
                + (f" of {args.party}" if args.party else "")
                + ") created"
            )
        elif command == "password":
            accounts.set_password(args.name, _password(args))
            print(f"password of {args.name} changed; its console sessions ended")
        elif command == "disable":
            accounts.disable(args.name)
            print(f"account {args.name} disabled")
        else:
            for row in accounts.list():
                flag = " (disabled)" if row["disabled"] else ""
                print(f"{row['name']:<24} {row['role']:<10} {row['party'] or '':<24}{flag}")
        return 0
    finally:
        store.close()


def _agent(args) -> int:
    from confide import metrics
    from confide.agent import Agent
    from confide.agent.client import ControllerClient
    from confide.data.catalog import Catalog
    from confide.party.agent import PartyWorker

    metadata = Catalog.load(args.datasets).metadata() if args.datasets else []
    workdir = Path(args.workdir)
    metrics.serve_from(args.metrics)
    if not 0 <= args.share_log_lines <= 1000:
        raise InvalidParameterError(f"--share-log-lines must be in [0, 1000], got {args.share_log_lines}")
    worker = PartyWorker(
        args.name,
        args.certs,
        args.datasets,
        workdir / "sessions",
        share_log_lines=args.share_log_lines,
        share_metrics_with_tracking=args.share_metrics_with_tracking,
    )
    client = ControllerClient(args.controller, certs_dir=args.certs, name=args.name)
    agent = Agent(client, worker, workdir, datasets=metadata, interval_s=args.interval, alive_file=args.alive_file)
    stopped = _wait_signal()
    thread = threading.Thread(target=agent.run_forever, name="confide-agent", daemon=True)
    thread.start()
    logging.getLogger("confide.agent").info("agent %s following %s", args.name, args.controller)
    stopped.wait()
    agent.stop()
    worker.stop_all()
    return 0


def _print(args, value, text: str) -> None:
    print(json.dumps(value, indent=1) if args.json else text)


def _table(rows: list[dict], columns: list[str]) -> str:
    if not rows:
        return "(none)"
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def _columns_line(schema: list[dict]) -> str:
    """``age float (gaps), sex str [F, M], death int``: what a dataset's published columns are."""
    parts = []
    for column in schema:
        text = f"{column['name']} {column['dtype']}" + (" (gaps)" if column.get("missing") else "")
        categories = column.get("categories")
        if categories:
            shown = ", ".join(categories[:8]) + (f", ... {len(categories)} in all" if len(categories) > 8 else "")
            text += f" [{shown}]"
        parts.append(text)
    return ", ".join(parts) or "(no columns published)"


def _data(args, client) -> int:
    if args.data_command == "list":
        rows = client.datasets()
        for row in rows:
            row["columns"] = len(row["schema"])
        text = _table(rows, ["owner", "name", "rows", "columns", "granted", "description"])
        if rows:
            text += "\n\n" + "\n".join(f"{r['owner']}/{r['name']}: {_columns_line(r['schema'])}" for r in rows)
        _print(args, rows, text)
    elif args.data_command == "uses":
        rows = client.uses()
        for row in rows:
            row["steps"] = ", ".join(f"{s['name']}({s['op']})" for s in row["pipeline"]) or "-"
        _print(
            args,
            rows,
            _table(rows, ["session", "job_id", "dataset", "developer", "since", "state", "approval", "steps"]),
        )
    else:
        rows = client.parties()
        _print(args, rows, _table(rows, ["name", "role", "address", "online", "last_seen_s"]))
    return 0


def _grant(args, client) -> int:
    if args.grant_command == "add":
        answer = client.grant(
            args.dataset, args.developer, expires_at=args.expires, job_id=args.job, approval=args.approval
        )
        scope = [f"until {answer['expires_at']}" if answer["expires_at"] else ""]
        scope += [
            f"for job {answer['job_id']}" if answer["job_id"] else "",
            "with approval per job" * answer["approval"],
        ]
        scope_text = " ".join(part for part in scope if part)
        _print(
            args,
            answer,
            f"granted {answer['developer']} the use of {answer['dataset']}" + (f" {scope_text}" if scope_text else ""),
        )
    elif args.grant_command == "revoke":
        answer = client.revoke(args.dataset, args.developer)
        stopped = answer.get("stopped") or []
        _print(
            args,
            answer,
            f"revoked {answer['developer']}'s use of {answer['dataset']}"
            + (f"; stopped session{'s' * (len(stopped) > 1)} {', '.join(stopped)}" if stopped else ""),
        )
    else:
        rows = client.grants()
        for row in rows:
            row["scope"] = " ".join(
                part
                for part in (
                    f"until {row['expires_at']}" if row.get("expires_at") else "",
                    f"job {row['job_id']}" if row.get("job_id") else "",
                    "approval" if row.get("approval") else "",
                )
                if part
            )
        _print(args, rows, _table(rows, ["dataset", "developer", "granted_by", "granted_at", "active", "scope"]))
    return 0


def _audit(args, client) -> int:
    rows = client.audit(after=args.after, limit=args.limit)
    _print(args, rows, _table(rows, ["id", "at", "actor", "action", "target", "decision"]))
    return 0


def _load_document(path: str) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as error:
        raise InvalidParameterError(f"{path}: not valid YAML/JSON: {error}") from None
    if not isinstance(data, dict):
        raise InvalidParameterError(f"{path}: must hold a mapping")
    return data


def _parse_settings(items: list[str]) -> dict:
    settings = {}
    for item in items:
        path, sep, value = item.partition("=")
        if not sep or not path:
            raise InvalidParameterError(f"--set {item!r}: expected PATH=VALUE, e.g. model.learning_rate=0.05")
        settings[path.strip()] = yaml.safe_load(value)
    return settings


def _wait_session(client, token: str, timeout_s: float = 3600.0) -> dict:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        status = client.status(token)
        progress = max((p["round"] for p in status["participants"] if p["role"] == "party"), default=0)
        line = f"session {token}: {status['state']} (run {status['run']}, round {progress})"
        if line != last:
            print(line, flush=True)
            last = line
        if status["state"] not in ("running", "verifying", "awaiting"):
            return status
        time.sleep(0.5)
    raise InvalidParameterError(f"session {token} still running after {timeout_s:g} s")


def _job(args, client) -> int:
    command = args.job_command
    if command == "submit":
        answer = client.submit(_load_document(args.spec))
        _print(args, answer, f"session {answer['session']} (job {answer['job_id']}) submitted")
        if args.wait:
            return _final(_wait_session(client, answer["session"]))
    elif command == "tune":
        add_parties = {}
        for item in args.add_party:
            party, sep, dataset = item.partition("=")
            if not sep:
                raise InvalidParameterError(f"--add-party {item!r}: expected PARTY=DATASET")
            add_parties[party] = {"dataset": dataset}
        answer = client.tune(
            args.session,
            settings=_parse_settings(args.set),
            fl_data=_load_document(args.fl_data) if args.fl_data else None,
            add_parties=add_parties or None,
            base_seq=args.base_seq,
        )
        pushed = ", ".join(
            f"{name} ({len(ops)} change{'s' * (len(ops) != 1)})" for name, ops in answer["deltas"].items()
        )
        _print(
            args,
            answer,
            f"session {answer['session']}: entry {answer['seq']}; pushed to {pushed or 'nobody'}"
            + ("; restarting from the last checkpoint" if answer["restarted"] else ""),
        )
    elif command == "resume":
        answer = client.resume(args.session)
        _print(
            args,
            answer,
            f"session {answer['session']}: run {answer['run']} resumes after round {answer['resume_round']} "
            f"({answer['state']})",
        )
        if args.wait:
            return _final(_wait_session(client, answer["session"]))
    elif command == "cancel":
        answer = client.cancel(args.session)
        _print(args, answer, f"session {answer['session']} cancelled")
    elif command == "approve":
        answer = client.approve(args.session)
        waiting = ", ".join(answer["pending"])
        _print(
            args,
            answer,
            f"session {answer['session']}: approved; {answer['state']}"
            + (f" (still waiting for {waiting})" if waiting else ""),
        )
    elif command == "status":
        status = client.status(args.session)
        text = [
            f"session {status['session']} (job {status['job_id']}, owner {status['owner']}): {status['state']}, "
            f"run {status['run']}",
            f"  {status['message']}" if status["message"] else "",
            f"  last checkpoint: round {status['checkpoint']['round']}, root {status['checkpoint']['root'][:16]}..."
            if status["checkpoint"]
            else "  no checkpoint yet",
            _table(
                [{**p, "auc": _auc(p), "error": _short_error(p)} for p in status["participants"]],
                ["name", "role", "status", "run", "round", "applied_seq", "auc", "error"],
            ),
        ]
        evaluation = status.get("evaluation")
        if evaluation:
            aggregate = evaluation["aggregate"]
            shown = ", ".join(
                f"{label} {aggregate[key]:.4f}"
                for key, label in (("test_auc", "AUC"), ("test_accuracy", "accuracy"))
                if key in aggregate
            )
            parties, rows = int(aggregate["parties"]), int(aggregate["test_samples"])
            text.append(
                f"  final model on every party's held-out rows: {shown} "
                + (
                    f"(mean over {parties} parties weighted by their {rows} held-out rows)"
                    if parties > 1
                    else f"(one party's {rows} held-out rows)"
                )
            )
        _print(args, status, "\n".join(line for line in text if line))
    else:
        rows = client.sessions()
        _print(args, rows, _table(rows, ["session", "job_id", "owner", "state", "run"]))
    return 0


def _short_error(participant: dict) -> str:
    failure = participant.get("failure") or {}
    if failure:
        columns = f" [{', '.join(failure['columns'])}]" if failure.get("columns") else ""
        return f"{failure['stage']}{columns}: {failure['error']}"
    return (participant.get("error") or "")[:80]


def _auc(participant: dict) -> str:
    auc = (participant.get("result") or {}).get("test_auc")
    return f"{auc:.4f}" if isinstance(auc, float) else ""


def _final(status: dict) -> int:
    if status["message"]:
        print(status["message"])
    return 0 if status["state"] == "completed" else 1


def _session(args, client) -> int:
    if args.entry is not None:
        print(json.dumps(client.entry(args.session, args.entry), indent=1))
        return 0
    entries = client.log(args.session)
    if args.json:
        print(json.dumps(entries, indent=1))
        return 0
    for entry in entries:
        print(f"#{entry['seq']} {entry['at']} {entry['kind']} by {entry['actor']}: {entry['note']}")
        if entry["checkpoint"]:
            cp = entry["checkpoint"]
            print(f"    checkpoint round {cp['round']} (run {cp['run']}), Merkle root {cp['root']}")
        for name, ops in sorted(entry["deltas"].items()):
            if len(ops) == 1 and ops[0]["path"] == []:
                print(f"    -> {name}: full configuration ({ops[0]['op']})")
                continue
            for op in ops:
                path = ".".join(str(p) for p in op["path"])
                value = json.dumps(op.get("value")) if op["op"] == "set" else ""
                print(f"    -> {name}: {op['op']} {path} {value}".rstrip())
    return 0


_CLIENT_COMMANDS = {
    "data": _data,
    "grant": _grant,
    "audit": _audit,
    "job": _job,
    "session": _session,
}
