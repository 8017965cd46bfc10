"""``ray``: one Ray actor per partition, on a cluster the party's operator runs or a local one.

``address``: ``local`` (or none) starts a Ray instance on this machine for the party process and
stops it with the job: a ``ray start --head --block`` child process on a free port, which the
party process then joins, rather than ``ray.init()`` starting Ray's daemons itself. Ray starts its
daemons with a Python ``preexec_fn`` after ``fork``, and in a process where gRPC threads are
running (the party's own transport) that child can hang before it ever runs the daemon; the
instance then never comes up (seen here: "Timed out waiting for file .../gcs_server_port").
Anything else (``auto``, ``HOST:PORT``, ``ray://HOST:PORT``) connects to a running cluster
(``ray start --head`` on the silo's head node, ``ray start --address ...`` on each worker node).
Workers must be able to import ``confide`` (the same version, installed on every node); they
read the partitions from paths the party process lists, so the dataset must sit where every node
sees it (a shared or replicated filesystem inside the silo). ``ray start`` turns on Ray's token
authentication: the party process needs ``RAY_AUTH_MODE=token`` and the cluster's token
(``~/.ray/auth_token`` or ``RAY_AUTH_TOKEN_PATH``) to join.

Fault tolerance: each actor restarts up to ``max_restarts`` times when its worker process or
node dies and is built again from its arguments (a partition holder reads its file again); a call
that was running or queued on it is retried (``max_task_retries``). What a holder learned after
it was built is gone: a histogram holder asks for the tree's gradients again (the host re-sends
them), and a data-parallel holder's local optimizer state (Adam's moments) starts over.

What crosses to workers is checked by :func:`confide.compute.base.check_shippable` before Ray
serializes it: the partition's path and row count, the job's FL_Data mapping, model weights,
never a secret key. Ray spills objects that do not fit its object store to its temp directory
(``/tmp/ray`` by default, ``ray start --temp-dir`` to move it) on each node's own disk: keep it
on the silo's encrypted storage like the data itself.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from confide.compute.base import Holders, LocalCompute, check_shippable
from confide.errors import ConfideError, InvalidParameterError

__all__ = ["RayCompute"]

#: Restarts of a dead holder, and retries of a call it did not finish.
MAX_RESTARTS = 3


def _ray():
    try:
        import ray
    except ImportError:
        raise InvalidParameterError(
            "compute engine 'ray' needs Ray in the party's environment: pip install 'confide[ray]'"
        ) from None
    return ray


class _RayHolders(Holders):
    def __init__(self, ray, actors: list[Any]) -> None:
        self.ray = ray
        self.actors = actors
        self.count = len(actors)

    def call(self, method: str, *args: Any) -> list[Any]:
        check_shippable(args, f"ray {method}")
        shared = [self.ray.put(a) if _large(a) else a for a in args]
        return _get(self.ray, [getattr(actor, method).remote(*shared) for actor in self.actors])

    def call_each(self, method: str, arguments: list[tuple]) -> list[Any]:
        if len(arguments) != self.count:
            raise ValueError(f"call_each {method}: {len(arguments)} argument tuples for {self.count} holders")
        for args in arguments:
            check_shippable(args, f"ray {method}")
        return _get(
            self.ray,
            [getattr(actor, method).remote(*args) for actor, args in zip(self.actors, arguments, strict=True)],
        )

    def pids(self) -> list[int]:
        return _get(self.ray, [actor.pid.remote() for actor in self.actors])

    def close(self) -> None:
        for actor in self.actors:
            try:
                self.ray.kill(actor)
            except Exception:  # noqa: BLE001 - the cluster may be gone; nothing left to release
                pass
        self.actors = []


def _large(value: Any) -> bool:
    # Put big arrays and byte strings (weights, ciphertexts) in the object store once, not once per actor.
    size = len(value) if isinstance(value, bytes | bytearray) else getattr(value, "nbytes", 0)
    return size > 1 << 16


def _get(ray, references: list) -> list:
    """``ray.get``, with a worker's own error raised as itself (its message names the step or field)."""
    try:
        return ray.get(references)
    except ray.exceptions.RayError as error:
        cause: BaseException = error
        while isinstance(getattr(cause, "cause", None), BaseException) and cause.cause is not cause:
            cause = cause.cause
        if isinstance(cause, ConfideError):
            raise cause from None
        raise InvalidParameterError(
            f"compute engine 'ray': a worker failed: {type(cause).__name__}: {str(cause)[-500:]}"
        ) from None


def _join_with_token() -> None:
    """Make this process present the head's token, as Ray's own ``ray.init()`` does for a cluster it starts.

    Ray reads ``RAY_AUTH_MODE`` into its cached config; setting the variable after Ray was
    imported is not seen, so its own refresh runs (it respects a mode the operator set).
    """
    if "RAY_AUTH_MODE" in os.environ:
        return
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # another Ray layout: the variable alone (read if Ray loads its config later)
        os.environ["RAY_AUTH_MODE"] = "token"
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


