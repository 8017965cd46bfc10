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
revoking. Its building blocks (file names, checks, CA and leaf certificates) are
:mod:`confide.transport.pki`; the ledger of issued certificates, revocation and the CRL are
:mod:`confide.transport.ledger`, re-exported here.

Revocation: the CA directory keeps a ledger of every certificate it issued
(``issued.json``: serial, name, role, validity, whether the key stayed with the CA or
with a site, and revocations). :func:`revoke_identity` marks every certificate of a
name revoked and :func:`rotate_identity` replaces a CA-held key and certificate, revoking
the old one; both rewrite ``revoked.crl.pem``, an X.509 CRL signed by the CA key, which
services read (:mod:`confide.transport.revocation`). The CRL number grows by one with
every write, so a service can refuse an older list put back in place of a newer one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

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
from confide.errors import CertificateError, InvalidParameterError
from confide.transport.ledger import (
    Revocation,
    ca_pair,
    hosts_of,
    issued_certificates,
    known_name,
    open_ledger,
    revoke_identity,
    serial_hex,
    write_crl,
)
from confide.transport.pki import (
    CA_KEY_FILE,
    CRL_DAYS,
    CRL_FILE,
    DEFAULT_HOSTS,
    ISSUED_DIR,
    ISSUED_LEDGER,
    cert_pem,
    check_days,
    check_hosts,
    check_names,
    key_pem,
    make_ca,
    make_leaf,
    write_file,
)

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
        for name in check_names(names, field):
            if name in roles:
                raise InvalidParameterError(
                    f"{field} entry {name!r} is already used (as {roles[name]}); names must be unique across all roles"
                )
            roles[name] = role
    host_names = check_hosts(hosts)
    if services and not host_names:
        raise InvalidParameterError("hosts must name at least one DNS name or IP address for the service certificates")
    days = check_days(days)

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
    ca_key, ca_cert = make_ca(days)
    out: dict[str, Path] = {}
    issued: list[x509.Certificate] = []
    for name, role in roles.items():
        key, cert = make_leaf(ca_key, ca_cert, name, role, host_names, days)
        write_file(root / f"{name}.key", key_pem(key), 0o600)
        write_file(root / f"{name}.crt", cert_pem(cert), 0o644)
        out[name] = root / f"{name}.crt"
        issued.append(cert)
    # A new CA: the old ledger and CRL speak of another CA's serials (services would refuse that CRL).
    with open_ledger(root, fresh=True) as ledger:
        for cert in issued:
            ledger.add(cert, key_held="ca")
        (root / CRL_FILE).unlink(missing_ok=True)
    # The CA goes last, so that an interrupted run does not leave a CA without its identities.
    write_file(root / CA_KEY_FILE, key_pem(ca_key), 0o600)
    write_file(root / CA_CERT_FILE, cert_pem(ca_cert), 0o644)
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
    host_names = check_hosts(hosts)
    if role == ROLE_SERVICE and not host_names:
        raise InvalidParameterError("hosts must name at least one DNS name or IP address for a service certificate")
    days = check_days(days)
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
    with open_ledger(root) as ledger:
        key, cert = make_leaf(ca_key, ca_cert, name, role, host_names, days)
        write_file(key_path, key_pem(key), 0o600)
        write_file(cert_path, cert_pem(cert), 0o644)
        ledger.add(cert, key_held="ca")
    return cert_path


# ----------------------------------------------------------------------------------------------------------------------
# Public API: per-site enrollment (the site keeps its key; the operator keeps the CA key)

#: Where the CA directory remembers what it signed: ``issued/<name>.crt``.
MAX_CSR_BYTES = 64 * 1024


def make_request(
    directory: str | os.PathLike[str],
    name: str,
    role: str,
    *,
    hosts: Sequence[str] = DEFAULT_HOSTS,
) -> Path:
    """At a site: a new key pair and a certificate signing request for ``name``.

    Writes ``<name>.key`` (mode 0600; it never leaves the site) and ``<name>.csr`` (public: send it
    to the federation operator) into ``directory``. Returns the CSR's path.
    """
    name = check_name(name)
    role = check_role(role)
    host_names = check_hosts(hosts)
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
    write_file(key_path, key_pem(key), 0o600)
    write_file(csr_path, csr.public_bytes(serialization.Encoding.PEM), 0o644)
    return csr_path


def sign_request(
    ca_directory: str | os.PathLike[str],
    csr_pem: bytes,
    *,
    role: str,
    days: int = 365,
    replace: bool = False,
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
    days = check_days(days)
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
        hosts = check_hosts(
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
    with open_ledger(root) as ledger:
        _, cert = make_leaf(ca_key, ca_cert, name, role, hosts, days, public_key=public)
        pem = cert_pem(cert)
        issued.parent.mkdir(mode=0o700, exist_ok=True)
        write_file(issued, pem, 0o644)
        ledger.add(cert, key_held="site")
        if replace:
            # The site's old key is lost (or may be in other hands): its certificates must stop working.
            old = [e for e in ledger.of(name) if e["serial"] != serial_hex(cert.serial_number)]
            if ledger.revoke(old, "superseded", "re-enrolled with 'certs sign --replace'"):
                ledger.write_crl(ca_key, ca_cert)
    return name, pem


def rotate_identity(
    ca_directory: str | os.PathLike[str],
    name: str,
    *,
    days: int = 365,
    crl_days: int = CRL_DAYS,
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
    days = check_days(days)
    crl_days = check_days(crl_days)
    root = Path(ca_directory)
    ca_key, ca_cert = ca_pair(root)
    if ca_cert.not_valid_after_utc <= datetime.now(timezone.utc):
        raise CertificateError(f"the federation CA expired at {ca_cert.not_valid_after_utc.isoformat()}")
    with open_ledger(root) as ledger:
        name = known_name(ledger, name, "name")
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
        hosts = check_hosts(hosts_of(old) if role == ROLE_SERVICE else [])
        key, cert = make_leaf(ca_key, ca_cert, name, role, hosts, days)
        # The new pair first: between the two steps both certificates work, never neither.
        write_file(key_path, key_pem(key), 0o600)
        write_file(cert_path, cert_pem(cert), 0o644)
        ledger.add(cert, key_held="ca")
        entries = [e for e in ledger.of(name) if e["serial"] != serial_hex(cert.serial_number)]
        already = [dict(e) for e in entries if e["revoked_at"] is not None]
        revoked = ledger.revoke(entries, "superseded", "rotated with 'certs rotate'")
        number = ledger.write_crl(ca_key, ca_cert, crl_days)
        return Revocation(
            name,
            [dict(e) for e in revoked],
            already,
            root / CRL_FILE,
            number,
            cert_path,
        )
