import threading
import time

import numpy as np

from confide.crypto import BatchCryptCodec, encrypt_packed


def test_native_work_releases_the_gil(key):
    """A Python thread keeps running while a long native encryption is in flight."""
    codec = BatchCryptCodec(bits=16, max_parties=4, alpha=1.0, seed=1)
    values = np.zeros(97 * 400)
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
    # 400 encryptions take tens of milliseconds; with the GIL held the loop would be starved.
    assert elapsed > 0.02
    assert ticks >= elapsed / 0.001 * 0.3
