"""The PKI of a local federation: one CA and one certificate per party, service and admin.

Every participant talks gRPC over mutual TLS. :func:`init_federation` writes a
self-signed CA and one identity per name into a directory::

    from confide.transport.certs import Identity, init_federation

    init_federation("pki", parties=["hospital-a", "hospital-b"])
    me = Identity.load("pki", "hospital-a")     # cert, key and CA as PEM bytes
    signature = me.sign(b"payload")

Layout: ``ca.crt``, ``ca.key`` and, per name, ``<name>.crt`` and ``<name>.key``;
key files are created with mode 0600. Keys are ECDSA P-256 and every signature,
certificate or message, is ECDSA with SHA-256.

A certificate carries its holder's name as subject CN and its role as OU, plus
the URI ``confide://<role>/<name>`` as a SubjectAlternativeName. Service
certificates also name the hosts they serve (DNS names and IP addresses) so gRPC
clients can check them; parties and admins get their own name as DNS name.
The runtime checks every role makes (:func:`peer_identity`, :func:`verify_signature`,
:func:`name_from_auth_context`, :class:`Identity`) live in :mod:`confide.crypto.identity` and are
re-exported here; this module is the CA's administration: issuing, signing requests, rotating,
revoking.

Revocation: the CA directory keeps a ledger of every certificate it issued
(``issued.json``: serial, name, role, validity, whether the key stayed with the CA or
with a site, and revocations). :func:`revoke_identity` marks every certificate of a
name revoked and :func:`rotate_identity` replaces a CA-held key and certificate, revoking
the old one; both rewrite ``revoked.crl.pem``, an X.509 CRL signed by the CA key, which
services read (:mod:`confide.transport.revocation`). The CRL number grows by one with
every write, so a service can refuse an older list put back in place of a newer one.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import re
import secrets
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from confide.crypto.identity import (
    CA_CERT_FILE,
    CURVE,
    ROLE_ADMIN,
    ROLE_DEVELOPER,
    ROLE_PARTY,
    ROLE_SERVICE,
    ROLES,
    Identity,
    check_name,
    check_role,
    identity_uri,
    load_cert,
    load_key,
    name_from_auth_context,
    name_from_der,
    peer_identity,
    pem_bytes,
    read_file,
    subject_attribute,
    verify_signature,
)
from confide.errors import CertificateError, InvalidParameterError, MissingFileError

__all__ = [
    "CA_CERT_FILE",
    "CA_KEY_FILE",
    "CRL_FILE",
    "ISSUED_LEDGER",
    "ROLES",
    "ROLE_ADMIN",
    "ROLE_DEVELOPER",
    "ROLE_PARTY",
    "ROLE_SERVICE",
    "Identity",
    "Revocation",
    "init_federation",
    "issue_identity",
    "issued_certificates",
    "revoke_identity",
    "rotate_identity",
    "write_crl",
    "make_request",
    "sign_request",
    "name_from_auth_context",
    "name_from_der",
    "peer_identity",
    "verify_signature",
]


CA_KEY_FILE = "ca.key"
#: The federation's certificate revocation list (PEM), in the CA directory and in every service's.
CRL_FILE = "revoked.crl.pem"
#: The CA directory's record of every certificate it issued, and of revocations.
ISSUED_LEDGER = "issued.json"
#: Validity of a CRL (its nextUpdate); services keep enforcing a stale one, and say so.
CRL_DAYS = 30

DEFAULT_HOSTS = ("localhost", "127.0.0.1")
MAX_DAYS = 36500

_DNS_LABEL_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_BACKDATE = timedelta(minutes=5)


# ----------------------------------------------------------------------------------------------------------------------
# Argument checks


def _check_days(days: object) -> int:
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise InvalidParameterError(f"days must be an int in [1, {MAX_DAYS}], got {days!r}")
    return days


def _check_names(names: object, field: str) -> list[str]:
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
        raise InvalidParameterError(f"{field} must be a list of names, got {type(names).__name__}")
    return [check_name(n, f"{field} entry") for n in names]


def _check_hosts(hosts: object) -> list[x509.GeneralName]:
    if isinstance(hosts, (str, bytes)) or not isinstance(hosts, Sequence):
        raise InvalidParameterError(f"hosts must be a list of DNS names or IP addresses, got {type(hosts).__name__}")
    out: list[x509.GeneralName] = []
    for host in hosts:
        if not isinstance(host, str):
            raise InvalidParameterError(f"hosts entry must be a str, got {type(host).__name__}")
        try:
            general: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            labels = host.rstrip(".").split(".") if host else []
            if not labels or len(host) > 253 or not all(_DNS_LABEL_RE.fullmatch(label) for label in labels):
                raise InvalidParameterError(
                    f"hosts entry must be an IP address or a DNS name (labels of [A-Za-z0-9-], at most 253 "
                    f"characters), got {host!r}"
                ) from None
            general = x509.DNSName(host.rstrip(".").lower())
        if general not in out:
            out.append(general)
    return out


# ----------------------------------------------------------------------------------------------------------------------
# Files


def _write_file(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` atomically; the file never exists with wider permissions than ``mode``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # created 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


# ----------------------------------------------------------------------------------------------------------------------
# Certificate building


def _make_ca(days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(CURVE())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Confide"),
            # A random suffix keeps the subjects of independent federations apart.
            x509.NameAttribute(NameOID.COMMON_NAME, f"Confide federation CA {secrets.token_hex(4)}"),
        ]
    )
    now = datetime.now(timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(_serial())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _serial() -> int:
    # 128 random bits (RFC 5280 allows up to 20 octets); a serial must be positive.
    return secrets.randbits(128) or 1


def _make_leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    name: str,
    role: str,
    hosts: list[x509.GeneralName],
    days: int,
    public_key: ec.EllipticCurvePublicKey | None = None,
) -> tuple[ec.EllipticCurvePrivateKey | None, x509.Certificate]:
    """A certificate for ``name``: for a new key pair (returned), or for a site's own ``public_key``."""
    key = ec.generate_private_key(CURVE()) if public_key is None else None
    public = key.public_key() if key is not None else public_key
    now = datetime.now(timezone.utc)
    not_after = min(now + timedelta(days=days), ca_cert.not_valid_after_utc)  # a leaf never outlives its CA
    if role == ROLE_SERVICE:
        sans: list[x509.GeneralName] = [*hosts, x509.UniformResourceIdentifier(identity_uri(role, name))]
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    else:
        sans = [x509.DNSName(name), x509.UniformResourceIdentifier(identity_uri(role, name))]
        # Parties may serve each other later (party-to-party), so they can act as TLS servers too.
        usages = (
            [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            if role == ROLE_PARTY
            else [ExtendedKeyUsageOID.CLIENT_AUTH]
        )
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                    x509.NameAttribute(NameOID.COMMON_NAME, name),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(_serial())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


# ----------------------------------------------------------------------------------------------------------------------
# Public API: issuing


def init_federation(
    directory: str | os.PathLike[str],
    *,
    parties: Sequence[str],
    services: Sequence[str] = ("controller", "aggregator"),
    admins: Sequence[str] = ("runner",),
    developers: Sequence[str] = (),
    hosts: Sequence[str] = DEFAULT_HOSTS,
    days: int = 365,
    overwrite: bool = False,
) -> dict[str, Path]:
    """Create a federation CA and one identity per name in ``directory``.

    Parameters
    ----------
    directory : str or os.PathLike
        Where to write ``ca.crt``, ``ca.key`` and ``<name>.crt`` / ``<name>.key``;
        created (mode 0700) if missing. Key files get mode 0600.
    parties, services, admins, developers : sequence of str
        The names per role: 1..64 characters of ``[a-z0-9-]``, unique across all
        roles; ``"ca"`` is reserved.
    hosts : sequence of str
        DNS names and IP addresses written into every service certificate, the
        names gRPC clients dial (default ``localhost`` and ``127.0.0.1``).
    days : int
        Validity of the CA and of every certificate, 1..36500 days. Validity starts
        5 minutes in the past to tolerate clock skew.
    overwrite : bool
        Replace existing files. Without it, an existing ``ca.crt`` (or any other
        file this call would write) is an error naming that file.

    Returns
    -------
    dict of str to pathlib.Path
        Each identity's name mapped to its certificate path.

    Raises
    ------
    InvalidParameterError
        A name, ``hosts`` or ``days`` is invalid, a name repeats, or a file exists
        and ``overwrite`` is false.
    """
    roles: dict[str, str] = {}
    for role, names, field in (
        (ROLE_PARTY, parties, "parties"),
        (ROLE_SERVICE, services, "services"),
        (ROLE_ADMIN, admins, "admins"),
        (ROLE_DEVELOPER, developers, "developers"),
    ):
        for name in _check_names(names, field):
            if name in roles:
                raise InvalidParameterError(
                    f"{field} entry {name!r} is already used (as {roles[name]}); names must be unique across all roles"
                )
            roles[name] = role
    host_names = _check_hosts(hosts)
    if services and not host_names:
        raise InvalidParameterError("hosts must name at least one DNS name or IP address for the service certificates")
    days = _check_days(days)

    root = Path(directory)
    targets = [root / CA_CERT_FILE, root / CA_KEY_FILE]
    for name in roles:
        targets += [root / f"{name}.crt", root / f"{name}.key"]
    if not overwrite:
        for path in targets:
            if path.exists():
                raise InvalidParameterError(
                    f"{path} already exists: this directory holds a federation already. Add one identity with "
                    "'confide certs add', enroll a site with 'confide certs request' + 'confide certs sign', "
                    "or replace the whole federation (every identity) with --force"
                )

    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_key, ca_cert = _make_ca(days)
    out: dict[str, Path] = {}
    issued: list[x509.Certificate] = []
    for name, role in roles.items():
        key, cert = _make_leaf(ca_key, ca_cert, name, role, host_names, days)
        _write_file(root / f"{name}.key", _key_pem(key), 0o600)
        _write_file(root / f"{name}.crt", _cert_pem(cert), 0o644)
        out[name] = root / f"{name}.crt"
        issued.append(cert)
    # A new CA: the old ledger and CRL speak of another CA's serials (services would refuse that CRL).
    with _ledger(root, fresh=True) as ledger:
        for cert in issued:
            ledger.add(cert, key_held="ca")
        (root / CRL_FILE).unlink(missing_ok=True)
    # The CA goes last, so that an interrupted run does not leave a CA without its identities.
    _write_file(root / CA_KEY_FILE, _key_pem(ca_key), 0o600)
    _write_file(root / CA_CERT_FILE, _cert_pem(ca_cert), 0o644)
    return out


def issue_identity(
    directory: str | os.PathLike[str],
    name: str,
    role: str,
    *,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    days: int = 365,
) -> Path:
    """Add one identity to an existing federation, signed by its ``ca.key``.

    Parameters
    ----------
    directory : str or os.PathLike
        The federation directory written by :func:`init_federation`.
    name : str
        1..64 characters of ``[a-z0-9-]``, not already used in ``directory``.
    role : str
        ``"party"``, ``"service"``, ``"admin"`` or ``"developer"``.
    hosts : sequence of str
        DNS names and IP addresses for a service certificate; ignored for other roles.
    days : int
        Validity in days, 1..36500; never beyond the CA's own expiry.

    Returns
    -------
    pathlib.Path
        The new certificate's path (the key is next to it, mode 0600).

    Raises
    ------
    InvalidParameterError
        An argument is invalid or ``<name>.crt`` / ``<name>.key`` already exists.
    FileNotFoundError
        ``ca.crt`` or ``ca.key`` is missing.
    CertificateError
        ``ca.key`` does not belong to ``ca.crt``, or the CA has expired.
    """
    name = check_name(name)
    role = check_role(role)
    host_names = _check_hosts(hosts)
    if role == ROLE_SERVICE and not host_names:
        raise InvalidParameterError("hosts must name at least one DNS name or IP address for a service certificate")
    days = _check_days(days)
    root = Path(directory)
    cert_path, key_path = root / f"{name}.crt", root / f"{name}.key"
    for path in (cert_path, key_path):
        if path.exists():
            raise InvalidParameterError(f"{path} already exists; identity names must be unique in a federation")

    ca_cert = load_cert(read_file(root / CA_CERT_FILE, "CA certificate"), "ca.crt")
    ca_key = load_key(read_file(root / CA_KEY_FILE, "CA key"), "ca.key")
    if ca_key.public_key().public_numbers() != ca_cert.public_key().public_numbers():
        raise CertificateError(f"{root / CA_KEY_FILE} does not belong to {root / CA_CERT_FILE}")
    if ca_cert.not_valid_after_utc <= datetime.now(timezone.utc):
        raise CertificateError(f"the federation CA expired at {ca_cert.not_valid_after_utc.isoformat()}")
    with _ledger(root) as ledger:
        key, cert = _make_leaf(ca_key, ca_cert, name, role, host_names, days)
        _write_file(key_path, _key_pem(key), 0o600)
        _write_file(cert_path, _cert_pem(cert), 0o644)
        ledger.add(cert, key_held="ca")
    return cert_path


# ----------------------------------------------------------------------------------------------------------------------
# Public API: per-site enrollment (the site keeps its key; the operator keeps the CA key)

#: Where the CA directory remembers what it signed: ``issued/<name>.crt``.
ISSUED_DIR = "issued"
MAX_CSR_BYTES = 64 * 1024


def make_request(
    directory: str | os.PathLike[str], name: str, role: str, *, hosts: Sequence[str] = DEFAULT_HOSTS
) -> Path:
    """At a site: a new key pair and a certificate signing request for ``name``.

    Writes ``<name>.key`` (mode 0600; it never leaves the site) and ``<name>.csr`` (public: send it
    to the federation operator) into ``directory``. Returns the CSR's path.
    """
    name = check_name(name)
    role = check_role(role)
    host_names = _check_hosts(hosts)
    if role == ROLE_SERVICE and not host_names:
        raise InvalidParameterError("hosts must name at least one DNS name or IP address for a service")
    root = Path(directory)
    key_path, csr_path = root / f"{name}.key", root / f"{name}.csr"
    if key_path.exists():
        raise InvalidParameterError(
            f"{key_path} already exists; this site has a key for {name!r} (keep it, or remove it)"
        )
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ec.generate_private_key(CURVE())
    sans = host_names if role == ROLE_SERVICE else [x509.DNSName(name)]
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                    x509.NameAttribute(NameOID.COMMON_NAME, name),
                ]
            )
        )
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_file(key_path, _key_pem(key), 0o600)
    _write_file(csr_path, csr.public_bytes(serialization.Encoding.PEM), 0o644)
    return csr_path


