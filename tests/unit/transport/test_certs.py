import base64
import ipaddress
import os
import stat
from concurrent import futures
from datetime import datetime, timedelta, timezone
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from confide.errors import CertificateError, ConfideError, InvalidParameterError
from confide.transport.certs import (
    ROLE_ADMIN,
    ROLE_PARTY,
    ROLE_SERVICE,
    Identity,
    init_federation,
    issue_identity,
    name_from_auth_context,
    peer_identity,
    verify_signature,
)

PARTIES = ["hospital-a", "hospital-b"]


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    root = tmp_path_factory.mktemp("fed")
    init_federation(root, parties=PARTIES)
    return root


@pytest.fixture(scope="module")
def other_fed(tmp_path_factory):
    root = tmp_path_factory.mktemp("other")
    init_federation(root, parties=["hospital-a"])
    return root


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


# ---------------------------------------------------------------------------------------------------------------------
# init_federation


def test_init_creates_all_files_with_private_keys(tmp_path):
    out = init_federation(tmp_path / "pki", parties=PARTIES, services=["aggregator", "relay"], admins=["runner"])
    root = tmp_path / "pki"
    assert set(out) == {"hospital-a", "hospital-b", "aggregator", "relay", "runner"}
    for name, path in out.items():
        assert path == root / f"{name}.crt"
        assert path.is_file()
        assert _mode(root / f"{name}.key") == 0o600
    assert (root / "ca.crt").is_file()
    assert _mode(root / "ca.key") == 0o600
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temp files left


def test_ca_and_leaf_extensions(fed):
    ca = _cert(fed / "ca.crt")
    bc = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    ku = ca.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.key_cert_sign and ku.crl_sign
    assert isinstance(ca.public_key(), ec.EllipticCurvePublicKey)
    assert isinstance(ca.signature_hash_algorithm, hashes.SHA256)

    svc = _cert(fed / "aggregator.crt")
    assert svc.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "aggregator"
    assert svc.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == ROLE_SERVICE
    assert svc.issuer == ca.subject
    assert not svc.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = svc.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["confide://service/aggregator"]
    eku = svc.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert 0 < svc.serial_number < 2**128
    assert svc.not_valid_before_utc < datetime.now(timezone.utc) - timedelta(minutes=4)
    assert svc.not_valid_after_utc - svc.not_valid_before_utc <= timedelta(days=365, minutes=5)

    party = _cert(fed / "hospital-a.crt")
    san = party.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["hospital-a"]
    assert san.get_values_for_type(x509.IPAddress) == []
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["confide://party/hospital-a"]
    eku = party.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}

    admin = _cert(fed / "runner.crt")
    eku = admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert _cert(fed / "hospital-b.crt").serial_number != party.serial_number


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"parties": ["Hospital-A"]}, "parties entry"),
        ({"parties": [""]}, "1..64"),
        ({"parties": ["a" * 65]}, "1..64"),
        ({"parties": ["a_b"]}, r"\[a-z0-9-\]"),
        ({"parties": ["ca"]}, "reserved"),
        ({"parties": ["x", "x"]}, "unique"),
        ({"parties": ["x"], "services": ["x"]}, "unique"),
        ({"parties": ["x"], "admins": ["aggregator"]}, "unique"),
        ({"parties": "hospital-a"}, "list of names"),
        ({"parties": ["x"], "hosts": ["bad host"]}, "hosts entry"),
        ({"parties": ["x"], "hosts": []}, "at least one"),
        ({"parties": ["x"], "days": 0}, "days"),
    ],
)
def test_init_validates_arguments(tmp_path, kwargs, match):
    with pytest.raises(InvalidParameterError, match=match):
        init_federation(tmp_path, **kwargs)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_init_refuses_to_overwrite(tmp_path):
    init_federation(tmp_path, parties=["x"])
    before = (tmp_path / "ca.crt").read_bytes()
    with pytest.raises(InvalidParameterError, match="ca.crt"):
        init_federation(tmp_path, parties=["x"])
    assert (tmp_path / "ca.crt").read_bytes() == before
    init_federation(tmp_path, parties=["x"], overwrite=True)
    assert (tmp_path / "ca.crt").read_bytes() != before
    assert _mode(tmp_path / "ca.key") == 0o600
    assert peer_identity((tmp_path / "x.crt").read_bytes(), (tmp_path / "ca.crt").read_bytes()) == ("x", ROLE_PARTY)


