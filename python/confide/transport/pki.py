"""The CA's building blocks: file names and limits, argument checks, key files, CA and leaf certificates.

Used by :mod:`confide.transport.certs` (issuing) and :mod:`confide.transport.ledger` (revocation).
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import tempfile
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from confide.crypto.identity import (
    CURVE,
    ROLE_PARTY,
    ROLE_SERVICE,
    check_name,
    identity_uri,
)
from confide.errors import InvalidParameterError

CA_KEY_FILE = "ca.key"
#: Where the CA keeps a copy of every certificate it signed for a site's request.
ISSUED_DIR = "issued"
#: The federation's certificate revocation list (PEM), in the CA directory and in every service's.
CRL_FILE = "revoked.crl.pem"
#: The CA directory's record of every certificate it issued, and of revocations.
ISSUED_LEDGER = "issued.json"
#: Validity of a CRL (its nextUpdate); services keep enforcing a stale one, and say so.
CRL_DAYS = 30

DEFAULT_HOSTS = ("localhost", "127.0.0.1")
MAX_DAYS = 36500

_DNS_LABEL_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
BACKDATE = timedelta(minutes=5)


# ----------------------------------------------------------------------------------------------------------------------
# Argument checks


def check_days(days: object) -> int:
    """``days`` as a validity in [1, MAX_DAYS] days."""
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise InvalidParameterError(f"days must be an int in [1, {MAX_DAYS}], got {days!r}")
    return days


def check_names(names: object, field: str) -> list[str]:
    """``names`` as a list of valid identity names (``field`` names the argument in errors)."""
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
        raise InvalidParameterError(f"{field} must be a list of names, got {type(names).__name__}")
    return [check_name(n, f"{field} entry") for n in names]


def check_hosts(hosts: object) -> list[x509.GeneralName]:
    """``hosts`` as SubjectAlternativeNames: IP addresses and DNS names, checked."""
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


def write_file(path: Path, data: bytes, mode: int) -> None:
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


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """The private key as unencrypted PKCS#8 PEM."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    """The certificate as PEM."""
    return cert.public_bytes(serialization.Encoding.PEM)


# ----------------------------------------------------------------------------------------------------------------------
# Certificate building


def make_ca(days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A new self-signed CA: an ECDSA P-256 key and its certificate, valid ``days`` days."""
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
        .not_valid_before(now - BACKDATE)
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


def make_leaf(
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
        sans: list[x509.GeneralName] = [
            *hosts,
            x509.UniformResourceIdentifier(identity_uri(role, name)),
        ]
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    else:
        sans = [
            x509.DNSName(name),
            x509.UniformResourceIdentifier(identity_uri(role, name)),
        ]
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
        .not_valid_before(now - BACKDATE)
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
