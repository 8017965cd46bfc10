"""Revocation and rotation: the CA's ledger and CRL, and the CRL as a service holds it."""

from __future__ import annotations

import logging
import os
import pickle
import time

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from confide.errors import CertificateError, CertificateRevokedError, InvalidParameterError, PermissionDeniedError
from confide.transport import status, tls
from confide.transport.certs import (
    CRL_FILE,
    Identity,
    init_federation,
    issued_certificates,
    make_request,
    revoke_identity,
    rotate_identity,
    sign_request,
)
from confide.transport.revocation import RevocationGate, RevocationList


def serial_of(certs, name: str) -> int:
    return x509.load_pem_x509_certificate((certs / f"{name}.crt").read_bytes()).serial_number


def crl_of(certs) -> x509.CertificateRevocationList:
    return x509.load_pem_x509_crl((certs / CRL_FILE).read_bytes())


@pytest.fixture
def certs(tmp_path):
    init_federation(tmp_path / "certs", parties=["hospital-a", "hospital-b"], services=["aggregator"])
    return tmp_path / "certs"


def test_revoke_writes_a_crl_signed_by_the_ca_naming_every_certificate_of_the_name(certs):
    serial = serial_of(certs, "hospital-b")
    done = revoke_identity(certs, "hospital-b", reason="key_compromise")
    assert [e["serial"] for e in done.revoked] == [format(serial, "x")] and done.already == []
    crl = crl_of(certs)
    ca = x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes())
    assert crl.issuer == ca.subject and crl.is_signature_valid(ca.public_key())
    entry = crl.get_revoked_certificate_by_serial_number(serial)
    assert entry is not None
    assert entry.extensions.get_extension_for_class(x509.CRLReason).value.reason == x509.ReasonFlags.key_compromise
    assert crl.get_revoked_certificate_by_serial_number(serial_of(certs, "hospital-a")) is None
    ledger = {e["name"]: e for e in issued_certificates(certs)}
    assert ledger["hospital-b"]["revoked_at"] and ledger["hospital-b"]["reason"] == "key_compromise"
    assert ledger["hospital-a"]["revoked_at"] is None


def test_revoking_twice_is_harmless_and_the_crl_number_grows(certs):
    first = revoke_identity(certs, "hospital-b")
    second = revoke_identity(certs, "hospital-b", reason="again")
    assert len(first.revoked) == 1 and second.revoked == [] and len(second.already) == 1
    assert second.crl_number == first.crl_number + 1
    assert len(list(crl_of(certs))) == 1
    assert issued_certificates(certs)[1]["reason"] == "revoked", "the first revocation's record is kept"


def test_an_unknown_name_is_refused_naming_the_field(certs):
    with pytest.raises(InvalidParameterError, match=r"name 'hospital-z' is not an identity this CA issued.*hospital-a"):
        revoke_identity(certs, "hospital-z")
    with pytest.raises(InvalidParameterError, match="name must be"):
        revoke_identity(certs, "Hospital A")
    assert not (certs / CRL_FILE).exists()


def test_rotate_issues_a_new_certificate_with_the_same_role_and_hosts_and_revokes_the_old(certs):
    old = x509.load_pem_x509_certificate((certs / "aggregator.crt").read_bytes())
    done = rotate_identity(certs, "aggregator")
    new = x509.load_pem_x509_certificate((certs / "aggregator.crt").read_bytes())
    assert new.serial_number != old.serial_number and done.revoked[0]["serial"] == format(old.serial_number, "x")
    assert new.subject == old.subject
    sans = x509.SubjectAlternativeName
    assert new.extensions.get_extension_for_class(sans).value == old.extensions.get_extension_for_class(sans).value
    assert Identity.load(certs, "aggregator").role == "service", "the new key belongs to the new certificate"
    crl = crl_of(certs)
    entry = crl.get_revoked_certificate_by_serial_number(old.serial_number)
    assert entry.extensions.get_extension_for_class(x509.CRLReason).value.reason == x509.ReasonFlags.superseded
    assert crl.get_revoked_certificate_by_serial_number(new.serial_number) is None