def test_issue_identity_adds_to_federation(tmp_path):
    init_federation(tmp_path, parties=["a"])
    path = issue_identity(tmp_path, "relay", ROLE_SERVICE, hosts=["relay.example", "10.0.0.7"], days=30)
    assert path == tmp_path / "relay.crt"
    assert _mode(tmp_path / "relay.key") == 0o600
    ident = Identity.load(tmp_path, "relay")
    assert ident.role == ROLE_SERVICE
    san = _cert(path).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["relay.example"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7")]
    with pytest.raises(InvalidParameterError, match="already exists"):
        issue_identity(tmp_path, "a", ROLE_ADMIN)
    with pytest.raises(InvalidParameterError, match="role"):
        issue_identity(tmp_path, "b", "boss")
    with pytest.raises(FileNotFoundError, match="ca.crt"):
        issue_identity(tmp_path / "nowhere", "b", ROLE_PARTY)


# ---------------------------------------------------------------------------------------------------------------------
# Identity


def test_load_round_trip(fed):
    ident = Identity.load(fed, "hospital-a")
    assert (ident.name, ident.role) == ("hospital-a", ROLE_PARTY)
    assert ident.cert_pem == (fed / "hospital-a.crt").read_bytes()
    assert ident.key_pem == (fed / "hospital-a.key").read_bytes()
    assert ident.ca_pem == (fed / "ca.crt").read_bytes()
    assert b"BEGIN PRIVATE KEY" in ident.key_pem  # PKCS8, unencrypted
    assert Identity.load(str(fed), "aggregator").role == ROLE_SERVICE
    assert Identity.load(fed, "runner").role == ROLE_ADMIN
    assert peer_identity(ident.cert_pem, ident.ca_pem) == ("hospital-a", ROLE_PARTY)


def test_load_missing_file_is_named(fed, tmp_path):
    with pytest.raises(FileNotFoundError, match="nobody.crt"):
        Identity.load(fed, "nobody")
    (tmp_path / "hospital-a.crt").write_bytes((fed / "hospital-a.crt").read_bytes())
    with pytest.raises(FileNotFoundError, match="hospital-a.key"):
        Identity.load(tmp_path, "hospital-a")
    (tmp_path / "hospital-a.key").write_bytes((fed / "hospital-a.key").read_bytes())
    with pytest.raises(FileNotFoundError, match="ca.crt"):
        Identity.load(tmp_path, "hospital-a")


def test_load_rejects_wrong_key_and_wrong_name(fed, tmp_path):
    for f in ("ca.crt", "hospital-a.crt"):
        (tmp_path / f).write_bytes((fed / f).read_bytes())
    (tmp_path / "hospital-a.key").write_bytes((fed / "hospital-b.key").read_bytes())
    with pytest.raises(CertificateError, match="does not belong"):
        Identity.load(tmp_path, "hospital-a")
    (tmp_path / "hospital-b.crt").write_bytes((fed / "hospital-a.crt").read_bytes())
    (tmp_path / "hospital-b.key").write_bytes((fed / "hospital-a.key").read_bytes())
    with pytest.raises(CertificateError, match="names 'hospital-a'"):
        Identity.load(tmp_path, "hospital-b")


def test_load_rejects_cert_from_another_ca(fed, other_fed, tmp_path):
    (tmp_path / "ca.crt").write_bytes((fed / "ca.crt").read_bytes())
    for f in ("hospital-a.crt", "hospital-a.key"):
        (tmp_path / f).write_bytes((other_fed / f).read_bytes())
    with pytest.raises(CertificateError):
        Identity.load(tmp_path, "hospital-a")


def test_repr_hides_key(fed):
    ident = Identity.load(fed, "hospital-a")
    text = repr(ident)
    assert "hospital-a" in text and "party" in text
    assert "PRIVATE" not in text and ident.key_pem.decode() not in text
    assert "PRIVATE" not in str(ident)


def test_identity_validates_fields(fed):
    ident = Identity.load(fed, "hospital-a")
    with pytest.raises(InvalidParameterError, match="role"):
        Identity("x", "boss", ident.cert_pem, ident.key_pem, ident.ca_pem)
    with pytest.raises(InvalidParameterError, match="key_pem"):
        Identity("x", ROLE_PARTY, ident.cert_pem, "not bytes", ident.ca_pem)


# ---------------------------------------------------------------------------------------------------------------------
# peer_identity


def test_peer_identity_accepts_own_ca(fed):
    ca = (fed / "ca.crt").read_bytes()
    assert peer_identity((fed / "hospital-b.crt").read_bytes(), ca) == ("hospital-b", ROLE_PARTY)
    assert peer_identity((fed / "aggregator.crt").read_bytes(), ca) == ("aggregator", ROLE_SERVICE)
    assert peer_identity((fed / "runner.crt").read_bytes(), ca) == ("runner", ROLE_ADMIN)


def test_peer_identity_rejects_other_federation(fed, other_fed):
    with pytest.raises(CertificateError, match="federation CA"):
        peer_identity((other_fed / "hospital-a.crt").read_bytes(), (fed / "ca.crt").read_bytes())


def _forge(ca_dir: Path, *, name="hospital-a", role="party", issuer=None, before=None, after=None, ca=False):
    """A certificate built directly with cryptography, signed by ``ca_dir``'s CA key."""
    ca_cert = _cert(ca_dir / "ca.crt")
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                    x509.NameAttribute(NameOID.COMMON_NAME, name),
                ]
            )
        )
        .issuer_name(issuer or ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(before or now - timedelta(days=1))
        .not_valid_after(after or now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    cert = builder.sign(ca_key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def test_peer_identity_rejects_expired_and_not_yet_valid(fed):
    ca = (fed / "ca.crt").read_bytes()
    now = datetime.now(timezone.utc)
    good, _ = _forge(fed)
    assert peer_identity(good, ca) == ("hospital-a", ROLE_PARTY)
    expired, _ = _forge(fed, before=now - timedelta(days=10), after=now - timedelta(days=1))
    with pytest.raises(CertificateError, match="expired"):
        peer_identity(expired, ca)
    future, _ = _forge(fed, before=now + timedelta(days=1), after=now + timedelta(days=10))
    with pytest.raises(CertificateError, match="not valid before"):
        peer_identity(future, ca)


def test_peer_identity_rejects_bad_certificates(fed, other_fed):
    ca = (fed / "ca.crt").read_bytes()
    sub_ca, _ = _forge(fed, ca=True)
    with pytest.raises(CertificateError, match="is a CA"):
        peer_identity(sub_ca, ca)
    with pytest.raises(CertificateError, match="issued by"):
        peer_identity(_forge(fed, issuer=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "evil")]))[0], ca)
    # Same issuer name as our CA but signed by another CA's key.
    same_name, _ = _forge(other_fed, issuer=_cert(fed / "ca.crt").subject)
    with pytest.raises(CertificateError, match="signature"):
        peer_identity(same_name, ca)
    with pytest.raises(CertificateError, match="OU"):
        peer_identity(_forge(fed, role="root")[0], ca)
    with pytest.raises(CertificateError, match="CN"):
        peer_identity(_forge(fed, name="Not Valid")[0], ca)
    with pytest.raises(CertificateError, match="not a CA certificate"):
        peer_identity(ca, (fed / "hospital-a.crt").read_bytes())
    with pytest.raises(CertificateError, match="not a PEM"):
        peer_identity(b"garbage", ca)
    with pytest.raises(ConfideError):
        peer_identity((fed / "ca.crt").read_bytes(), ca)  # the CA itself is no identity


