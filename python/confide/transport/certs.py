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
:func:`peer_identity` and :func:`verify_signature` check a certificate against
the federation CA; :func:`name_from_auth_context` reads the peer's name from a
gRPC call that the TLS layer has already authenticated.

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

ROLE_PARTY = "party"
ROLE_SERVICE = "service"
ROLE_ADMIN = "admin"
#: A model developer: submits and tunes jobs through the controller; holds no data.
ROLE_DEVELOPER = "developer"
ROLES = (ROLE_PARTY, ROLE_SERVICE, ROLE_ADMIN, ROLE_DEVELOPER)

CA_CERT_FILE = "ca.crt"
CA_KEY_FILE = "ca.key"
#: The federation's certificate revocation list (PEM), in the CA directory and in every service's.
CRL_FILE = "revoked.crl.pem"
#: The CA directory's record of every certificate it issued, and of revocations.
ISSUED_LEDGER = "issued.json"
#: Validity of a CRL (its nextUpdate); services keep enforcing a stale one, and say so.
CRL_DAYS = 30

DEFAULT_HOSTS = ("localhost", "127.0.0.1")
MAX_NAME_LEN = 64
MAX_DAYS = 36500
URI_SCHEME = "confide"

_NAME_RE = re.compile(r"[a-z0-9-]{1,64}")
_RESERVED_NAMES = frozenset({"ca"})  # would collide with ca.crt / ca.key
_DNS_LABEL_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_BACKDATE = timedelta(minutes=5)
_CURVE = ec.SECP256R1


# ----------------------------------------------------------------------------------------------------------------------
# Argument checks


def _check_name(name: object, field: str = "name") -> str:
    if not isinstance(name, str):
        raise InvalidParameterError(f"{field} must be a str, got {type(name).__name__}")
    if not _NAME_RE.fullmatch(name):
        raise InvalidParameterError(f"{field} must be 1..{MAX_NAME_LEN} characters of [a-z0-9-], got {name!r}")
    if name in _RESERVED_NAMES:
        raise InvalidParameterError(f"{field} {name!r} is reserved for the federation CA")
    return name


def _check_role(role: object) -> str:
    if role not in ROLES:
        raise InvalidParameterError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return str(role)


def _check_days(days: object) -> int:
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise InvalidParameterError(f"days must be an int in [1, {MAX_DAYS}], got {days!r}")
    return days


def _check_names(names: object, field: str) -> list[str]:
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
        raise InvalidParameterError(f"{field} must be a list of names, got {type(names).__name__}")
    return [_check_name(n, f"{field} entry") for n in names]


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


def _data_bytes(value: object, field: str) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidParameterError(f"{field} must be bytes, got {type(value).__name__}")
    return bytes(value)


def _as_bytes(value: object, field: str) -> bytes:
    """PEM input: bytes, or a str of ASCII text."""
    if isinstance(value, str):
        return value.encode("ascii", "replace")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise InvalidParameterError(f"{field} must be bytes, got {type(value).__name__}")


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