class _LocalHead:
    """``ray start --head --block`` as a child of the party process; stopping it stops its daemons."""

    def __init__(self, num_cpus: int | None) -> None:
        import socket
        import subprocess
        import sys
        import time
        from pathlib import Path

        # Ray's fixed default ports (GCS, dashboard, client server, dashboard agent HTTP): a port the
        # kernel hands out for one component must not be one another component takes by default
        # (CI once drew 52365 for the GCS, the dashboard agent's default, and ray start refused).
        taken = {6379, 8265, 10001, 52365}

        def free_port() -> int:
            while True:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", 0))
                    port = probe.getsockname()[1]
                if port not in taken:
                    taken.add(port)
                    return port

        import shutil
        import tempfile

        executable = Path(sys.executable).parent / "ray"
        found = str(executable) if executable.exists() else shutil.which("ray")
        if found is None:
            raise InvalidParameterError(
                "compute engine 'ray': no `ray` command next to this Python or on PATH: pip install 'confide[ray]'"
            )
        port = free_port()
        command = [
            found,
            "start",
            "--head",
            f"--port={port}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            "--block",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ]
        if num_cpus is not None:
            command.append(f"--num-cpus={num_cpus}")
        # Token authentication on (an instance reachable on the node's address); the token is
        # ~/.ray/auth_token. `ray start` refuses to run without one (Ray 2.60), so a machine that
        # never had one (a fresh CI host) gets it made first, as `ray get-auth-token --generate` does.
        env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token")}
        if not any(k in os.environ for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")):
            if not (Path.home() / ".ray" / "auth_token").exists():
                subprocess.run([found, "get-auth-token", "--generate"], capture_output=True, env=env, check=False)
        # its output to a file: a pipe nobody reads while the job runs could fill and block it
        self.log = tempfile.NamedTemporaryFile(prefix="confide-ray-head-", suffix=".log", delete=False)  # noqa: SIM115
        self.process = subprocess.Popen(
            command, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        self.address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            if self.process.poll() is not None:
                output = Path(self.log.name).read_text(errors="replace")[-1500:]
                self.stop()
                raise InvalidParameterError(f"compute engine 'ray': ray start --head exited: {output}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise InvalidParameterError(
                        "compute engine 'ray': the local Ray head did not open its port in 120 s"
                    ) from None
                time.sleep(0.2)
        _join_with_token()

    def stop(self) -> None:
        """SIGTERM: the head drains and stops the daemons it started."""
        import subprocess

        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)


class RayCompute(LocalCompute):
    """Partitions held by Ray actors."""

    name = "ray"

    def __init__(self, address: str | None = None, *, num_cpus: int | None = None) -> None:
        ray = _ray()
        self.ray = ray
        self.address = address or "local"
        self.started = False
        self._tasks: dict = {}
        self._head: _LocalHead | None = None
        if not ray.is_initialized():
            options: dict[str, Any] = {"include_dashboard": False, "logging_level": "WARNING", "log_to_driver": False}
            if self.address == "local":
                # A new instance of our own; without an address Ray would join any cluster it finds.
                self._head = _LocalHead(num_cpus)
                options["address"] = self._head.address
                self.started = True
            else:
                options["address"] = self.address
            try:
                ray.init(**options)
            except Exception as error:  # Ray raises bare Exception too (a node that timed out starting)
                hint = ""
                if "auth" in repr(error.__cause__ or error).lower() or "token" in str(error).lower():
                    hint = (
                        " (the cluster uses Ray's token authentication: give this process RAY_AUTH_MODE=token "
                        "and the cluster's token, in ~/.ray/auth_token or RAY_AUTH_TOKEN_PATH)"
                    )
                where = (
                    "start a local Ray instance"
                    if self.address == "local"
                    else f"reach the Ray cluster at {self.address!r}"
                )
                if self._head is not None:
                    self._head.stop()
                raise InvalidParameterError(f"compute engine 'ray': cannot {where}: {error}{hint}") from None

    def hold(self, holder_class: type, arguments: list[tuple]) -> Holders:
        """One actor per partition, spread over the cluster's nodes."""
        for args in arguments:
            check_shippable(args, f"ray {holder_class.__name__}")
        actor_class = self.ray.remote(num_cpus=0.01, max_restarts=MAX_RESTARTS, max_task_retries=MAX_RESTARTS)(
            holder_class
        )
        actors = [actor_class.options(scheduling_strategy="SPREAD").remote(*args) for args in arguments]
        return _RayHolders(self.ray, actors)

    def map(self, function: Callable[..., Any], items: list[tuple]) -> list[Any]:
        """One Ray task per item (retried up to ``MAX_RESTARTS`` times if its worker dies)."""
        for item in items:
            check_shippable(item, f"ray {function.__name__}")
        remote = self._tasks.get(function)
        if remote is None:
            remote = self._tasks[function] = self.ray.remote(max_retries=MAX_RESTARTS)(function)
        return _get(self.ray, [remote.remote(*item) for item in items])

    @property
    def workers(self) -> int:
        """The cluster's CPUs."""
        return max(1, int(self.ray.cluster_resources().get("CPU", 1)))

    def describe(self) -> dict[str, Any]:
        """Engine, cluster address and its nodes."""
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        return {"engine": self.name, "address": self.address, "nodes": len(nodes)}

    def close(self) -> None:
        """Shut down the Ray instance this engine started (a cluster it joined keeps running)."""
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()
        if self._head is not None:
            self._head.stop()
            self._head = None