# ---------------------------------------------------------------------------------------------------------------------
# sign / verify_signature


def test_sign_verify_round_trip(fed):
    ident = Identity.load(fed, "hospital-a")
    sig = ident.sign(b"round 3 update")
    assert verify_signature(ident.cert_pem, ident.ca_pem, b"round 3 update", sig) == "hospital-a"
    assert verify_signature(ident.cert_pem, ident.ca_pem, b"round 3 update", sig, expected_name="hospital-a") == (
        "hospital-a"
    )
    assert verify_signature(ident.cert_pem, ident.ca_pem, bytearray(b"round 3 update"), memoryview(sig))


def test_verify_rejects_tampering_and_wrong_signer(fed):
    a = Identity.load(fed, "hospital-a")
    b = Identity.load(fed, "hospital-b")
    sig = a.sign(b"data")
    with pytest.raises(CertificateError, match="does not verify"):
        verify_signature(a.cert_pem, a.ca_pem, b"datA", sig)
    with pytest.raises(CertificateError, match="does not verify"):
        verify_signature(b.cert_pem, b.ca_pem, b"data", sig)
    with pytest.raises(CertificateError, match="does not verify"):
        verify_signature(a.cert_pem, a.ca_pem, b"data", b"\x30\x06\x02\x01\x01\x02\x01\x01")
    with pytest.raises(CertificateError, match="certificate names 'hospital-a', message claims 'hospital-b'"):
        verify_signature(a.cert_pem, a.ca_pem, b"data", sig, expected_name="hospital-b")
    with pytest.raises(InvalidParameterError, match="data"):
        verify_signature(a.cert_pem, a.ca_pem, "data", sig)
    with pytest.raises(InvalidParameterError, match="data"):
        a.sign("text")