def sign_request(
    ca_directory: str | os.PathLike[str], csr_pem: bytes, *, role: str, days: int = 365, replace: bool = False
) -> tuple[str, bytes]:
    """At the federation operator: check a site's CSR and sign it with the CA; returns ``(name, cert PEM)``.

    Refused (CertificateError) when the CSR's signature does not verify with its own public key
    (forged or altered), its key is not ECDSA P-256, it asks for another role than ``role`` (the
    operator's decision), or names an identity the CA already issued (unless ``replace``: a site
    that lost its key; every certificate issued to the name before is then revoked, reason
    superseded, and ``revoked.crl.pem`` rewritten). The signed certificate is also kept as
    ``issued/<name>.crt`` and recorded in ``issued.json``.
    """
    role = check_role(role)
    days = _check_days(days)
    data = pem_bytes(csr_pem, "csr")
    if len(data) > MAX_CSR_BYTES:
        raise CertificateError(f"the CSR is {len(data)} bytes; at most {MAX_CSR_BYTES}")
    try:
        csr = x509.load_pem_x509_csr(data)
    except ValueError:
        raise CertificateError("not a PEM certificate signing request (made with 'confide certs request')") from None
    if not csr.is_signature_valid:
        raise CertificateError("the CSR's signature does not verify with its own key: it was forged or altered")
    public = csr.public_key()
    if not isinstance(public, ec.EllipticCurvePublicKey) or public.curve.name != CURVE.name:
        raise CertificateError(f"the CSR's key must be ECDSA on {CURVE.name}")
    names = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    roles = csr.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    if len(names) != 1:
        raise CertificateError("the CSR must name exactly one identity (subject CN)")
    name = check_name(str(names[0].value), "CSR name")
    asked = str(roles[0].value) if roles else None
    if asked != role:
        raise CertificateError(f"the CSR asks for role {asked!r}, the operator signs it as {role!r}")
    hosts: list[x509.GeneralName] = []
    if role == ROLE_SERVICE:
        try:
            sans = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            raise CertificateError("a service CSR must name its hosts (DNS names or IP addresses)") from None
        hosts = _check_hosts(
            [str(h) for h in sans.get_values_for_type(x509.IPAddress)] + sans.get_values_for_type(x509.DNSName)
        )
    root = Path(ca_directory)
    issued = root / ISSUED_DIR / f"{name}.crt"
    if not replace and (issued.exists() or (root / f"{name}.crt").exists()):
        raise CertificateError(
            f"the federation already has an identity {name!r}; a second one would impersonate it "
            "(if the site lost its key, sign again with --replace)"
        )
    ca_cert = load_cert(read_file(root / CA_CERT_FILE, "CA certificate"), "ca.crt")
    ca_key = load_key(read_file(root / CA_KEY_FILE, "CA key"), "ca.key")
    if ca_key.public_key().public_numbers() != ca_cert.public_key().public_numbers():
        raise CertificateError(f"{root / CA_KEY_FILE} does not belong to {root / CA_CERT_FILE}")
    with _ledger(root) as ledger:
        _, cert = _make_leaf(ca_key, ca_cert, name, role, hosts, days, public_key=public)
        pem = _cert_pem(cert)
        issued.parent.mkdir(mode=0o700, exist_ok=True)
        _write_file(issued, pem, 0o644)
        ledger.add(cert, key_held="site")
        if replace:
            # The site's old key is lost (or may be in other hands): its certificates must stop working.
            old = [e for e in ledger.of(name) if e["serial"] != _hex(cert.serial_number)]
            if ledger.revoke(old, "superseded", "re-enrolled with 'certs sign --replace'"):
                ledger.write_crl(ca_key, ca_cert)
    return name, pem


