"""The CA directory's ledger of issued certificates (``issued.json``), revocation and the CRL.

Every certificate the CA issues is recorded here (serial, name, role, validity, where its key
stays); :func:`revoke_identity` marks a name's certificates revoked and :func:`write_crl` signs
``revoked.crl.pem`` from the ledger, with a CRL number that grows by one with every write.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from confide.crypto.identity import (
    CA_CERT_FILE,
    check_name,
    load_cert,
    load_key,
    read_file,
    subject_attribute,
)
from confide.errors import CertificateError, InvalidParameterError, MissingFileError
from confide.transport.pki import (
    BACKDATE,
    CA_KEY_FILE,
    CRL_DAYS,
    CRL_FILE,
    ISSUED_DIR,
    ISSUED_LEDGER,
    check_days,
    write_file,
)

# ----------------------------------------------------------------------------------------------------------------------
# Public API: the ledger of issued certificates, revocation and rotation

#: CRLReason names ``--reason`` may use to set the reason code; any other text is kept in the ledger only.
_REASON_FLAGS = {flag.name: flag for flag in x509.ReasonFlags if flag is not x509.ReasonFlags.unspecified}


def serial_hex(serial: int) -> str:
    """A serial number as the ledger writes it (lower-case hex)."""
    return format(serial, "x")


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="seconds")


def hosts_of(cert: x509.Certificate) -> list[str]:
    """The DNS names and IP addresses a certificate serves, in its own order."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    # In the certificate's order, so that a rotated certificate names its hosts as the old one did.
    return [str(n.value) for n in sans if isinstance(n, (x509.IPAddress, x509.DNSName))]


class _Ledger:
    """``issued.json``, read and written under an exclusive lock of the CA directory."""

    def __init__(self, root: Path, data: dict) -> None:
        self.root = root
        self.data = data

    @property
    def entries(self) -> list[dict]:
        return self.data["certificates"]

    def add(self, cert: x509.Certificate, *, key_held: str) -> None:
        self.entries.append(
            {
                "serial": serial_hex(cert.serial_number),
                "name": subject_attribute(cert, NameOID.COMMON_NAME, "common name (CN)"),
                "role": subject_attribute(cert, NameOID.ORGANIZATIONAL_UNIT_NAME, "organizational unit (OU)"),
                "hosts": hosts_of(cert),
                "issued_at": _iso(datetime.now(timezone.utc)),
                "not_after": _iso(cert.not_valid_after_utc),
                "key_held": key_held,
                "revoked_at": None,
                "reason": None,
                "reason_code": None,
            }
        )

    def of(self, name: str) -> list[dict]:
        return [e for e in self.entries if e["name"] == name]

    def revoke(self, entries: list[dict], reason_code: str, reason: str) -> list[dict]:
        """Mark ``entries`` revoked (those already revoked stay as they were); returns the newly revoked."""
        now = _iso(datetime.now(timezone.utc))
        fresh = [e for e in entries if e["revoked_at"] is None]
        for entry in fresh:
            entry.update(revoked_at=now, reason=reason, reason_code=reason_code)
        return fresh

    def write_crl(
        self,
        ca_key: ec.EllipticCurvePrivateKey,
        ca_cert: x509.Certificate,
        days: int = CRL_DAYS,
    ) -> int:
        """Sign and write ``revoked.crl.pem`` with every revoked serial; returns its CRL number."""
        number = int(self.data.get("crl_number", 0)) + 1
        now = datetime.now(timezone.utc)
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(ca_cert.subject)
            .last_update(now - BACKDATE)
            .next_update(
                min(
                    now + timedelta(days=days),
                    max(ca_cert.not_valid_after_utc, now + BACKDATE),
                )
            )
            .add_extension(x509.CRLNumber(number), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),
                critical=False,
            )
        )
        for entry in self.entries:
            if entry["revoked_at"] is None:
                continue
            revoked = (
                x509.RevokedCertificateBuilder()
                .serial_number(int(entry["serial"], 16))
                .revocation_date(datetime.fromisoformat(entry["revoked_at"]))
            )
            flag = _REASON_FLAGS.get(entry.get("reason_code") or "")
            if flag is not None:  # RFC 5280: "unspecified" is expressed by leaving the extension out
                revoked = revoked.add_extension(x509.CRLReason(flag), critical=False)
            builder = builder.add_revoked_certificate(revoked.build())
        crl = builder.sign(ca_key, hashes.SHA256())
        write_file(self.root / CRL_FILE, crl.public_bytes(serialization.Encoding.PEM), 0o644)
        self.data["crl_number"] = number
        return number


def _backfill(root: Path) -> dict:
    """A ledger for a CA directory made before ledgers existed: the certificates it still holds."""
    data: dict = {"version": 1, "crl_number": 0, "certificates": []}
    try:
        ca = load_cert(read_file(root / CA_CERT_FILE, "CA certificate"), "ca.crt")
    except (MissingFileError, CertificateError):
        return data
    ledger = _Ledger(root, data)
    seen: set[int] = set()
    for path, key_held in [(p, "ca") for p in sorted(root.glob("*.crt"))] + [
        (p, "site") for p in sorted((root / ISSUED_DIR).glob("*.crt"))
    ]:
        if path.name == CA_CERT_FILE:
            continue
        try:
            cert = x509.load_pem_x509_certificate(path.read_bytes())
            cert.verify_directly_issued_by(ca)
        except (OSError, ValueError, TypeError, InvalidSignature):
            continue
        if cert.serial_number in seen:
            continue
        seen.add(cert.serial_number)
        held = key_held if (key_held == "site" or (root / f"{path.stem}.key").exists()) else "site"
        ledger.add(cert, key_held=held)
    return data