def _read_file(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        hint = ""
        if path.suffix in (".crt", ".key") and path.parent.is_dir():
            known = sorted(p.stem for p in path.parent.glob("*.crt") if p.stem != "ca")
            hint = f" (identities in {path.parent}: {', '.join(known) or 'none'}; check --as / --name / --certs)"
        raise MissingFileError(f"{what} file not found: {path}{hint}") from None


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


# ----------------------------------------------------------------------------------------------------------------------
# Certificate building


def _uri(role: str, name: str) -> str:
    return f"{URI_SCHEME}://{role}/{name}"


def _make_ca(days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(_CURVE())
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
    key = ec.generate_private_key(_CURVE()) if public_key is None else None
    public = key.public_key() if key is not None else public_key
    now = datetime.now(timezone.utc)
    not_after = min(now + timedelta(days=days), ca_cert.not_valid_after_utc)  # a leaf never outlives its CA
    if role == ROLE_SERVICE:
        sans: list[x509.GeneralName] = [*hosts, x509.UniformResourceIdentifier(_uri(role, name))]
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    else:
        sans = [x509.DNSName(name), x509.UniformResourceIdentifier(_uri(role, name))]
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
    name = _check_name(name)
    role = _check_role(role)
    host_names = _check_hosts(hosts)
    if role == ROLE_SERVICE and not host_names:
        raise InvalidParameterError("hosts must name at least one DNS name or IP address for a service certificate")
    days = _check_days(days)
    root = Path(directory)
    cert_path, key_path = root / f"{name}.crt", root / f"{name}.key"
    for path in (cert_path, key_path):
        if path.exists():
            raise InvalidParameterError(f"{path} already exists; identity names must be unique in a federation")

    ca_cert = _load_cert(_read_file(root / CA_CERT_FILE, "CA certificate"), "ca.crt")
    ca_key = _load_key(_read_file(root / CA_KEY_FILE, "CA key"), "ca.key")
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
    name = _check_name(name)
    role = _check_role(role)
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
    key = ec.generate_private_key(_CURVE())
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
    role = _check_role(role)
    days = _check_days(days)
    data = _as_bytes(csr_pem, "csr")
    if len(data) > MAX_CSR_BYTES:
        raise CertificateError(f"the CSR is {len(data)} bytes; at most {MAX_CSR_BYTES}")
    try:
        csr = x509.load_pem_x509_csr(data)
    except ValueError:
        raise CertificateError("not a PEM certificate signing request (made with 'confide certs request')") from None
    if not csr.is_signature_valid:
        raise CertificateError("the CSR's signature does not verify with its own key: it was forged or altered")
    public = csr.public_key()
    if not isinstance(public, ec.EllipticCurvePublicKey) or public.curve.name != _CURVE.name:
        raise CertificateError(f"the CSR's key must be ECDSA on {_CURVE.name}")
    names = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    roles = csr.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    if len(names) != 1:
        raise CertificateError("the CSR must name exactly one identity (subject CN)")
    name = _check_name(str(names[0].value), "CSR name")
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
    ca_cert = _load_cert(_read_file(root / CA_CERT_FILE, "CA certificate"), "ca.crt")
    ca_key = _load_key(_read_file(root / CA_KEY_FILE, "CA key"), "ca.key")
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
                "name": _single_attr(cert, NameOID.COMMON_NAME, "common name (CN)"),
                "role": _single_attr(cert, NameOID.ORGANIZATIONAL_UNIT_NAME, "organizational unit (OU)"),
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
        ca = _load_cert(_read_file(root / CA_CERT_FILE, "CA certificate"), "ca.crt")
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
    ca_cert = _load_cert(_read_file(root / CA_CERT_FILE, "CA certificate"), "ca.crt")
    ca_key = _load_key(_read_file(root / CA_KEY_FILE, "CA key"), "ca.key")
    if ca_key.public_key().public_numbers() != ca_cert.public_key().public_numbers():
        raise CertificateError(f"{root / CA_KEY_FILE} does not belong to {root / CA_CERT_FILE}")
    return ca_key, ca_cert


def _known_name(ledger: _Ledger, name: object, field: str) -> str:
    name = _check_name(name, field)
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
        old = _load_cert(_read_file(cert_path, "certificate"), f"{name}.crt")
        role = _single_attr(old, NameOID.ORGANIZATIONAL_UNIT_NAME, "organizational unit (OU)")
        _check_role(role)
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


# ----------------------------------------------------------------------------------------------------------------------
# Public API: checking


def _load_cert(pem: object, field: str) -> x509.Certificate:
    data = _as_bytes(pem, field)
    try:
        return x509.load_pem_x509_certificate(data)
    except (ValueError, x509.InvalidVersion):
        raise CertificateError(f"{field} is not a PEM X.509 certificate") from None


def _load_key(pem: object, field: str) -> ec.EllipticCurvePrivateKey:
    data = _as_bytes(pem, field)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise CertificateError(f"{field} is not an unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, _CURVE):
        raise CertificateError(f"{field} is not an ECDSA P-256 private key")
    return key


def _single_attr(cert: x509.Certificate, oid: x509.ObjectIdentifier, what: str) -> str:
    values = cert.subject.get_attributes_for_oid(oid)
    if len(values) != 1 or not isinstance(values[0].value, str):
        raise CertificateError(f"certificate subject must have exactly one {what}, found {len(values)}")
    return values[0].value


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _check_validity(cert: x509.Certificate, what: str, now: datetime) -> None:
    if now < cert.not_valid_before_utc:
        raise CertificateError(f"{what} is not valid before {cert.not_valid_before_utc.isoformat()}")
    if now > cert.not_valid_after_utc:
        raise CertificateError(f"{what} expired at {cert.not_valid_after_utc.isoformat()}")


def _verified_peer(cert_pem: object, ca_pem: object) -> tuple[x509.Certificate, str, str]:
    try:
        return _check_peer(cert_pem, ca_pem)
    except CertificateError:
        raise
    except ValueError as error:  # cryptography parses fields when first read: a malformed one raises then
        raise CertificateError(f"certificate does not parse: {error}") from None


def _check_peer(cert_pem: object, ca_pem: object) -> tuple[x509.Certificate, str, str]:
    cert = _load_cert(cert_pem, "cert_pem")
    ca = _load_cert(ca_pem, "ca_pem")
    if not _is_ca(ca):
        raise CertificateError("ca_pem is not a CA certificate (BasicConstraints ca=True missing)")
    if cert.issuer != ca.subject:
        raise CertificateError(
            f"certificate was issued by {cert.issuer.rfc4514_string()!r}, not by the federation CA "
            f"{ca.subject.rfc4514_string()!r}"
        )
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise CertificateError("certificate signature does not verify with the federation CA key") from None
    now = datetime.now(timezone.utc)
    _check_validity(ca, "the federation CA", now)
    _check_validity(cert, "certificate", now)
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        raise CertificateError("certificate has no BasicConstraints extension; expected ca=False") from None
    if constraints.ca:
        raise CertificateError("certificate is a CA certificate, not a federation identity")
    name = _single_attr(cert, NameOID.COMMON_NAME, "common name (CN)")
    role = _single_attr(cert, NameOID.ORGANIZATIONAL_UNIT_NAME, "organizational unit (OU)")
    if not _NAME_RE.fullmatch(name) or name in _RESERVED_NAMES:
        raise CertificateError(f"certificate CN {name!r} is not a valid identity name")
    if role not in ROLES:
        raise CertificateError(f"certificate OU {role!r} is not a role ({', '.join(ROLES)})")
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = [u for u in san.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith(f"{URI_SCHEME}://")]
    except x509.ExtensionNotFound:
        uris = []
    if uris and _uri(role, name) not in uris:
        raise CertificateError(f"certificate URI {uris[0]!r} disagrees with its subject {_uri(role, name)!r}")
    return cert, name, role


def peer_identity(cert_pem: bytes, ca_pem: bytes) -> tuple[str, str]:
    """Check a certificate against the federation CA and return who it names.

    Parameters
    ----------
    cert_pem : bytes
        The peer's certificate (PEM).
    ca_pem : bytes
        The federation CA certificate (PEM).

    Returns
    -------
    tuple of (str, str)
        The ``(name, role)`` from the certificate's CN and OU.

    Raises
    ------
    CertificateError
        The certificate is not signed by this CA (issuer or signature), is outside
        its validity period, is itself a CA, or its subject is not a federation
        identity; the message says which.
    """
    _, name, role = _verified_peer(cert_pem, ca_pem)
    return name, role


def verify_signature(
    cert_pem: bytes,
    ca_pem: bytes,
    data: bytes,
    signature: bytes,
    *,
    expected_name: str | None = None,
) -> str:
    """Check that ``signature`` over ``data`` was made by the holder of ``cert_pem``.

    Parameters
    ----------
    cert_pem : bytes
        The signer's certificate (PEM), checked with :func:`peer_identity`.
    ca_pem : bytes
        The federation CA certificate (PEM).
    data : bytes
        The signed bytes.
    signature : bytes
        A DER ECDSA-SHA256 signature, as made by :meth:`Identity.sign`.
    expected_name : str, optional
        The name the message claims; it must equal the certificate's CN.

    Returns
    -------
    str
        The signer's name.

    Raises
    ------
    CertificateError
        The certificate is not trusted, names someone other than ``expected_name``,
        or the signature does not verify.
    InvalidParameterError
        ``data`` or ``signature`` is not bytes.
    """
    data = _data_bytes(data, "data")
    signature = _data_bytes(signature, "signature")
    cert, name, _ = _verified_peer(cert_pem, ca_pem)
    if expected_name is not None and expected_name != name:
        raise CertificateError(f"certificate names {name!r}, message claims {expected_name!r}")
    public_key = cert.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        raise CertificateError(f"certificate of {name!r} does not hold an ECDSA key")
    try:
        public_key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise CertificateError(f"signature does not verify with the certificate of {name!r}") from None
    return name


def name_from_auth_context(auth_context: dict | None) -> str | None:
    """Return the peer's certificate CN from a gRPC ``auth_context()``, or None.

    The TLS layer has already checked the certificate against the server's root
    certificates (``require_client_auth=True``); this only reads the name.

    Parameters
    ----------
    auth_context : dict or None
        ``grpc.ServicerContext.auth_context()``: property names mapped to lists
        of bytes, such as ``x509_common_name`` and ``x509_pem_cert``.

    Returns
    -------
    str or None
        The CN, or None when the peer presented no certificate.
    """
    if not auth_context:
        return None
    for value in auth_context.get("x509_common_name") or ():
        text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
        if text:
            return text
    for value in auth_context.get("x509_pem_cert") or ():
        try:
            cert = x509.load_pem_x509_certificate(value.encode() if isinstance(value, str) else bytes(value))
        except (ValueError, TypeError):
            continue
        name = _common_name(cert)
        if name:
            return name
    return None


def name_from_der(der: bytes | None) -> str | None:
    """The CN of a peer certificate (DER) that the TLS layer already verified, or None."""
    if not der:
        return None
    try:
        return _common_name(x509.load_der_x509_certificate(bytes(der)))
    except ValueError:
        return None


def _common_name(cert: x509.Certificate) -> str | None:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return names[0].value if names and isinstance(names[0].value, str) and names[0].value else None


# ----------------------------------------------------------------------------------------------------------------------
# Identity


@dataclass(frozen=True, repr=False)
class Identity:
    """One participant's certificate, private key and the federation CA, all PEM.

    Parameters
    ----------
    name : str
        The identity's name, e.g. ``"hospital-a"`` or ``"aggregator"``.
    role : str
        ``"party"``, ``"service"``, ``"admin"`` or ``"developer"``.
    cert_pem : bytes
        The identity's certificate.
    key_pem : bytes
        Its PKCS#8 private key, unencrypted; never shown by ``repr``.
    ca_pem : bytes
        The federation CA certificate.
    """

    name: str
    role: str
    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes

    def __post_init__(self) -> None:
        _check_name(self.name)
        _check_role(self.role)
        for field in ("cert_pem", "key_pem", "ca_pem"):
            if not isinstance(getattr(self, field), bytes):
                raise InvalidParameterError(f"{field} must be bytes, got {type(getattr(self, field)).__name__}")

    def __repr__(self) -> str:
        return f"Identity(name={self.name!r}, role={self.role!r}, key_pem=<hidden>)"

    def sign(self, data: bytes) -> bytes:
        """Sign ``data`` with this identity's key.

        Parameters
        ----------
        data : bytes
            The bytes to sign.

        Returns
        -------
        bytes
            A DER-encoded ECDSA-SHA256 signature; check it with :func:`verify_signature`.
        """
        payload = _data_bytes(data, "data")
        return _load_key(self.key_pem, "key_pem").sign(payload, ec.ECDSA(hashes.SHA256()))

    @classmethod
    def load(cls, directory: str | os.PathLike[str], name: str) -> Identity:
        """Read ``<name>.crt``, ``<name>.key`` and ``ca.crt`` from ``directory``.

        Parameters
        ----------
        directory : str or os.PathLike
            The federation directory.
        name : str
            The identity to load.

        Returns
        -------
        Identity
            The identity; its role comes from the certificate.

        Raises
        ------
        FileNotFoundError
            A file is missing; the message names it.
        CertificateError
            The certificate is not issued by ``ca.crt``, is expired, names someone
            else, or the key does not belong to it.
        """
        name = _check_name(name)
        root = Path(directory)
        cert_pem = _read_file(root / f"{name}.crt", "certificate")
        key_pem = _read_file(root / f"{name}.key", "private key")
        ca_pem = _read_file(root / CA_CERT_FILE, "CA certificate")
        cert, cn, role = _verified_peer(cert_pem, ca_pem)
        if cn != name:
            raise CertificateError(f"{root / f'{name}.crt'} names {cn!r}, expected {name!r}")
        key = _load_key(key_pem, f"{name}.key")
        if key.public_key().public_numbers() != cert.public_key().public_numbers():
            raise CertificateError(f"{root / f'{name}.key'} does not belong to {root / f'{name}.crt'}")
        return cls(name=name, role=role, cert_pem=cert_pem, key_pem=key_pem, ca_pem=ca_pem)
