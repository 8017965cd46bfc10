import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from confide.crypto import DecryptionKey, EncryptedVector, sum_encrypted
from confide.errors import InvalidCiphertextError, KeyMismatchError, WireFormatError

int64s = arrays(np.int64, st.integers(1, 12), elements=st.integers(-(2**61), 2**61))


@settings(max_examples=15, deadline=None)
@given(a=int64s, data=st.data())
def test_addition_scalar_negation_identities(key, a, data):
    """Dec(Enc(a) + Enc(b)) = a + b; scalar, negation and add-plain identities hold."""
    b = data.draw(arrays(np.int64, a.size, elements=st.integers(-(2**61), 2**61)))
    s = data.draw(arrays(np.int64, a.size, elements=st.integers(-(2**20), 2**20)))
    small = a // 2**22
    public = key.encryption_key
    ca, cb = public.encrypt(a), key.encrypt(b)
    assert np.array_equal(key.decrypt(ca + cb), a + b)
    assert np.array_equal(key.decrypt(public.encrypt(small).mul_scalar(s)), small * s)
    assert np.array_equal(key.decrypt(ca.negate()), -a)
    assert np.array_equal(key.decrypt(ca.add_plain(b)), a + b)
    fresh = ca.rerandomize()
    assert fresh.ciphertext(0) != ca.ciphertext(0) and fresh.rerandomized
    assert np.array_equal(key.decrypt(fresh), a)


@settings(max_examples=10, deadline=None)
@given(values=int64s)
def test_crt_public_and_classical_paths_agree(key, values):
    """Every encryption path decrypts to the same plaintext, on 1 and 2 threads."""
    public = key.encryption_key
    for threads in (1, 2):
        for vector in (
            public.encrypt(values, threads=threads),
            key.encrypt(values, threads=threads),
            public.encrypt(values, randomizer="classical", threads=threads),
            key.encrypt(values, randomizer="classical", threads=threads),
        ):
            assert np.array_equal(key.decrypt(vector, threads=threads), values)


def test_wire_round_trip_is_byte_exact(key):
    """A ciphertext block parses back to identical bytes."""
    vector = key.encrypt(np.arange(-5, 5))
    data = vector.to_bytes()
    again = EncryptedVector.from_bytes(data, key.encryption_key)
    assert again.to_bytes() == data
    assert np.array_equal(key.decrypt(again), np.arange(-5, 5))


def test_wire_rejects_out_of_range_and_foreign_blocks(key):
    """c = 0, c >= n^2, wrong length and wrong key id are refused with clear errors."""
    public = key.encryption_key
    vector = key.encrypt(np.arange(4))
    data = vector.to_bytes()
    body = len(data) - 4 * public.ciphertext_bytes
    zero = bytearray(data)
    zero[body + 512 : body + 1024] = bytes(512)
    with pytest.raises(InvalidCiphertextError, match="index 1.*0 < c < n\\^2"):
        EncryptedVector.from_bytes(bytes(zero), public)
    huge = bytearray(data)
    huge[body : body + 512] = b"\xff" * 512
    with pytest.raises(InvalidCiphertextError, match="index 0"):
        EncryptedVector.from_bytes(bytes(huge), public)
    with pytest.raises(WireFormatError, match="length must be"):
        EncryptedVector.from_bytes(data + b"\x00", public)
    other = DecryptionKey.generate(2048)
    with pytest.raises(KeyMismatchError, match="belongs to key"):
        EncryptedVector.from_bytes(data, other.encryption_key)
    with pytest.raises(KeyMismatchError):
        sum_encrypted([vector, other.encrypt(np.arange(4))])
    with pytest.raises(KeyMismatchError):
        other.decrypt(vector)
    with pytest.raises(InvalidCiphertextError):
        EncryptedVector.from_ciphertexts([0], public)
    with pytest.raises(InvalidCiphertextError):
        EncryptedVector.from_ciphertexts([public.n**2], public)
