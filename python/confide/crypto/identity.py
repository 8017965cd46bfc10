"""Who a participant is: its identity (certificate, key, the federation CA) and the checks on it.

A certificate carries its holder's name as subject CN and its role as OU, plus the URI
``confide://<role>/<name>`` as a SubjectAlternativeName; keys are ECDSA P-256 and every
signature is ECDSA with SHA-256. :func:`peer_identity` and :func:`verify_signature` check a
certificate against the federation CA; :func:`name_from_auth_context` and :func:`name_from_der`
read the peer's name from a connection the TLS layer already authenticated; :class:`Identity`
holds one participant's PEMs and signs.

These are the runtime checks every role makes; issuing, rotating and revoking certificates (the
CA's administration) is :mod:`confide.transport.certs`, which builds on this module. It sits in
``crypto`` so the protocols (:mod:`confide.protect`) sign and verify without importing transport.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from confide.errors import CertificateError, InvalidParameterError, MissingFileError

__all__ = [
    "CA_CERT_FILE",
    "CURVE",
    "MAX_NAME_LEN",
    "NAME_PATTERN",
    "RESERVED_NAMES",
    "ROLES",
    "ROLE_ADMIN",
    "ROLE_DEVELOPER",
    "ROLE_PARTY",
    "ROLE_SERVICE",
    "URI_SCHEME",
    "Identity",
    "check_name",
    "check_role",
    "data_bytes",
    "identity_uri",
    "is_ca_certificate",
    "load_cert",
    "load_key",
    "name_from_auth_context",
    "name_from_der",
    "peer_identity",
    "pem_bytes",
    "read_file",
    "subject_attribute",
    "verified_peer",
    "verify_signature",
]

ROLE_PARTY = "party"
ROLE_SERVICE = "service"
ROLE_ADMIN = "admin"
#: A model developer: submits and tunes jobs through the controller; holds no data.
ROLE_DEVELOPER = "developer"
ROLES = (ROLE_PARTY, ROLE_SERVICE, ROLE_ADMIN, ROLE_DEVELOPER)

CA_CERT_FILE = "ca.crt"

MAX_NAME_LEN = 64
URI_SCHEME = "confide"
NAME_PATTERN = re.compile(r"[a-z0-9-]{1,64}")
RESERVED_NAMES = frozenset({"ca"})  # would collide with ca.crt / ca.key
CURVE = ec.SECP256R1


def check_name(name: object, field: str = "name") -> str:
    """The identity name ``name`` if it is 1..64 characters of [a-z0-9-] and not reserved; errors name ``field``."""
    if not isinstance(name, str):
        raise InvalidParameterError(f"{field} must be a str, got {type(name).__name__}")
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidParameterError(f"{field} must be 1..{MAX_NAME_LEN} characters of [a-z0-9-], got {name!r}")
    if name in RESERVED_NAMES:
        raise InvalidParameterError(f"{field} {name!r} is reserved for the federation CA")
    return name


def check_role(role: object) -> str:
    """``role`` if it is one of :data:`ROLES`."""
    if role not in ROLES:
        raise InvalidParameterError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return str(role)


def data_bytes(value: object, field: str) -> bytes:
    """``value`` as bytes (bytes, bytearray or memoryview); errors name ``field``."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidParameterError(f"{field} must be bytes, got {type(value).__name__}")
    return bytes(value)


def pem_bytes(value: object, field: str) -> bytes:
    """PEM input: bytes, or a str of ASCII text."""
    if isinstance(value, str):
        return value.encode("ascii", "replace")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise InvalidParameterError(f"{field} must be bytes, got {type(value).__name__}")


def read_file(path: Path, what: str) -> bytes:
    """The bytes of ``path``; a missing certificate or key names the identities that do exist there."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        hint = ""
        if path.suffix in (".crt", ".key") and path.parent.is_dir():
            known = sorted(p.stem for p in path.parent.glob("*.crt") if p.stem != "ca")
            hint = f" (identities in {path.parent}: {', '.join(known) or 'none'}; check --as / --name / --certs)"
        raise MissingFileError(f"{what} file not found: {path}{hint}") from None


def identity_uri(role: str, name: str) -> str:
    """The SubjectAlternativeName URI of an identity: ``confide://<role>/<name>``."""
    return f"{URI_SCHEME}://{role}/{name}"


