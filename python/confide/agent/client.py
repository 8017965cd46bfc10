"""HTTPS client of the controller (CLI, party agents, aggregators), with mutual TLS.

Errors come back as the ``ConfideError`` they were on the controller (from the JSON body's
``error`` kind), so a caller handles a 409 as :class:`ConflictError` and so on; a controller that
cannot be reached is :class:`TransportUnavailableError`.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any

import httpx

from confide import __version__, errors
from confide.crypto.identity import CA_CERT_FILE

__all__ = ["ControllerClient"]

_BY_STATUS = {
    400: errors.InvalidParameterError,
    403: errors.PermissionDeniedError,
    404: errors.NotFoundError,
    409: errors.ConflictError,
    413: errors.ResourceLimitError,
    422: errors.InvalidParameterError,
}


class ControllerClient:
    """One identity's connection to the controller at ``url`` (``https://host:port``)."""

    def __init__(self, url: str, *, certs_dir: str | os.PathLike, name: str, timeout_s: float = 30.0) -> None:
        root = Path(certs_dir)
        if not isinstance(url, str) or not url.startswith("https://") or len(url) <= len("https://"):
            raise errors.InvalidParameterError(
                f"controller URL must be https://HOST:PORT (the controller speaks HTTPS only), got {url!r}"
            )
        if not root.is_dir():
            raise errors.MissingFileError(f"certificate directory {root} does not exist (--certs / CONFIDE_CERTS)")
        for path in (root / f"{name}.crt", root / f"{name}.key", root / CA_CERT_FILE):
            if not path.exists():
                known = sorted(p.stem for p in root.glob("*.crt") if p.stem != "ca")
                raise errors.MissingFileError(
                    f"{path} does not exist: no identity {name!r} in {root} (--as / CONFIDE_IDENTITY); "
                    f"identities there: {', '.join(known) or 'none'}"
                )
        try:
            context = ssl.create_default_context(cafile=str(root / CA_CERT_FILE))
            context.load_cert_chain(str(root / f"{name}.crt"), str(root / f"{name}.key"))
        except ssl.SSLError as error:
            raise errors.CertificateError(
                f"cannot use identity {name!r} from {root}: {error.reason or error} "
                "(does the key match the certificate?)"
            ) from None
        self.url = url.rstrip("/")
        self.name = name
        self._http = httpx.Client(base_url=self.url, verify=context, timeout=timeout_s)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(self, method: str, path: str, body: Any = None, **params) -> Any:
        """One call; returns the decoded JSON or raises the matching ``ConfideError``."""
        try:
            response = self._http.request(method, path, json=body, params=params or None)
        except ssl.SSLError as error:
            raise errors.CertificateError(
                f"controller {self.url} refused {self.name!r} or is not the federation's controller "
                f"(TLS: {error.reason or error}); the certificates must come from the federation's CA"
            ) from None
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadError, httpx.RemoteProtocolError) as error:
            raise errors.TransportUnavailableError(f"controller {self.url} unreachable: {error}") from None
        except httpx.InvalidURL as error:
            raise errors.InvalidParameterError(f"controller URL {self.url!r} is not usable: {error}") from None
        except httpx.TimeoutException as error:
            raise errors.TransportUnavailableError(f"controller {self.url} timed out: {error}") from None
        if response.status_code >= 400:
            try:
                payload = response.json()
                kind = getattr(errors, str(payload.get("error")), None)
                detail = payload.get("detail", response.text)
            except ValueError:
                kind, detail = None, response.text
            if not (isinstance(kind, type) and issubclass(kind, errors.ConfideError)):
                kind = _BY_STATUS.get(response.status_code, errors.ConfideError)
            raise kind(str(detail))
        return response.json()

    # Convenience wrappers, one per endpoint.
    def whoami(self) -> dict:
        """The identity the controller sees."""
        return self.request("GET", "/v1/whoami")

    def register(self, *, address: str | None = None, datasets: list[dict] | None = None) -> dict:
        """Register this identity (and publish a party's dataset metadata)."""
        return self.request(
            "POST", "/v1/register", {"address": address, "datasets": datasets or [], "version": __version__}
        )

    def parties(self) -> list[dict]:
        """Registered identities."""
        return self.request("GET", "/v1/parties")

    def datasets(self) -> list[dict]:
        """Published dataset metadata."""
        return self.request("GET", "/v1/datasets")

    def grant(
        self,
        dataset: str,
        developer: str,
        *,
        expires_at: str | None = None,
        job_id: str | None = None,
        approval: bool = False,
    ) -> dict:
        """Grant ``developer`` the use of one of this party's datasets (optionally scoped)."""
        body = {"dataset": dataset, "developer": developer, "approval": approval}
        if expires_at is not None:
            body["expires_at"] = expires_at
        if job_id is not None:
            body["job_id"] = job_id
        return self.request("POST", "/v1/grants", body)

    def uses(self) -> list[dict]:
        """Sessions using this party's datasets (a developer: its own; an admin: all)."""
        return self.request("GET", "/v1/uses")

    def approve(self, token: str) -> dict:
        """Approve a session's use of this party's datasets."""
        return self.request("POST", f"/v1/sessions/{token}/approve")

    def revoke(self, dataset: str, developer: str) -> dict:
        """Revoke a grant."""
        return self.request("DELETE", f"/v1/grants/{dataset}/{developer}")

    def grants(self) -> list[dict]:
        """Grants visible to this identity."""
        return self.request("GET", "/v1/grants")

    def audit(self, *, after: int = 0, limit: int = 200) -> list[dict]:
        """Audit events."""
        return self.request("GET", "/v1/audit", after=after, limit=limit)

    def submit(self, spec: dict) -> dict:
        """Submit a job; returns the session."""
        return self.request("POST", "/v1/jobs", {"spec": spec})

    def sessions(self) -> list[dict]:
        """Sessions of this identity."""
        return self.request("GET", "/v1/sessions")

    def status(self, token: str) -> dict:
        """A session's status."""
        return self.request("GET", f"/v1/sessions/{token}")

    def log(self, token: str) -> list[dict]:
        """A session's log."""
        return self.request("GET", f"/v1/sessions/{token}/log")

    def entry(self, token: str, seq: int) -> dict:
        """One log entry in full."""
        return self.request("GET", f"/v1/sessions/{token}/entries/{seq}")

    def tune(
        self,
        token: str,
        *,
        settings: dict | None = None,
        fl_data: dict | None = None,
        add_parties: dict | None = None,
        base_seq: int | None = None,
    ) -> dict:
        """Tune a session."""
        body = {"settings": settings or {}, "fl_data": fl_data, "add_parties": add_parties, "base_seq": base_seq}
        return self.request("POST", f"/v1/sessions/{token}/tune", body)

    def resume(self, token: str) -> dict:
        """Resume a session from its last checkpoint."""
        return self.request("POST", f"/v1/sessions/{token}/resume")

    def cancel(self, token: str) -> dict:
        """Cancel a session."""
        return self.request("POST", f"/v1/sessions/{token}/cancel")

    def sync(self, reports: list[dict]) -> dict:
        """An agent's heartbeat and reports."""
        return self.request("POST", "/v1/agent/sync", {"reports": reports})
