"""People and scripts of the web console: accounts, sign-in, browser sessions, API tokens.

Browsers handle client certificates badly, so the console does not use the federation's mTLS
identities for people. An **account** (created by ``confide console user add``) signs in with a
password and then acts as one controller identity, with exactly that identity's rights:

=========  ==========================================  ==================================
role       acts as                                     may
=========  ==========================================  ==================================
developer  the developer of the same name              submit, tune, resume, stop its jobs
owner      the party named at creation (its admin)     grant, revoke, approve; read uses
admin      a federation admin                          everything, the whole audit log
=========  ==========================================  ==================================

Security choices and their costs:

* Passwords are stored only as argon2id hashes (``argon2-cffi``, its default parameters: 64 MiB,
  3 passes, ~50 ms per check on this project's 2-core machine); an unknown name is checked
  against a dummy hash, so the reply time does not reveal which names exist.
* Sign-in is rate limited in the store (so every controller worker sees the same counts):
  :data:`MAX_FAILURES_PER_NAME` failures for one name, or :data:`MAX_FAILURES_PER_ADDRESS`
  from one address, within :data:`FAILURE_WINDOW_S` refuse further attempts until the window
  moves on. Every attempt is audited (``sign-in``, allow or deny, with the address).
* A browser session is a 256-bit random cookie; the store keeps only its SHA-256, with a CSRF
  token, an idle timeout (:data:`IDLE_TIMEOUT_S`) and an absolute lifetime
  (:data:`SESSION_LIFETIME_S`). A stale cookie is refused and audited.
* API tokens (``Authorization: Bearer``) are 256-bit random, shown once, stored as SHA-256,
  revocable; requests with a token need no CSRF token (no cookie is involved).
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import delete, func, select, update

from confide.controller.service import Caller
from confide.controller.store import Account, ApiToken, AuditEvent, SignInAttempt, Store, WebSession, utcnow
from confide.errors import ConflictError, InvalidParameterError, NotFoundError, PermissionDeniedError, RateLimitedError

__all__ = [
    "FAILURE_WINDOW_S",
    "IDLE_TIMEOUT_S",
    "MAX_FAILURES_PER_ADDRESS",
    "MAX_FAILURES_PER_NAME",
    "ROLES",
    "SESSION_LIFETIME_S",
    "Accounts",
    "SignedIn",
]

log = logging.getLogger("confide.console")

ROLES = ("developer", "owner", "admin")
MIN_PASSWORD = 12
MAX_PASSWORD = 1024
MAX_FAILURES_PER_NAME = 5
MAX_FAILURES_PER_ADDRESS = 30
FAILURE_WINDOW_S = 900
IDLE_TIMEOUT_S = 30 * 60
SESSION_LIFETIME_S = 12 * 3600
#: A session's ``last_seen_at`` is written at most this often (every page view would be a write).
TOUCH_EVERY_S = 60
#: Password checks run at once (argon2id: 64 MiB and ~50 ms of one core each).
VERIFY_AT_ONCE = 2
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


@dataclass(frozen=True)
class SignedIn:
    """An account acting through the console, and how (``session`` or ``token``)."""

    name: str
    role: str
    party: str | None
    via: str
    csrf: str | None = None

    @property
    def caller(self) -> Caller:
        """The controller identity this account acts as (the same rights as the REST API)."""
        if self.role == "owner":
            return Caller(self.party or "", "party", account=self.name)
        return Caller(self.name, self.role, account=self.name)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _check_name(name: str, field: str = "name") -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidParameterError(f"{field} must be 1..64 characters of [a-z0-9_-] starting with a letter or digit")
    return name


def _check_password(password: str) -> str:
    if not isinstance(password, str) or not MIN_PASSWORD <= len(password) <= MAX_PASSWORD:
        raise InvalidParameterError(f"password must be {MIN_PASSWORD}..{MAX_PASSWORD} characters")
    return password


def _aware(value: datetime) -> datetime:
    # SQLite hands back naive datetimes (stored as UTC).
    return value if value.tzinfo is not None else value.replace(tzinfo=utcnow().tzinfo)


class Accounts:
    """Account operations over the controller's store; each public method is one transaction."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._hasher = PasswordHasher()
        self._dummy_hash: str | None = None
        self._dummy_lock = threading.Lock()
        self._verifying = threading.BoundedSemaphore(VERIFY_AT_ONCE)

    def prepare_sign_in(self) -> None:
        """Hash the stand-in password an unknown name's sign-in is checked against.

        Then such a sign-in costs what a known name's does (no timing tells names apart). The
        console app calls it when it starts, so that the first such sign-in is not slower either.
        Administration from the CLI never signs in and skips it: each argon2id hash costs about
        0.17 s of CPU (64 MiB), which every `confide console` command paid before.
        """
        with self._dummy_lock:
            if self._dummy_hash is None:
                self._dummy_hash = self._hasher.hash(secrets.token_hex(16))

    # ------------------------------------------------------------------ administration (CLI)

    def create(self, name: str, role: str, password: str, *, party: str | None = None) -> dict:
        """Create an account; an ``owner`` administers ``party`` (its certificate name)."""
        _check_name(name)
        if role not in ROLES:
            raise InvalidParameterError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        if role == "owner":
            _check_name(party or "", "party")
        elif party is not None:
            raise InvalidParameterError(f"party is only for owner accounts, not {role}")
        hashed = self._hasher.hash(_check_password(password))
        with self.store.transaction() as db:
            if db.scalar(select(Account.id).where(Account.name == name)) is not None:
                raise ConflictError(f"account {name!r} exists already; 'confide console user password' changes it")
            db.add(Account(name=name, role=role, party=party, password_hash=hashed, created_at=utcnow()))
            self._audit(
                db, "console-admin", "account:create", f"account/{name}", "allow", {"role": role, "party": party}
            )
        return {"name": name, "role": role, "party": party}

    def set_password(self, name: str, password: str) -> None:
        """Replace an account's password and end its browser sessions."""
        hashed = self._hasher.hash(_check_password(password))
        with self.store.transaction() as db:
            account = self._account(db, name)
            account.password_hash = hashed
            self._end_sessions(db, name)
            self._audit(db, "console-admin", "account:password", f"account/{name}", "allow", {})

    def disable(self, name: str) -> None:
        """Disable an account: its sessions end and its tokens stop working."""
        with self.store.transaction() as db:
            account = self._account(db, name)
            account.disabled_at = utcnow()
            self._end_sessions(db, name)
            self._audit(db, "console-admin", "account:disable", f"account/{name}", "allow", {})

    def list(self) -> list[dict]:
        """Every account (never a hash)."""
        with self.store.transaction() as db:
            return [
                {"name": a.name, "role": a.role, "party": a.party, "disabled": a.disabled_at is not None}
                for a in db.scalars(select(Account).order_by(Account.name))
            ]

    def issue_token(self, name: str, label: str = "script") -> str:
        """A new API token for ``name`` (returned once; only its SHA-256 is stored)."""
        _check_name(label, "label")
        token = "cft_" + secrets.token_urlsafe(32)
        with self.store.transaction() as db:
            self._account(db, name)
            db.add(ApiToken(account=name, token_sha256=_digest(token), label=label, created_at=utcnow()))
            self._audit(db, "console-admin", "token:issue", f"account/{name}", "allow", {"label": label})
        return token

    def revoke_tokens(self, name: str, label: str | None = None) -> int:
        """Revoke ``name``'s tokens (those with ``label``, or all); returns how many."""
        with self.store.transaction() as db:
            query = select(ApiToken).where(ApiToken.account == name, ApiToken.revoked_at.is_(None))
            if label is not None:
                query = query.where(ApiToken.label == label)
            rows = db.scalars(query).all()
            for row in rows:
                row.revoked_at = utcnow()
            self._audit(db, "console-admin", "token:revoke", f"account/{name}", "allow", {"count": len(rows)})
            return len(rows)

    # ------------------------------------------------------------------ sign-in and sessions

    def sign_in(self, name: str, password: str, address: str) -> tuple[str, SignedIn]:
        """Check a password (rate limited, audited); returns the new session cookie and who signed in.

        The attempt is stored as a failure before the password is checked, in the transaction
        that counts the failures, so parallel guesses cannot all pass the limit in the ~50 ms an
        argon2 check takes; a right password turns it into a success afterwards.
        """
        name = (name or "")[:64]
        # A name that cannot be an account is recorded as "?": the audit log's actor column must
        # not be writable by anyone who can reach the sign-in form.
        shown = name if _NAME.fullmatch(name) else "?"
        address = (address or "unknown")[:64]
        now = utcnow()
        since = now - timedelta(seconds=FAILURE_WINDOW_S)
        with self.store.transaction() as db:
            # Rows the limits no longer count, and sessions long over, go (the audit log keeps the history).
            db.execute(delete(SignInAttempt).where(SignInAttempt.at < now - timedelta(seconds=4 * FAILURE_WINDOW_S)))
            db.execute(delete(WebSession).where(WebSession.expires_at < now - timedelta(days=1)))
            failures = [SignInAttempt.at >= since, SignInAttempt.ok.is_(False)]
            by_name = db.scalar(select(func.count()).where(SignInAttempt.name == shown, *failures))
            by_address = db.scalar(select(func.count()).where(SignInAttempt.address == address, *failures))
            limited = by_name >= MAX_FAILURES_PER_NAME or by_address >= MAX_FAILURES_PER_ADDRESS
            attempt = SignInAttempt(name=shown, address=address, at=now, ok=False)
            if limited:
                # Audited in this transaction, which commits: the refusal is raised after it.
                detail = {"address": address, "reason": "rate limited"}
                self._audit(db, shown, "sign-in", f"account/{shown}", "deny", detail)
            else:
                db.add(attempt)
            account = db.scalar(select(Account).where(Account.name == shown)) if shown != "?" else None
        if limited:
            raise RateLimitedError(
                f"too many failed sign-ins (at most {MAX_FAILURES_PER_NAME} per account and "
                f"{MAX_FAILURES_PER_ADDRESS} per address in {FAILURE_WINDOW_S // 60} minutes); try again later"
            )
        ok = self._verify(account.password_hash if account is not None else None, password or "")
        if ok and account.disabled_at is not None:
            ok = False
        token = secrets.token_urlsafe(32)
        csrf = secrets.token_urlsafe(32)
        with self.store.transaction() as db:
            if not ok:
                detail = {"address": address, "reason": "bad name or password"}
                self._audit(db, shown, "sign-in", f"account/{shown}", "deny", detail)
            else:
                db.execute(update(SignInAttempt).where(SignInAttempt.id == attempt.id).values(ok=True))
                db.add(
                    WebSession(
                        account=name,
                        token_sha256=_digest(token),
                        csrf=csrf,
                        created_at=now,
                        last_seen_at=now,
                        expires_at=now + timedelta(seconds=SESSION_LIFETIME_S),
                    )
                )
                self._audit(db, name, "sign-in", f"account/{name}", "allow", {"address": address})
        if not ok:
            raise PermissionDeniedError("wrong account name or password")
        return token, SignedIn(account.name, account.role, account.party, "session", csrf)

    def _verify(self, hashed: str | None, password: str) -> bool:
        # At most VERIFY_AT_ONCE checks at a time (each holds 64 MiB and a worker thread), so a
        # flood of sign-ins queues here instead of taking every thread the controller has.
        if hashed is None:
            self.prepare_sign_in()
        with self._verifying:
            try:
                return self._hasher.verify(hashed or self._dummy_hash, password[:MAX_PASSWORD]) and hashed is not None
            except (VerificationError, InvalidHashError):
                return False

    def session(self, cookie: str) -> SignedIn:
        """Who a session cookie belongs to; a stale, ended or unknown cookie is refused (and audited)."""
        now = utcnow()
        with self.store.transaction() as db:
            row = db.scalar(select(WebSession).where(WebSession.token_sha256 == _digest(cookie or "")))
            reason = None
            if row is None:
                reason = "unknown session"
            elif row.ended_at is not None:
                reason = "signed out"
            elif _aware(row.expires_at) <= now:
                reason = "session lifetime over"
            elif (now - _aware(row.last_seen_at)).total_seconds() > IDLE_TIMEOUT_S:
                reason = f"idle for more than {IDLE_TIMEOUT_S // 60} minutes"
            account = db.scalar(select(Account).where(Account.name == row.account)) if row is not None else None
            if reason is None and (account is None or account.disabled_at is not None):
                reason = "account disabled"
            if reason is not None and row is not None:
                # Known but stale: audited. An unknown cookie is not (anyone could send many).
                self._audit(db, row.account, "session", f"account/{row.account}", "deny", {"reason": reason})
            elif reason is None:
                if (now - _aware(row.last_seen_at)).total_seconds() > TOUCH_EVERY_S:
                    row.last_seen_at = now
                return SignedIn(account.name, account.role, account.party, "session", row.csrf)
        raise PermissionDeniedError(f"your console session is not valid ({reason}); sign in again")

    def sign_out(self, cookie: str) -> None:
        """End the session of ``cookie`` (a no-op for an unknown one)."""
        with self.store.transaction() as db:
            row = db.scalar(select(WebSession).where(WebSession.token_sha256 == _digest(cookie or "")))
            if row is not None and row.ended_at is None:
                row.ended_at = utcnow()
                self._audit(db, row.account, "sign-out", f"account/{row.account}", "allow", {})

    def token(self, token: str) -> SignedIn:
        """Who an API token belongs to (refused and audited when unknown, revoked or disabled)."""
        with self.store.transaction() as db:
            row = db.scalar(select(ApiToken).where(ApiToken.token_sha256 == _digest(token or "")))
            account = db.scalar(select(Account).where(Account.name == row.account)) if row is not None else None
            if row is None or row.revoked_at is not None or account is None or account.disabled_at is not None:
                reason = "unknown token" if row is None else "revoked token or disabled account"
                if row is not None:  # an unknown token is not audited (anyone could send many)
                    self._audit(db, row.account, "token", f"account/{row.account}", "deny", {"reason": reason})
            else:
                now = utcnow()
                if row.last_used_at is None or (now - _aware(row.last_used_at)).total_seconds() > TOUCH_EVERY_S:
                    row.last_used_at = now
                return SignedIn(account.name, account.role, account.party, "token")
        raise PermissionDeniedError(f"API token refused ({reason})")

    def refused(self, who: SignedIn, action: str, target: str, reason: str) -> None:
        """Audit a console request refused before it reached the controller (a forged form, say)."""
        with self.store.transaction() as db:
            self._audit(db, who.name, action, target, "deny", {"reason": reason, "account": who.name})

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _account(db, name: str) -> Account:
        account = db.scalar(select(Account).where(Account.name == name))
        if account is None:
            raise NotFoundError(f"no console account {name!r}; create it with 'confide console user add'")
        return account

    @staticmethod
    def _end_sessions(db, name: str) -> None:
        for row in db.scalars(select(WebSession).where(WebSession.account == name, WebSession.ended_at.is_(None))):
            row.ended_at = utcnow()

    @staticmethod
    def _audit(db, actor: str, action: str, target: str, decision: str, detail: dict) -> None:
        db.add(
            AuditEvent(
                at=utcnow(), actor=actor[:64], action=action, target=target[:255], decision=decision, detail=detail
            )
        )