def load_cert(pem: object, field: str) -> x509.Certificate:
    """The PEM X.509 certificate ``pem``; errors name ``field``."""
    data = pem_bytes(pem, field)
    try:
        return x509.load_pem_x509_certificate(data)
    except (ValueError, x509.InvalidVersion):
        raise CertificateError(f"{field} is not a PEM X.509 certificate") from None


def load_key(pem: object, field: str) -> ec.EllipticCurvePrivateKey:
    """The unencrypted PEM ECDSA P-256 private key ``pem``; errors name ``field``."""
    data = pem_bytes(pem, field)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise CertificateError(f"{field} is not an unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, CURVE):
        raise CertificateError(f"{field} is not an ECDSA P-256 private key")
    return key


def subject_attribute(cert: x509.Certificate, oid: x509.ObjectIdentifier, what: str) -> str:
    """The one value of ``oid`` in the certificate's subject; errors name ``what``."""
    values = cert.subject.get_attributes_for_oid(oid)
    if len(values) != 1 or not isinstance(values[0].value, str):
        raise CertificateError(f"certificate subject must have exactly one {what}, found {len(values)}")
    return values[0].value


def is_ca_certificate(cert: x509.Certificate) -> bool:
    """Whether ``cert`` says it is a CA (BasicConstraints ca=True)."""
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _check_validity(cert: x509.Certificate, what: str, now: datetime) -> None:
    if now < cert.not_valid_before_utc:
        raise CertificateError(f"{what} is not valid before {cert.not_valid_before_utc.isoformat()}")
    if now > cert.not_valid_after_utc:
        raise CertificateError(f"{what} expired at {cert.not_valid_after_utc.isoformat()}")


def verified_peer(cert_pem: object, ca_pem: object) -> tuple[x509.Certificate, str, str]:
    """``(certificate, name, role)`` of ``cert_pem`` checked against the CA ``ca_pem`` (:func:`peer_identity`)."""
    try:
        return _check_peer(cert_pem, ca_pem)
    except CertificateError:
        raise
    except ValueError as error:  # cryptography parses fields when first read: a malformed one raises then
        raise CertificateError(f"certificate does not parse: {error}") from None


def _check_peer(cert_pem: object, ca_pem: object) -> tuple[x509.Certificate, str, str]:
    cert = load_cert(cert_pem, "cert_pem")
    ca = load_cert(ca_pem, "ca_pem")
    if not is_ca_certificate(ca):
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
    name = subject_attribute(cert, NameOID.COMMON_NAME, "common name (CN)")
    role = subject_attribute(cert, NameOID.ORGANIZATIONAL_UNIT_NAME, "organizational unit (OU)")
    if not NAME_PATTERN.fullmatch(name) or name in RESERVED_NAMES:
        raise CertificateError(f"certificate CN {name!r} is not a valid identity name")
    if role not in ROLES:
        raise CertificateError(f"certificate OU {role!r} is not a role ({', '.join(ROLES)})")
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = [u for u in san.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith(f"{URI_SCHEME}://")]
    except x509.ExtensionNotFound:
        uris = []
    if uris and identity_uri(role, name) not in uris:
        raise CertificateError(f"certificate URI {uris[0]!r} disagrees with its subject {identity_uri(role, name)!r}")
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
    _, name, role = verified_peer(cert_pem, ca_pem)
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
    data = data_bytes(data, "data")
    signature = data_bytes(signature, "signature")
    cert, name, _ = verified_peer(cert_pem, ca_pem)
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
        check_name(self.name)
        check_role(self.role)
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
        payload = data_bytes(data, "data")
        return load_key(self.key_pem, "key_pem").sign(payload, ec.ECDSA(hashes.SHA256()))

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
        name = check_name(name)
        root = Path(directory)
        cert_pem = read_file(root / f"{name}.crt", "certificate")
        key_pem = read_file(root / f"{name}.key", "private key")
        ca_pem = read_file(root / CA_CERT_FILE, "CA certificate")
        cert, cn, role = verified_peer(cert_pem, ca_pem)
        if cn != name:
            raise CertificateError(f"{root / f'{name}.crt'} names {cn!r}, expected {name!r}")
        key = load_key(key_pem, f"{name}.key")
        if key.public_key().public_numbers() != cert.public_key().public_numbers():
            raise CertificateError(f"{root / f'{name}.key'} does not belong to {root / f'{name}.crt'}")
        return cls(name=name, role=role, cert_pem=cert_pem, key_pem=key_pem, ca_pem=ca_pem)