def test_verify_rejects_signer_from_other_federation(fed, other_fed):
    intruder = Identity.load(other_fed, "hospital-a")
    sig = intruder.sign(b"data")
    with pytest.raises(CertificateError):
        verify_signature(intruder.cert_pem, (fed / "ca.crt").read_bytes(), b"data", sig, expected_name="hospital-a")


# ---------------------------------------------------------------------------------------------------------------------
# name_from_auth_context


def test_name_from_auth_context_dicts(fed):
    pem = (fed / "hospital-b.crt").read_bytes()
    assert name_from_auth_context({"x509_common_name": [b"hospital-a"], "x509_pem_cert": [pem]}) == "hospital-a"
    assert name_from_auth_context({"x509_pem_cert": [pem]}) == "hospital-b"
    assert name_from_auth_context({"transport_security_type": [b"ssl"]}) is None
    assert name_from_auth_context({}) is None
    assert name_from_auth_context(None) is None


# ---------------------------------------------------------------------------------------------------------------------
# Real gRPC over mutual TLS


def _who(request, context):
    return (name_from_auth_context(context.auth_context()) or "").encode()


@pytest.fixture(scope="module")
def mtls_port(fed):
    server_id = Identity.load(fed, "aggregator")
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        handlers=[
            grpc.method_handlers_generic_handler(
                "test.Echo",
                {"Who": grpc.unary_unary_rpc_method_handler(_who)},
            )
        ],
    )
    creds = grpc.ssl_server_credentials(
        [(server_id.key_pem, server_id.cert_pem)], root_certificates=server_id.ca_pem, require_client_auth=True
    )
    port = server.add_secure_port("127.0.0.1:0", creds)
    assert port > 0
    server.start()
    yield port
    server.stop(None).wait()


def _call(port, creds):
    with grpc.secure_channel(f"localhost:{port}", creds) as channel:
        who = channel.unary_unary("/test.Echo/Who", request_serializer=None, response_deserializer=None)
        return who(b"", timeout=5)


@pytest.mark.parametrize("name", ["hospital-a", "runner"])
def test_grpc_mtls_returns_client_name(fed, mtls_port, name):
    ident = Identity.load(fed, name)
    creds = grpc.ssl_channel_credentials(
        root_certificates=ident.ca_pem, private_key=ident.key_pem, certificate_chain=ident.cert_pem
    )
    assert _call(mtls_port, creds) == name.encode()


def test_grpc_mtls_rejects_client_from_other_ca(fed, other_fed, mtls_port):
    intruder = Identity.load(other_fed, "hospital-a")
    creds = grpc.ssl_channel_credentials(
        root_certificates=(fed / "ca.crt").read_bytes(),  # trusts the server, but its own cert is foreign
        private_key=intruder.key_pem,
        certificate_chain=intruder.cert_pem,
    )
    with pytest.raises(grpc.RpcError) as info:
        _call(mtls_port, creds)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_grpc_mtls_rejects_client_without_cert(fed, mtls_port):
    creds = grpc.ssl_channel_credentials(root_certificates=(fed / "ca.crt").read_bytes())
    with pytest.raises(grpc.RpcError) as info:
        _call(mtls_port, creds)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_grpc_client_rejects_server_from_other_ca(other_fed, mtls_port):
    ident = Identity.load(other_fed, "hospital-a")
    creds = grpc.ssl_channel_credentials(
        root_certificates=ident.ca_pem, private_key=ident.key_pem, certificate_chain=ident.cert_pem
    )
    with pytest.raises(grpc.RpcError) as info:
        _call(mtls_port, creds)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_key_files_not_world_readable_even_with_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        init_federation(tmp_path, parties=["x"])
    finally:
        os.umask(old)
    assert _mode(tmp_path / "x.key") == 0o600
    assert _mode(tmp_path / "ca.key") == 0o600
    assert _mode(tmp_path / "x.crt") == 0o644


