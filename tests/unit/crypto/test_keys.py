import pickle

import pytest

from confide.crypto import DecryptionKey, EncryptionKey
from confide.errors import InvalidKeyError, InvalidParameterError, WireFormatError


def test_unsupported_key_size_names_the_limit():
    """Key generation refuses sizes below 2048 bits with the supported list."""
    with pytest.raises(InvalidParameterError, match="1024.*2048, 3072 and 4096"):
        DecryptionKey.generate(1024)


def test_secret_key_never_shows_or_pickles(key):
    """repr hides the primes and pickling is refused; export is explicit."""
    p, q = key.primes()
    assert str(p) not in repr(key) and hex(p)[2:] not in repr(key)
    assert "redacted" in repr(key)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(key)
    restored = DecryptionKey.import_secret(key.export_secret())
    assert restored.encryption_key == key.encryption_key
    assert restored.primes() == (p, q)


def test_public_key_round_trips_and_pickles(key):
    """Public keys serialize byte-exactly and pickle through their wire bytes."""
    public = key.encryption_key
    data = public.to_bytes()
    assert EncryptionKey.from_bytes(data).to_bytes() == data
    assert pickle.loads(pickle.dumps(public)) == public
    assert public.n.bit_length() == 2048 and public.ciphertext_bytes == 512


def test_tampered_public_key_is_refused(key):
    """A flipped bit in the key bytes breaks the key id check."""
    data = bytearray(key.encryption_key.to_bytes())
    data[40] ^= 1
    with pytest.raises(WireFormatError, match="key_id does not match"):
        EncryptionKey.from_bytes(bytes(data))
    with pytest.raises(WireFormatError, match="truncated"):
        EncryptionKey.from_bytes(bytes(data[:100]))


def test_from_primes_checks_the_primes(key):
    """Composite or mismatched factors are refused."""
    p, q = key.primes()
    with pytest.raises(InvalidKeyError, match="prime"):
        DecryptionKey.from_primes(p, 3 * q)  # odd and surely composite (q + 2 can be a twin prime)
    with pytest.raises(InvalidKeyError, match="differ"):
        DecryptionKey.from_primes(p, p)


def test_big_plaintexts_outside_int64_get_a_clear_error(key):
    """A valid plaintext beyond int64 points to decrypt_integers instead of overflowing."""
    import numpy as np

    from confide.errors import EncodingError

    vector = key.encrypt(np.array([2**62, 2**62]))
    with pytest.raises(EncodingError, match="index 0 does not fit in int64.*decrypt_integers"):
        key.decrypt(vector + vector)
    assert key.decrypt_integers(vector + vector) == [2**63, 2**63]
