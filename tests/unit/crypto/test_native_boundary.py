import threading
import time

import numpy as np
import pytest

from confide.crypto import BatchCryptCodec, encrypt_packed


def test_native_work_releases_the_gil(key):
    """A Python thread keeps running while a long native encryption is in flight."""
    codec = BatchCryptCodec(bits=16, max_parties=4, alpha=1.0, seed=1)
    values = np.zeros(97 * 1600)
    key.precompute()
    ticks = 0
    done = threading.Event()

    def work():
        encrypt_packed(values, codec, key, threads=1)
        done.set()

    worker = threading.Thread(target=work)
    start = time.perf_counter()
    worker.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    worker.join()
    elapsed = time.perf_counter() - start
    # 1600 encryptions take tens of milliseconds; with the GIL held the loop would be starved.
    assert elapsed > 0.02
    assert ticks >= elapsed / 0.001 * 0.3


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_forked_children_can_use_the_native_pools(key):
    """A child forked after the parent used the thread pools still computes (no deadlock)."""
    import multiprocessing

    values = np.arange(20)
    key.encrypt(values, threads=2)  # parent creates its pools
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        result = pool.apply_async(_encrypt_and_decrypt, (key.export_secret(),))
        assert result.get(timeout=60) == list(range(20))


def _encrypt_and_decrypt(secret: bytes) -> list[int]:
    from confide.crypto import DecryptionKey

    child_key = DecryptionKey.import_secret(secret)
    return child_key.decrypt(child_key.encrypt(np.arange(20), threads=2), threads=2).tolist()


def test_bad_arguments_name_the_field(key):
    """Thread counts, randomizer names, dtypes and vector kinds are checked with clear errors."""
    from confide.crypto import decrypt_packed
    from confide.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="threads.*at most 256"):
        key.encrypt(np.arange(3), threads=1000)
    with pytest.raises(InvalidParameterError, match="randomizer.*'fixed_base' or 'classical'"):
        key.encrypt(np.arange(3), randomizer="fast")
    with pytest.raises(InvalidParameterError, match="integer numpy array"):
        key.encrypt(np.array([0.5]))
    with pytest.raises(InvalidParameterError, match="raw ciphertexts, not a packed vector"):
        decrypt_packed(key.encrypt(np.arange(3)), key)
    with pytest.raises(InvalidParameterError, match="EncryptedVector"):
        key.decrypt([1, 2, 3])
