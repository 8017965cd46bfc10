"""The controller's identities and dataset metadata: registration, parties, datasets.

One concern of :class:`confide.controller.service.Controller` (a mixin: its methods use the
controller's store, clock and caches set in ``Controller.__init__``).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select

from confide.controller.common import (
    MAX_COLUMNS,
    MAX_DATASETS,
    Caller,
    _aware,
    _check_name,
    _require,
)
from confide.controller.store import (
    Dataset,
    Grant,
    Party,
)
from confide.data.catalog import MAX_PUBLISHED_CATEGORIES as MAX_CATEGORIES
from confide.errors import (
    InvalidParameterError,
)


class Registry:
    """Identities and dataset metadata: registration, parties, datasets."""

    # ------------------------------------------------------------------ identities and metadata

    def register(
        self,
        caller: Caller,
        *,
        address: str | None,
        datasets: list[dict],
        cert_sha256: str,
        cert_expires_at: datetime | None = None,
        version: str | None = None,
    ) -> dict:
        """Register (or refresh) the caller; a party publishes its datasets' metadata (replacing its list)."""
        _require(caller, "party", "service", "developer", "admin")
        if caller.role != "party" and datasets:
            raise InvalidParameterError("datasets: only parties publish datasets")
        if len(datasets) > MAX_DATASETS:
            raise InvalidParameterError(f"datasets: at most {MAX_DATASETS} per party, got {len(datasets)}")
        checked = [self._check_dataset(i, d) for i, d in enumerate(datasets)]
        names = [d["name"] for d in checked]
        if len(set(names)) != len(names):
            raise InvalidParameterError("datasets: names must be unique per party")
        now = self._now()
        with self.store.transaction() as db:
            party = db.scalar(select(Party).where(Party.name == caller.name))
            if party is None:
                party = Party(name=caller.name, role=caller.role, registered_at=now, last_seen_at=now, cert_sha256="")
                db.add(party)
            party.role, party.address, party.cert_sha256, party.last_seen_at = caller.role, address, cert_sha256, now
            party.cert_expires_at, party.version = cert_expires_at, version
            db.flush()
            if caller.role == "party":
                existing = {d.name: d for d in db.scalars(select(Dataset).where(Dataset.owner == caller.name))}
                for name in sorted(set(existing) - set(names)):
                    # Withdrawn by its owner: unpublished, and its grants go with it (audited).
                    withdrawn = existing.pop(name)
                    revoked = [g.developer for g in db.scalars(select(Grant).where(Grant.dataset_id == withdrawn.id))]
                    db.execute(delete(Grant).where(Grant.dataset_id == withdrawn.id))
                    db.delete(withdrawn)
                    self._audit(db, caller, "withdraw", f"{caller.name}/{name}", "info", {"grants_removed": revoked})
                for item in checked:
                    row = existing.get(item["name"])
                    if row is None:
                        row = Dataset(owner=caller.name, name=item["name"])
                        db.add(row)
                    row.columns, row.rows = item["columns"], item["rows"]
                    row.description, row.source, row.updated_at = item["description"], item["source"], now
            self._audit(db, caller, "register", caller.name, "info", {"role": caller.role, "datasets": names})
        return {"name": caller.name, "role": caller.role, "datasets": names}

    @staticmethod
    def _check_dataset(index: int, item: Any) -> dict:
        where = f"datasets[{index}]"
        if not isinstance(item, dict):
            raise InvalidParameterError(f"{where} must be a mapping")
        allowed = {"name", "schema", "rows", "description", "source"}
        extra = set(item) - allowed
        if extra:
            raise InvalidParameterError(
                f"{where}: unknown fields {sorted(extra)} (only metadata is accepted: {sorted(allowed)})"
            )
        name = _check_name(item.get("name"), f"{where}.name")
        schema = item.get("schema")
        if not isinstance(schema, list) or not 1 <= len(schema) <= MAX_COLUMNS:
            raise InvalidParameterError(f"{where}.schema must list 1..{MAX_COLUMNS} columns")
        columns = []
        for number, column in enumerate(schema):
            if (
                not isinstance(column, dict)
                or not isinstance(column.get("name"), str)
                or not 1 <= len(column["name"]) <= 128
                or column.get("dtype") not in ("float", "int", "str")
                or set(column) - {"name", "dtype", "missing", "categories"}
                or not isinstance(column.get("missing", False), bool)
            ):
                raise InvalidParameterError(
                    f"{where}.schema[{number}] must be {{name: 1..128 chars, dtype: float|int|str, missing: bool, "
                    f"categories: [str]}}, got {str(column)[:300]}"
                )
            checked = {"name": column["name"], "dtype": column["dtype"], "missing": column.get("missing", False)}
            if "categories" in column:
                categories = column["categories"]
                if (
                    column["dtype"] != "str"
                    or not isinstance(categories, list)
                    or len(categories) > MAX_CATEGORIES
                    or not all(isinstance(c, str) and 1 <= len(c) <= 128 for c in categories)
                ):
                    raise InvalidParameterError(
                        f"{where}.schema[{number}].categories must be a list of at most {MAX_CATEGORIES} strings "
                        "of 1..128 characters, on a str column"
                    )
                checked["categories"] = sorted(set(categories))
            columns.append(checked)
        rows = item.get("rows")
        if isinstance(rows, bool) or not isinstance(rows, int) or not 0 <= rows <= 10**12:
            raise InvalidParameterError(f"{where}.rows must be an int in [0, 10^12], got {rows!r}")
        description = item.get("description", "") or ""
        source = item.get("source", "") or ""
        if not isinstance(description, str) or len(description) > 4096:
            raise InvalidParameterError(f"{where}.description must be a string of at most 4096 characters")
        if not isinstance(source, str) or len(source) > 64:
            raise InvalidParameterError(f"{where}.source must be a string of at most 64 characters")
        return {"name": name, "columns": columns, "rows": rows, "description": description, "source": source}

    def parties(self, caller: Caller) -> list[dict]:
        """Registered identities with their liveness."""
        now = self._now()
        with self.store.transaction() as db:
            rows = list(db.scalars(select(Party).order_by(Party.name)))
        out = []
        for p in rows:
            seen = self._last_seen(p)
            out.append(
                {
                    "name": p.name,
                    "role": p.role,
                    "address": p.address,
                    "last_seen_s": round((now - seen).total_seconds(), 3),
                    "online": now - seen < timedelta(seconds=self.alive_s),
                    "cert_expires_at": _aware(p.cert_expires_at).isoformat() if p.cert_expires_at else None,
                    "version": p.version,
                }
            )
        return out

    def _last_seen(self, party: Party) -> datetime:
        """The stored last-seen time, or this process's own later heartbeat (not yet written)."""
        stored = _aware(party.last_seen_at)
        heard = self._heard.get(party.name)
        return heard if heard is not None and heard > stored else stored

    def datasets(self, caller: Caller) -> list[dict]:
        """Published dataset metadata, with whether the caller may use each."""
        with self.store.transaction() as db:
            granted = {
                g.dataset_id
                for g in db.scalars(select(Grant).where(Grant.developer == caller.name, Grant.revoked_at.is_(None)))
            }
            return [
                {
                    "owner": d.owner,
                    "name": d.name,
                    "schema": d.columns,
                    "rows": d.rows,
                    "description": d.description,
                    "source": d.source,
                    "granted": d.id in granted or d.owner == caller.name,
                }
                for d in db.scalars(select(Dataset).order_by(Dataset.owner, Dataset.name))
            ]