# ---------------------------------------------------------------------------------------------- per-site enrollment


def test_init_names_the_flag_and_makes_a_controller_identity(tmp_path):
    init_federation(tmp_path, parties=["x"])
    assert (tmp_path / "controller.crt").exists() and (tmp_path / "controller.key").exists()
    with pytest.raises(InvalidParameterError, match="--force") as raised:
        init_federation(tmp_path, parties=["x"])
    assert "overwrite=True" not in str(raised.value) and "certs add" in str(raised.value)


def test_a_site_enrolls_by_signing_request_and_its_key_never_leaves_it(tmp_path):
    from confide.transport.certs import make_request, sign_request

    operator, site = tmp_path / "operator", tmp_path / "site"
    init_federation(operator, parties=["hospital-a"])
    ca_before = (operator / "ca.crt").read_bytes()
    csr_path = make_request(site, "hospital-d", ROLE_PARTY)
    assert _mode(site / "hospital-d.key") == 0o600 and not (operator / "hospital-d.key").exists()
    name, pem = sign_request(operator, csr_path.read_bytes(), role=ROLE_PARTY)
    assert name == "hospital-d" and (operator / "issued" / "hospital-d.crt").read_bytes() == pem
    (site / "hospital-d.crt").write_bytes(pem)
    (site / "ca.crt").write_bytes((operator / "ca.crt").read_bytes())
    identity = Identity.load(site, "hospital-d")  # the site's own key matches the signed certificate
    assert identity.role == ROLE_PARTY and (operator / "ca.crt").read_bytes() == ca_before
    assert peer_identity(pem, ca_before) == ("hospital-d", ROLE_PARTY)
    # The same name again would impersonate the site: refused unless it is a re-enrollment.
    again = make_request(tmp_path / "thief", "hospital-d", ROLE_PARTY)
    with pytest.raises(CertificateError, match="already has an identity 'hospital-d'"):
        sign_request(operator, again.read_bytes(), role=ROLE_PARTY)
    sign_request(operator, again.read_bytes(), role=ROLE_PARTY, replace=True)
    # Names the CA directory issued itself count too.
    ours = make_request(tmp_path / "other", "hospital-a", ROLE_PARTY)
    with pytest.raises(CertificateError, match="already has an identity 'hospital-a'"):
        sign_request(operator, ours.read_bytes(), role=ROLE_PARTY)


def test_forged_altered_or_mismatched_requests_are_refused(tmp_path):
    from confide.transport.certs import make_request, sign_request

    operator = tmp_path / "operator"
    init_federation(operator, parties=["hospital-a"])
    pem = make_request(tmp_path / "site", "hospital-e", ROLE_PARTY).read_bytes()
    csr = x509.load_pem_x509_csr(pem)
    der = csr.public_bytes(serialization.Encoding.DER)
    altered = der.replace(b"hospital-e", b"hospital-f")  # the name changed after signing
    forged = b"-----BEGIN CERTIFICATE REQUEST-----\n" + base64.encodebytes(altered)
    forged += b"-----END CERTIFICATE REQUEST-----\n"
    with pytest.raises(CertificateError, match="forged or altered"):
        sign_request(operator, forged, role=ROLE_PARTY)
    with pytest.raises(CertificateError, match="asks for role 'party'.*signs it as 'admin'"):
        sign_request(operator, pem, role=ROLE_ADMIN)
    with pytest.raises(CertificateError, match="not a PEM certificate signing request"):
        sign_request(operator, b"hello", role=ROLE_PARTY)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    other = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "party"),
                    x509.NameAttribute(NameOID.COMMON_NAME, "hospital-g"),
                ]
            )
        )
        .sign(key, hashes.SHA256())
    )
    with pytest.raises(CertificateError, match="ECDSA"):
        sign_request(operator, other.public_bytes(serialization.Encoding.PEM), role=ROLE_PARTY)
    assert not (operator / "issued").exists()  # nothing was signed


def test_a_missing_identity_is_a_confide_error_naming_the_known_ones(fed):
    with pytest.raises(ConfideError, match="identities in .*hospital-a, hospital-b"):
        Identity.load(fed, "nobody")