# ----------------------------------------------------------------------------------------------------------------------
# Public API: the ledger of issued certificates, revocation and rotation

#: CRLReason names ``--reason`` may use to set the reason code; any other text is kept in the ledger only.
_REASON_FLAGS = {flag.name: flag for flag in x509.ReasonFlags if flag is not x509.ReasonFlags.unspecified}


def _hex(serial: int) -> str:
    return format(serial, "x")


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="seconds")


def _hosts_of(cert: x509.Certificate) -> list[str]:
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
                "serial": _hex(cert.serial_number),
                "name": subject_attribute(cert, NameOID.COMMON_NAME, "common name (CN)"),
                "role": subject_attribute(cert, NameOID.ORGANIZATIONAL_UNIT_NAME, "organizational unit (OU)"),
                "hosts": _hosts_of(cert),
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

    def write_crl(self, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, days: int = CRL_DAYS) -> int:
        """Sign and write ``revoked.crl.pem`` with every revoked serial; returns its CRL number."""
        number = int(self.data.get("crl_number", 0)) + 1
        now = datetime.now(timezone.utc)
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(ca_cert.subject)
            .last_update(now - _BACKDATE)
            .next_update(min(now + timedelta(days=days), max(ca_cert.not_valid_after_utc, now + _BACKDATE)))
            .add_extension(x509.CRLNumber(number), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False)
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
        _write_file(self.root / CRL_FILE, crl.public_bytes(serialization.Encoding.PEM), 0o644)
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
def _ledger(root: Path, *, fresh: bool = False) -> Iterator[_Ledger]:
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
            _write_file(path, json.dumps(ledger.data, indent=1).encode(), 0o644)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    finally:
        os.close(lock)


