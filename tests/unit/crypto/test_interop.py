import numpy as np
import pytest

from confide.crypto import DecryptionKey, EncryptedVector

phe = pytest.importorskip("phe")


@pytest.fixture(scope="module")
def phe_keys():
    return phe.paillier.generate_paillier_keypair(n_length=2048)


def test_phe_ciphertexts_decrypt_with_confide(phe_keys):
    """python-paillier ciphertexts decrypt with a Confide key built from the same p, q."""
    public, private = phe_keys
    ours = DecryptionKey.from_primes(private.p, private.q)
    assert ours.encryption_key.n == public.n
    values = [0, 1, 123456789, public.n - 1, 2**1000 + 7]
    ciphertexts = [public.raw_encrypt(v) for v in values]
    vector = EncryptedVector.from_ciphertexts(ciphertexts, ours.encryption_key)
    assert ours.decrypt_integers(vector) == values
    signed = [public.encrypt(v).ciphertext() for v in (-5, 0, 17)]
    assert ours.decrypt(EncryptedVector.from_ciphertexts(signed, ours.encryption_key)).tolist() == [-5, 0, 17]


def test_confide_ciphertexts_decrypt_with_phe(phe_keys):
    """Confide ciphertexts (DJN, CRT and classical) decrypt with python-paillier."""
    public, private = phe_keys
    ours = DecryptionKey.from_primes(private.p, private.q)
    values = np.array([-3, 0, 99, 2**40], dtype=np.int64)
    for vector in (
        ours.encryption_key.encrypt(values),
        ours.encrypt(values),
        ours.encryption_key.encrypt(values, randomizer="classical"),
    ):
        got = [private.decrypt(phe.EncryptedNumber(public, vector.ciphertext(i))) for i in range(len(values))]
        assert got == values.tolist()
    # Homomorphic results cross over too.
    total = ours.encrypt(values) + ours.encrypt(values)
    assert private.raw_decrypt(total.ciphertext(3)) == 2 * 2**40