def test_rotate_refuses_a_site_held_key_and_sign_replace_revokes_the_replaced_serial(certs, tmp_path):
    site = tmp_path / "site"
    name, pem = sign_request(certs, make_request(site, "hospital-d", "party").read_bytes(), role="party")
    first = x509.load_pem_x509_certificate(pem).serial_number
    with pytest.raises(InvalidParameterError, match="held by the site.*certs sign --replace"):
        rotate_identity(certs, name)
    (site / "hospital-d.key").unlink()
    _, pem = sign_request(certs, make_request(site, "hospital-d", "party").read_bytes(), role="party", replace=True)
    second = x509.load_pem_x509_certificate(pem).serial_number
    crl = crl_of(certs)
    assert crl.get_revoked_certificate_by_serial_number(first) is not None
    assert crl.get_revoked_certificate_by_serial_number(second) is None


def test_a_ca_directory_without_a_ledger_is_backfilled_from_the_certificates_it_holds(certs):
    (certs / "issued.json").unlink()
    serial = serial_of(certs, "hospital-a")
    revoke_identity(certs, "hospital-a")
    assert crl_of(certs).get_revoked_certificate_by_serial_number(serial) is not None


def test_the_service_side_list_refuses_revoked_certificates_only(certs):
    ca = (certs / "ca.crt").read_bytes()
    revocations = RevocationList(certs / CRL_FILE, ca)  # no CRL yet: nothing revoked
    a, b = ((certs / f"{n}.crt").read_bytes() for n in ("hospital-a", "hospital-b"))
    assert revocations.check(b).name == "hospital-b"
    revoke_identity(certs, "hospital-b")
    assert revocations.refresh(force=True) == {serial_of(certs, "hospital-b")}
    with pytest.raises(CertificateRevokedError, match=r"'hospital-b' \(serial [0-9a-f]+\) was revoked") as refused:
        revocations.check(b)
    assert refused.value.name == "hospital-b" and refused.value.serial == format(serial_of(certs, "hospital-b"), "x")
    assert revocations.check(a).name == "hospital-a"
    der = x509.load_pem_x509_certificate(b).public_bytes(serialization.Encoding.DER)
    with pytest.raises(CertificateRevokedError):
        revocations.check(der, pem=False)


def test_a_new_crl_is_picked_up_within_the_recheck_interval(certs):
    revocations = RevocationList(certs / CRL_FILE, (certs / "ca.crt").read_bytes(), recheck_s=0.2)
    cert = (certs / "hospital-b.crt").read_bytes()
    revocations.check(cert)
    revoke_identity(certs, "hospital-b")
    started = time.monotonic()
    while True:
        try:
            revocations.check(cert)
        except CertificateRevokedError:
            break
        assert time.monotonic() - started < 1.0, "not refused within 1 s"
        time.sleep(0.01)


def forged_crl(certs, serials: list[int], *, number: int = 99) -> bytes:
    """A CRL with the federation CA's subject, signed by another key."""
    ca = x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = ca.not_valid_before_utc
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca.subject)
        .last_update(now)
        .next_update(ca.not_valid_after_utc)
        .add_extension(x509.CRLNumber(number), critical=False)
    )
    for serial in serials:
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(now).build()
        )
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def test_a_forged_or_garbled_crl_is_refused_loudly_at_start_and_on_reload(certs, caplog):
    ca = (certs / "ca.crt").read_bytes()
    path = certs / CRL_FILE
    path.write_bytes(forged_crl(certs, [serial_of(certs, "hospital-a")]))
    with pytest.raises(CertificateError, match="does not verify with the federation CA key"):
        RevocationList(path, ca)
    path.write_bytes(b"-----BEGIN X509 CRL-----\nnot a crl\n-----END X509 CRL-----\n")
    with pytest.raises(CertificateError, match="not a PEM X.509 CRL"):
        RevocationList(path, ca)

    # On reload: an error in the log, and the list in force stays in force (hospital-b stays revoked).
    revoke_identity(certs, "hospital-b")
    revocations = RevocationList(path, ca)
    path.write_bytes(forged_crl(certs, [serial_of(certs, "hospital-a")]))
    os.utime(path, (time.time() + 5, time.time() + 5))
    with caplog.at_level(logging.ERROR, logger="confide.revocation"):
        assert revocations.refresh(force=True) == frozenset()
    assert "refused: its signature does not verify" in caplog.text
    revocations.check((certs / "hospital-a.crt").read_bytes())
    with pytest.raises(CertificateRevokedError):
        revocations.check((certs / "hospital-b.crt").read_bytes())


