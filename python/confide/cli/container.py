"""``confide container run ROLE ... | health``: the container image's entry point.

The image (``deploy/image``, ``scripts/build-image.sh``) is one image for every role; its entry
point is ``confide container`` and the role is the command a deployment gives it:
``run controller ...``, ``run aggregator ...`` or ``run agent ...`` with that role's own options.

Before the role starts, ``run`` checks what a container needs and a wrong deployment gets wrong:

* its identity's secret is mounted (``<name>.crt``, ``<name>.key``, ``ca.crt`` in ``--certs``):
  otherwise it names the missing file and the mount, and exits 2;
* the federation CA's private key is not mounted anywhere it can read under the secrets' root
  (``/etc/confide`` unless ``CONFIDE_SECRETS_ROOT`` says otherwise): a service or hospital
  container holding it could issue any identity, so it refuses to start, naming the file, and
  exits 2. Only the operator signs, outside these containers (docs/operations.md).

It then writes ``$CONFIDE_RUN_DIR/health.json`` (``/run/confide``: a tmpfs in a read-only
container) for ``container health``, the image's health check, which asks the role's own health
endpoint: the controller's ``GET /v1/health`` and the aggregator's ``Health`` RPC over mutual TLS
as the container's own identity; an agent is healthy while its last sync with the controller is
recent (``--alive-file``, touched after each one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from confide.errors import ConfideError, InvalidParameterError, MissingFileError

__all__ = ["ROLES", "add_commands", "dispatch"]

#: The roles a container runs; each is the ``confide`` command of the same name.
ROLES = ("controller", "aggregator", "agent")
#: Seconds an agent may go without a sync before its container is unhealthy, beyond 3 intervals.
AGENT_GRACE_S = 30.0


def add_commands(commands) -> None:
    """Register ``confide container`` on the top-level subparsers."""
    container = commands.add_parser("container", help="the container image's entry point (run ROLE, health)")
    sub = container.add_subparsers(dest="container_command", required=True)
    run = sub.add_parser("run", help="check the mounted secrets, then run a role (controller, aggregator, agent)")
    run.add_argument("role", choices=ROLES)
    run.add_argument("role_args", nargs=argparse.REMAINDER, help="the role's own options")
    sub.add_parser("health", help="exit 0 when the role this container runs answers its health endpoint")


def _run_dir() -> Path:
    return Path(os.environ.get("CONFIDE_RUN_DIR") or "/run/confide")


def _secrets_root() -> Path:
    return Path(os.environ.get("CONFIDE_SECRETS_ROOT") or "/etc/confide")


def dispatch(args, parse, run) -> int:
    """Run ``confide container``: ``parse`` reads a role's command line and ``run`` runs it (cli.main's)."""
    if args.container_command == "health":
        return _health()
    role_args = parse([args.role, *args.role_args])
    certs = Path(role_args.certs)
    name = role_args.name
    check_secrets(certs, name, args.role)
    refuse_ca_key(_secrets_root(), certs)
    health = {"role": args.role, "certs": str(certs.resolve()), "name": name}
    if args.role in ("controller", "aggregator"):
        health["port"] = int(role_args.listen.rpartition(":")[2])
    else:
        alive = role_args.alive_file or str(_run_dir() / "agent-alive")
        role_args.alive_file = alive
        health.update(alive_file=alive, interval_s=role_args.interval)
    run_dir = _run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "health.json").write_text(json.dumps(health))
    return run(role_args)


def check_secrets(certs: Path, name: str, role: str) -> None:
    """Raise naming the first of the identity's files that is not mounted."""
    for path in (certs / f"{name}.crt", certs / f"{name}.key", certs / "ca.crt"):
        if not path.is_file():
            raise MissingFileError(
                f"the {role}'s secret is not mounted: {path} is missing (mount the certificate secret of {name}, "
                f"holding {name}.crt, {name}.key and ca.crt, at {certs})"
            )


def refuse_ca_key(root: Path, certs: Path) -> None:
    """Raise if a private key belonging to the federation CA is readable under ``root`` or ``certs``.

    A file named ``ca.key`` counts, and so does any PEM private key whose public key is the CA's.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    ca_public = x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes()).public_key()
    ca_bytes = ca_public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    seen: set[Path] = set()
    for base in (root, certs):
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            real = path.resolve()
            if real in seen or not real.is_file() or real.stat().st_size > 64 * 1024:
                continue
            seen.add(real)
            holds_ca_key = path.name == "ca.key"
            if not holds_ca_key:
                try:
                    data = real.read_bytes()
                except OSError:
                    continue
                if b"PRIVATE KEY-----" not in data:
                    continue
                try:
                    key = serialization.load_pem_private_key(data, password=None)
                except (ValueError, TypeError):
                    continue
                holds_ca_key = (
                    key.public_key().public_bytes(
                        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
                    )
                    == ca_bytes
                )
            if holds_ca_key:
                raise InvalidParameterError(
                    f"the federation CA's private key is mounted at {path}: a container that can read it could "
                    "issue any identity; only the operator signs (confide certs sign, outside the federation's "
                    "containers). Remove it from this container's secrets"
                )


def _health() -> int:
    path = _run_dir() / "health.json"
    try:
        health = json.loads(path.read_text())
    except (OSError, ValueError):
        print(f"confide container health: {path} is missing: the role has not started", file=sys.stderr)
        return 1
    try:
        if health["role"] == "agent":
            age = time.time() - os.stat(health["alive_file"]).st_mtime
            limit = 3 * float(health["interval_s"]) + AGENT_GRACE_S
            if age > limit:
                print(f"agent: no sync with the controller for {age:.0f} s (limit {limit:.0f} s)", file=sys.stderr)
                return 1
            return 0
        if health["role"] == "controller":
            from confide.agent.client import ControllerClient

            with ControllerClient(
                f"https://localhost:{health['port']}", certs_dir=health["certs"], name=health["name"], timeout_s=5.0
            ) as client:
                client.request("GET", "/v1/health")
            return 0
        from confide.crypto.identity import Identity
        from confide.transport import tls
        from confide.v1 import runtime_pb2 as pb
        from confide.v1 import runtime_pb2_grpc as rpc

        identity = Identity.load(health["certs"], health["name"])
        with tls.channel(f"localhost:{health['port']}", identity) as channel:
            rpc.AggregationStub(channel).Health(pb.HealthRequest(), timeout=5.0)
        return 0
    except FileNotFoundError as error:
        print(f"{health['role']}: not alive yet ({error.filename} missing)", file=sys.stderr)
        return 1
    except (ConfideError, OSError) as error:
        print(f"{health['role']}: {error}", file=sys.stderr)
        return 1
    except Exception as error:  # grpc.RpcError and kin: the endpoint did not answer
        print(f"{health['role']}: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