@contextmanager
def open_ledger(root: Path, *, fresh: bool = False) -> Iterator[_Ledger]:
    """The CA directory's ledger, locked against concurrent ``certs`` commands; written back on success."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = root / ISSUED_LEDGER
    # The directory itself is the lock (flock on its descriptor): no lock file to leave behind.
    lock = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if fresh:
                data = {"version": 1, "crl_number": 0, "certificates": []}
            elif path.exists():
                try:
                    data = json.loads(path.read_text())
                    if not isinstance(data.get("certificates"), list):
                        raise ValueError("no certificates list")
                except ValueError as error:
                    raise CertificateError(f"{path} is not a Confide ledger of issued certificates: {error}") from None
            else:
                data = _backfill(root)
            ledger = _Ledger(root, data)
            yield ledger
            write_file(path, json.dumps(ledger.data, indent=1).encode(), 0o644)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    finally:
        os.close(lock)


def ca_pair(root: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """The CA's key and certificate from its directory, checked to belong together."""
    ca_cert = load_cert(read_file(root / CA_CERT_FILE, "CA certificate"), "ca.crt")
    ca_key = load_key(read_file(root / CA_KEY_FILE, "CA key"), "ca.key")
    if ca_key.public_key().public_numbers() != ca_cert.public_key().public_numbers():
        raise CertificateError(f"{root / CA_KEY_FILE} does not belong to {root / CA_CERT_FILE}")
    return ca_key, ca_cert


def known_name(ledger: _Ledger, name: object, field: str) -> str:
    """``name``, checked to be an identity this CA issued (``field`` names the argument)."""
    name = check_name(name, field)
    if not ledger.of(name):
        known = sorted({e["name"] for e in ledger.entries})
        raise InvalidParameterError(
            f"{field} {name!r} is not an identity this CA issued (it issued: {', '.join(known) or 'none'})"
        )
    return name


@dataclass(frozen=True)
class Revocation:
    """What :func:`revoke_identity` (or :func:`rotate_identity`) did.

    ``revoked``: ledger entries revoked now; ``already``: entries of the name revoked before;
    ``crl``: the rewritten CRL and ``crl_number`` its number.
    """

    name: str
    revoked: list[dict]
    already: list[dict]
    crl: Path
    crl_number: int
    issued: Path | None = None


def issued_certificates(ca_directory: str | os.PathLike[str]) -> list[dict]:
    """The ledger: every certificate the CA issued (serial in hex, name, role, validity, revocation)."""
    with open_ledger(Path(ca_directory)) as ledger:
        return [dict(e) for e in ledger.entries]


def revoke_identity(
    ca_directory: str | os.PathLike[str],
    name: str,
    *,
    reason: str | None = None,
    days: int = CRL_DAYS,
) -> Revocation:
    """Revoke every certificate the CA issued to ``name`` and rewrite ``revoked.crl.pem``.

    Parameters
    ----------
    ca_directory : str or os.PathLike
        The federation's CA directory (``ca.crt``, ``ca.key``, ``issued.json``).
    name : str
        The identity; it must be one the CA issued.
    reason : str, optional
        Kept in the ledger. A CRLReason name (``key_compromise``, ``affiliation_changed``,
        ``superseded``, ``cessation_of_operation``, ``privilege_withdrawn``...) also sets the
        CRL entry's reason code.
    days : int
        Validity of the CRL (nextUpdate), 1..36500 days.

    Returns
    -------
    Revocation
        Which serials were revoked now and which had been before. Revoking twice is harmless:
        nothing new is revoked, and the CRL is signed again with the next number.

    Raises
    ------
    InvalidParameterError
        ``name`` is not an identity this CA issued, or ``reason`` is over 200 characters.
    CertificateError
        ``ca.key`` does not belong to ``ca.crt``.
    """
    days = check_days(days)
    if reason is not None and (not isinstance(reason, str) or len(reason) > 200):
        raise InvalidParameterError(f"reason must be a str of at most 200 characters, got {reason!r}")
    root = Path(ca_directory)
    ca_key, ca_cert = ca_pair(root)
    with open_ledger(root) as ledger:
        name = known_name(ledger, name, "name")
        entries = ledger.of(name)
        already = [dict(e) for e in entries if e["revoked_at"] is not None]
        code = (reason or "").strip().lower().replace("-", "_").replace(" ", "_")
        revoked = ledger.revoke(
            entries,
            code if code in _REASON_FLAGS else "unspecified",
            reason or "revoked",
        )
        number = ledger.write_crl(ca_key, ca_cert, days)
        return Revocation(name, [dict(e) for e in revoked], already, root / CRL_FILE, number)


def write_crl(ca_directory: str | os.PathLike[str], *, days: int = CRL_DAYS) -> Path:
    """Sign ``revoked.crl.pem`` again from the ledger (a fresh nextUpdate); returns its path."""
    days = check_days(days)
    root = Path(ca_directory)
    ca_key, ca_cert = ca_pair(root)
    with open_ledger(root) as ledger:
        ledger.write_crl(ca_key, ca_cert, days)
    return root / CRL_FILE