def test_an_older_crl_put_back_does_not_unrevoke(certs, caplog):
    ca = (certs / "ca.crt").read_bytes()
    revoke_identity(certs, "hospital-a")
    older = (certs / CRL_FILE).read_bytes()
    revoke_identity(certs, "hospital-b")
    revocations = RevocationList(certs / CRL_FILE, ca)
    (certs / CRL_FILE).write_bytes(older)
    os.utime(certs / CRL_FILE, (time.time() + 5, time.time() + 5))
    with caplog.at_level(logging.ERROR, logger="confide.revocation"):
        revocations.refresh(force=True)
    assert "an older list was put back" in caplog.text
    with pytest.raises(CertificateRevokedError):
        revocations.check((certs / "hospital-b.crt").read_bytes())


def test_the_revoked_error_pickles_and_maps_to_its_own_grpc_status():
    error = CertificateRevokedError("revoked", name="hospital-b", serial="ab12")
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, PermissionDeniedError) and (copy.name, copy.serial, str(copy)) == (
        "hospital-b",
        "ab12",
        "revoked",
    )
    assert status.code_of(error) == (grpc.StatusCode.UNAUTHENTICATED, "revoked")

    class Failed(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.UNAUTHENTICATED

        def details(self):
            return "the certificate of 'hospital-b' was revoked"

    assert isinstance(status.from_rpc_error(Failed(), "pushing"), CertificateRevokedError)


def test_the_gate_refuses_new_calls_and_cuts_open_streams_of_a_revoked_certificate(certs):
    """A gRPC server on loopback with the gate: the revoked caller's open stream ends with UNAUTHENTICATED."""
    service = Identity.load(certs, "aggregator")
    gate = RevocationGate(RevocationList(certs / CRL_FILE, service.ca_pem, recheck_s=0.1), "test")
    cut: list[tuple[str, str]] = []
    gate.on_cut(lambda name, serial, _message: cut.append((name, serial)))

    def stream(_request, context):
        while context.is_active():
            time.sleep(0.02)
            yield b"tick"

    handlers = {
        "Stream": grpc.unary_stream_rpc_method_handler(stream),
        "Ping": grpc.unary_unary_rpc_method_handler(lambda request, _context: request),
    }
    server, port = tls.server(service, "127.0.0.1:0", max_workers=8, interceptors=[gate])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", handlers),))
    server.start()
    gate.start()
    channels = {n: tls.channel(f"localhost:{port}", Identity.load(certs, n)) for n in ("hospital-a", "hospital-b")}
    try:
        pings = {n: c.unary_unary("/t.S/Ping") for n, c in channels.items()}
        assert pings["hospital-b"](b"x", timeout=10) == b"x"
        streams = {n: c.unary_stream("/t.S/Stream")(b"", timeout=30) for n, c in channels.items()}
        for s in streams.values():
            next(s)
        assert gate.open_calls() == 2
        revoke_identity(certs, "hospital-b")
        revoked_at = time.monotonic()
        with pytest.raises(grpc.RpcError) as ended:
            for _ in streams["hospital-b"]:
                pass
        took = time.monotonic() - revoked_at
        assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED and "revoked" in ended.value.details()
        assert took < 1.0, f"the open stream was cut after {took:.2f} s"
        # The listeners hear of the cut once the calls are ended: the client may see its end first.
        deadline = time.monotonic() + 5
        while not cut and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cut == [("hospital-b", format(serial_of(certs, "hospital-b"), "x"))]
        assert next(streams["hospital-a"]) == b"tick", "other callers' streams go on"
        with pytest.raises(grpc.RpcError) as refused:
            pings["hospital-b"](b"x", timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert isinstance(status.from_rpc_error(refused.value, "ping"), CertificateRevokedError)
        assert pings["hospital-a"](b"y", timeout=10) == b"y"
        streams["hospital-a"].cancel()
    finally:
        gate.stop()
        for c in channels.values():
            c.close()
        server.stop(grace=None)


def test_rotated_certificate_is_admitted_and_the_old_one_refused(certs):
    revocations = RevocationList(certs / CRL_FILE, (certs / "ca.crt").read_bytes())
    old = (certs / "hospital-a.crt").read_bytes()
    rotate_identity(certs, "hospital-a")
    revocations.refresh(force=True)
    assert revocations.check((certs / "hospital-a.crt").read_bytes()).name == "hospital-a"
    with pytest.raises(CertificateRevokedError, match="superseded"):
        revocations.check(old)