def _ca_pair(root: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    ca_cert = load_cert(read_file(root / CA_CERT_FILE, "CA certificate"), "ca.crt")
    ca_key = load_key(read_file(root / CA_KEY_FILE, "CA key"), "ca.key")
    if ca_key.public_key().public_numbers() != ca_cert.public_key().public_numbers():
        raise CertificateError(f"{root / CA_KEY_FILE} does not belong to {root / CA_CERT_FILE}")
    return ca_key, ca_cert


def _known_name(ledger: _Ledger, name: object, field: str) -> str:
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
    with _ledger(Path(ca_directory)) as ledger:
        return [dict(e) for e in ledger.entries]


def revoke_identity(
    ca_directory: str | os.PathLike[str], name: str, *, reason: str | None = None, days: int = CRL_DAYS
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
    days = _check_days(days)
    if reason is not None and (not isinstance(reason, str) or len(reason) > 200):
        raise InvalidParameterError(f"reason must be a str of at most 200 characters, got {reason!r}")
    root = Path(ca_directory)
    ca_key, ca_cert = _ca_pair(root)
    with _ledger(root) as ledger:
        name = _known_name(ledger, name, "name")
        entries = ledger.of(name)
        already = [dict(e) for e in entries if e["revoked_at"] is not None]
        code = (reason or "").strip().lower().replace("-", "_").replace(" ", "_")
        revoked = ledger.revoke(entries, code if code in _REASON_FLAGS else "unspecified", reason or "revoked")
        number = ledger.write_crl(ca_key, ca_cert, days)
        return Revocation(name, [dict(e) for e in revoked], already, root / CRL_FILE, number)


def rotate_identity(
    ca_directory: str | os.PathLike[str], name: str, *, days: int = 365, crl_days: int = CRL_DAYS
) -> Revocation:
    """A fresh key and certificate for ``name`` (same role and hosts), and the old certificates revoked.

    Only for identities whose key the CA directory made (``certs init`` / ``certs add``): the new
    ``<name>.key`` and ``<name>.crt`` replace the old ones there, then every earlier certificate
    of the name is revoked (reason superseded) and the CRL rewritten, so a holder of the old key
    is refused as soon as services read the CRL. A site that holds its own key rotates with
    ``certs request`` and ``certs sign --replace``.

    Raises
    ------
    InvalidParameterError
        ``name`` is not an identity this CA issued, or its key is held by a site.
    """
    days = _check_days(days)
    crl_days = _check_days(crl_days)
    root = Path(ca_directory)
    ca_key, ca_cert = _ca_pair(root)
    if ca_cert.not_valid_after_utc <= datetime.now(timezone.utc):
        raise CertificateError(f"the federation CA expired at {ca_cert.not_valid_after_utc.isoformat()}")
    with _ledger(root) as ledger:
        name = _known_name(ledger, name, "name")
        cert_path, key_path = root / f"{name}.crt", root / f"{name}.key"
        if not key_path.exists() or not cert_path.exists():
            raise InvalidParameterError(
                f"name {name!r}: its key is held by the site, not in {root}; the site makes a new key with "
                "'confide certs request' and the operator signs it with 'confide certs sign --replace' "
                "(which revokes the old certificate)"
            )
        old = load_cert(read_file(cert_path, "certificate"), f"{name}.crt")
        role = subject_attribute(old, NameOID.ORGANIZATIONAL_UNIT_NAME, "organizational unit (OU)")
        check_role(role)
        hosts = _check_hosts(_hosts_of(old) if role == ROLE_SERVICE else [])
        key, cert = _make_leaf(ca_key, ca_cert, name, role, hosts, days)
        # The new pair first: between the two steps both certificates work, never neither.
        _write_file(key_path, _key_pem(key), 0o600)
        _write_file(cert_path, _cert_pem(cert), 0o644)
        ledger.add(cert, key_held="ca")
        entries = [e for e in ledger.of(name) if e["serial"] != _hex(cert.serial_number)]
        already = [dict(e) for e in entries if e["revoked_at"] is not None]
        revoked = ledger.revoke(entries, "superseded", "rotated with 'certs rotate'")
        number = ledger.write_crl(ca_key, ca_cert, crl_days)
        return Revocation(name, [dict(e) for e in revoked], already, root / CRL_FILE, number, cert_path)


def write_crl(ca_directory: str | os.PathLike[str], *, days: int = CRL_DAYS) -> Path:
    """Sign ``revoked.crl.pem`` again from the ledger (a fresh nextUpdate); returns its path."""
    days = _check_days(days)
    root = Path(ca_directory)
    ca_key, ca_cert = _ca_pair(root)
    with _ledger(root) as ledger:
        ledger.write_crl(ca_key, ca_cert, days)
    return root / CRL_FILE
