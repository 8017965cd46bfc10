"""The GPU Paillier engine (FLBooster's engine): chosen at run time, named in every report.

``CONFIDE_ENGINE`` picks the engine:

=========  ===================================================================================
``auto``   (default) the GPU when one is usable, else the CPU engines (IFMA or GMP); the report
           says which ran and, for the CPU, why the GPU did not
``gpu``    the GPU or a clear error (no silent fallback): for benchmarks and GPU hosts
``cpu``    the CPU engines only
=========  ===================================================================================

A GPU is usable when the ``confide[gpu]`` extra (``cuda-bindings`` and NVRTC) is installed, the
driver answers, and it loads the PTX that NVRTC compiles from ``paillier.cu`` at run time (no CUDA
toolkit needed). Nothing here is imported by the CPU paths unless an engine is selected.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confide.crypto.gpu.backend import CpuBackend, GpuBackend, GpuUnavailable

__all__ = [
    "CpuBackend",
    "EngineChoice",
    "GpuBackend",
    "GpuUnavailable",
    "gpu_backend",
    "public_key_parts",
    "select_engine",
]

ENGINE_CHOICES = ("auto", "cpu", "gpu")

_BACKENDS: dict[int, Any] = {}


def gpu_backend(limbs: int) -> GpuBackend:
    """The process's GPU backend for moduli of ``limbs`` 32-bit limbs (compiled once)."""
    if limbs not in _BACKENDS:
        _BACKENDS[limbs] = GpuBackend(limbs)
    return _BACKENDS[limbs]


def _probe() -> None:
    gpu_backend(128)


@dataclass(frozen=True)
class EngineChoice:
    """Which engine runs Paillier here: ``gpu`` is the backend factory, or None for the CPU."""

    name: str
    gpu: Callable[[int], GpuBackend] | None
    reason: str

    def report(self) -> dict[str, str]:
        """What ran, for a report."""
        return {"engine": self.name, "engine_reason": self.reason}


def _cpu_name() -> str:
    from confide import _native

    return f"cpu:{_native.engine()}"


def select_engine(probe: Callable[[], None] = _probe) -> EngineChoice:
    """The engine ``CONFIDE_ENGINE`` asks for, probed once; see the module docstring."""
    wanted = os.environ.get("CONFIDE_ENGINE", "auto").strip().lower() or "auto"
    if wanted not in ENGINE_CHOICES:
        raise ValueError(f"CONFIDE_ENGINE must be one of {', '.join(ENGINE_CHOICES)}, got {wanted!r}")
    if wanted == "cpu":
        return EngineChoice(_cpu_name(), None, "CONFIDE_ENGINE=cpu")
    try:
        probe()
    except GpuUnavailable as exc:
        if wanted == "gpu":
            raise GpuUnavailable(f"CONFIDE_ENGINE=gpu, but the GPU engine cannot run: {exc}") from exc
        return EngineChoice(_cpu_name(), None, f"no usable GPU: {exc}")
    backend = gpu_backend(128)
    return EngineChoice(backend.name, gpu_backend, f"CONFIDE_ENGINE={wanted}")


def public_key_parts(public) -> tuple[int, int, int]:
    """(n, h_s, rand_bits) of a native EncryptionKey, read from its canonical bytes (wire.rs)."""
    data = public.to_bytes()
    at = 1 + data[0]
    k = int.from_bytes(data[at : at + 2], "big")
    at += 2
    n = int.from_bytes(data[at : at + k // 8], "big")
    at += k // 8
    h_s = int.from_bytes(data[at : at + 2 * k // 8], "big")
    at += 2 * k // 8
    rand_bits = int.from_bytes(data[at : at + 2], "big")
    return n, h_s, rand_bits


# ------------------------------------------------------------------------------------------------
# The hooks confide.crypto's packed encryption and decryption call (None: the CPU engine runs)
# ------------------------------------------------------------------------------------------------

#: Below this many plaintexts a batch stays on the CPU: a launch, the copies and the first use of
#: a key's table cost more than the CPU engine takes for a few hundred ciphertexts.
GPU_MIN_PLAINTEXTS = 256

_STATE: dict[str, Any] = {"choice": None, "fallbacks": 0, "gpu_batches": 0, "cpu_batches": 0, "last_fallback": ""}
_KERNELS: dict[str, Any] = {}


def current_engine() -> EngineChoice:
    """The engine chosen for this process (``CONFIDE_ENGINE``, probed on first use)."""
    if _STATE["choice"] is None:
        _STATE["choice"] = select_engine()
    return _STATE["choice"]


def reset_engine() -> None:
    """Forget the choice and the per-key state (tests; a changed ``CONFIDE_ENGINE``)."""
    _STATE.update(choice=None, fallbacks=0, gpu_batches=0, cpu_batches=0, last_fallback="")
    _KERNELS.clear()
    _HISTOGRAM_INPUTS.clear()


def _kernels_for(native_key, holder: bool):
    from confide.crypto.gpu.engine import PaillierKernels

    public = native_key.encryption_key if holder else native_key
    cache_key = f"{public.key_id}:{'holder' if holder else 'public'}"
    if cache_key not in _KERNELS:
        n, h_s, rand_bits = public_key_parts(public)
        p = q = None
        if holder:
            p, q = (int.from_bytes(x, "big") for x in native_key.primes_bytes())
        _KERNELS[cache_key] = PaillierKernels(current_engine().gpu, n, h_s, rand_bits, p, q)
    return _KERNELS[cache_key]


def encrypt_hook(native_key, holder: bool, plaintexts: int):
    """The GPU encryptor for ``native_key`` (a callable for ``encrypt_packed(engine=...)``), or None."""
    if plaintexts < GPU_MIN_PLAINTEXTS or current_engine().gpu is None:
        _STATE["cpu_batches"] += 1
        return None
    import numpy as np

    kern = _kernels_for(native_key, holder)
    half = kern.mod_n2.limbs // 2

    def encrypt(limbs, per: int, _holder: bool) -> bytes:
        count = limbs.size // per
        words = np.ascontiguousarray(limbs, dtype="<u8").reshape(count, per).view("<u4")
        if words.shape[1] > half:
            if np.any(words[:, half:]):
                raise GpuUnavailable("a packed plaintext is wider than the modulus")
            words = words[:, :half]
        plain = np.zeros((half, count), dtype=np.uint32)
        plain[: words.shape[1]] = words.T
        _STATE["gpu_batches"] += 1
        return kern.encrypt_limbs(plain, as_bytes=True)

    return encrypt


def decrypt_hook(native_key, ciphertexts: int):
    """The GPU decryptor for ``native_key`` (for ``decrypt_packed(engine=...)``), or None."""
    if ciphertexts < GPU_MIN_PLAINTEXTS or current_engine().gpu is None:
        _STATE["cpu_batches"] += 1
        return None
    kern = _kernels_for(native_key, True)
    width = 2 * kern.mod_n2.limbs  # plaintext bytes (n)

    def decrypt(data: bytes, count: int) -> bytes:
        values = _split_ints(data, count, 2 * width)
        _STATE["gpu_batches"] += 1
        return b"".join(m.to_bytes(width, "big") for m in kern.decrypt_raw(values))

    return decrypt


def note_fallback(reason: str) -> None:
    """A GPU batch failed (out of memory at the smallest chunk, a driver error): the CPU ran it."""
    _STATE["fallbacks"] += 1
    _STATE["last_fallback"] = reason


def engine_report() -> dict[str, Any]:
    """What ran Paillier in this process, for the job report (never silent about a fallback)."""
    choice = current_engine()
    name, reason = choice.name, choice.reason
    if choice.gpu is not None and not _STATE["gpu_batches"]:
        name = _cpu_name()
        reason = f"{choice.name} was available, but every batch was under {GPU_MIN_PLAINTEXTS} plaintexts"
    report: dict[str, Any] = {
        "crypto_engine": name,
        "crypto_engine_reason": reason,
        "gpu_batches": _STATE["gpu_batches"],
        "cpu_batches": _STATE["cpu_batches"],
    }
    if _STATE["fallbacks"]:
        report["gpu_fallbacks"] = _STATE["fallbacks"]
        report["gpu_last_fallback"] = _STATE["last_fallback"]
    return report


# ------------------------------------------------------------------------------------------------
# Raw encryption and decryption for the vertical algorithms and the compute workers: each call
# runs on the GPU when the engine has one and the batch is large enough, else on the native key.
# ``key`` is a native EncryptionKey or DecryptionKey (confide._native).
# ------------------------------------------------------------------------------------------------


def _is_holder(key) -> bool:
    return hasattr(key, "primes_bytes")


def _raw_block(public, ciphertexts: bytes, count: int) -> bytes:
    """A raw ciphertext block (wire.rs: "PCT1" ‖ key_id ‖ count ‖ elem_len ‖ encoding 0 ‖ no params ‖ flags 0)."""
    key_id = public.to_bytes()[-16:]
    header = b"PCT1" + key_id + count.to_bytes(4, "big") + public.ciphertext_bytes.to_bytes(2, "big")
    return header + b"\x00" + (0).to_bytes(2, "big") + b"\x00" + ciphertexts


def _vector_from_body(public, body: bytes, count: int):
    from confide import _native

    _STATE["gpu_batches"] += 1
    return _native.CiphertextVector.from_bytes(_raw_block(public, body, count), public)


def _split_ints(data: bytes, count: int, width: int) -> list[int]:
    """``count`` big-endian integers of ``width`` bytes each, from the end of ``data``."""
    body = data[len(data) - count * width :]
    return [int.from_bytes(body[i * width : (i + 1) * width], "big") for i in range(count)]


def _ciphertext_ints(public, vector) -> list[int]:
    """The ciphertexts of a native vector as integers (its block's body, after any header)."""
    return _split_ints(vector.to_bytes(), len(vector), public.ciphertext_bytes)


def _gpu_for(key, count: int, randomizer: str):
    if randomizer != "fixed_base" or count < GPU_MIN_PLAINTEXTS or current_engine().gpu is None:
        _STATE["cpu_batches"] += 1
        return None
    return _kernels_for(key, _is_holder(key))


def encrypt_raw(key, plaintexts: list[bytes], randomizer: str = "fixed_base", threads: int = 0):
    """``key.encrypt_raw(plaintexts, randomizer, threads)`` on the selected engine."""
    kern = _gpu_for(key, len(plaintexts), randomizer)
    if kern is not None:
        import numpy as np

        public = key.encryption_key if _is_holder(key) else key
        width = public.ciphertext_bytes // 2
        try:
            if any(len(p) > width for p in plaintexts):
                raise ValueError(f"plaintexts: each must be below n ({width} bytes)")
            rows = np.frombuffer(b"".join(p.rjust(width, b"\0") for p in plaintexts), dtype=np.uint8)
            body = kern.encrypt_be(rows.reshape(len(plaintexts), width))
            return _vector_from_body(public, body, len(plaintexts))
        except GpuUnavailable as exc:
            note_fallback(str(exc))
        except ValueError:
            pass  # out-of-range input: the native call names the field and the limit
    return key.encrypt_raw(plaintexts, randomizer, threads)


def encrypt_i64(key, values, randomizer: str = "fixed_base", threads: int = 0):
    """``key.encrypt_i64(values, randomizer, threads)`` (v < 0 encodes as n + v) on the selected engine."""
    import numpy as np

    values = np.ascontiguousarray(values, dtype=np.int64)
    kern = _gpu_for(key, values.size, randomizer)
    if kern is not None:
        public = key.encryption_key if _is_holder(key) else key
        half = kern.mod_n2.limbs // 2
        magnitude = np.abs(values).astype(np.uint64)  # |INT64_MIN| = 2^63 is exact in uint64
        low = (magnitude & np.uint64(0xFFFFFFFF)).astype(np.int64)
        high = (magnitude >> np.uint64(32)).astype(np.int64)
        negative = values < 0
        limbs = np.zeros((half, values.size), dtype=np.uint32)
        borrow = np.zeros(values.size, dtype=np.int64)
        for k in range(half):  # n - |v| for the negative values, limb by limb with borrow
            sub = (low if k == 0 else high if k == 1 else 0) + borrow
            d = np.int64(int(kern._n_limbs[k])) - sub
            borrow = (d < 0).astype(np.int64)
            limbs[k] = np.where(negative, d + (borrow << 32), low if k == 0 else high if k == 1 else 0)
        try:
            return _vector_from_body(public, kern.encrypt_limbs(limbs, as_bytes=True), values.size)
        except GpuUnavailable as exc:
            note_fallback(str(exc))
    return key.encrypt_i64(values, randomizer, threads)


def decrypt_raw(key, vector, threads: int = 0) -> list[bytes]:
    """``key.decrypt_raw(vector, threads)`` (big-endian, minimal length) on the selected engine."""
    kern = _gpu_for(key, len(vector), "fixed_base")
    if kern is not None:
        public = key.encryption_key
        if vector.key_id != public.key_id:
            return key.decrypt_raw(vector, threads)  # the native call names the mismatch
        values = _ciphertext_ints(public, vector)
        try:
            plain = kern.decrypt_raw(values)
            _STATE["gpu_batches"] += 1
            # not ints.int_to_bytes: the native call gives zero as b"" (rug's digits), and so must this
            return [m.to_bytes((m.bit_length() + 7) // 8, "big") for m in plain]
        except GpuUnavailable as exc:
            note_fallback(str(exc))
    return key.decrypt_raw(vector, threads)


def power(public, vector, exponent: int) -> list[int] | None:
    """c^exponent mod n² for every ciphertext of a native vector on the GPU, or None (run it natively).

    Threshold partial decryption's c^(2·Δ·d_j): one shared exponent, thousands of ciphertexts.
    A negative exponent raises the inverse: c^|e| on the GPU, then one inversion per value.
    """
    kern = _gpu_for(public, len(vector), "fixed_base")
    if kern is None:
        return None
    import gmpy2

    values = _ciphertext_ints(public, vector)
    try:
        out = kern.pow_many(values, abs(int(exponent)))
    except GpuUnavailable as exc:
        note_fallback(str(exc))
        return None
    _STATE["gpu_batches"] += 1
    if exponent < 0:
        out = [int(gmpy2.invert(v, kern.n2)) for v in out]
    return out


#: Device copies of the last few holders' gradients and bins: (gh, bins, kernels, gh on device,
#: bins on device), newest last. The objects are held so their ids stay theirs while cached.
_HISTOGRAM_INPUTS: list[tuple[Any, Any, Any, Any, Any]] = []
_HISTOGRAM_HOLDERS = 64


def _histogram_inputs(key, gh, bins, block: bytes | None):
    for entry in _HISTOGRAM_INPUTS:
        if entry[0] is gh and entry[1] is bins:
            return entry
    kern = _kernels_for(key, False)
    body_bytes = len(gh) * key.ciphertext_bytes
    body = (block if block is not None else gh.to_bytes())[-body_bytes:] if body_bytes else b""
    # a holder's next tree replaces its last one
    _HISTOGRAM_INPUTS[:] = [entry for entry in _HISTOGRAM_INPUTS if entry[1] is not bins]
    entry = (gh, bins, kern, kern.gradients_to_device(body, len(gh)), kern.bins_to_device(bins))
    _HISTOGRAM_INPUTS.append(entry)
    del _HISTOGRAM_INPUTS[:-_HISTOGRAM_HOLDERS]
    return entry


def histograms(
    key, gh, bins, node_of_row, nodes: list[int], n_bins: int, block: bytes | None = None
) -> list[bytes] | None:
    """Each node's encrypted histogram on the GPU, or None (run ``gh.histogram`` natively).

    The same bytes as ``gh.histogram(bins, rows_of_node, n_bins).to_bytes()`` for every node
    (a test checks it): per feature and bin, the product mod n² of the ciphertexts of the node's
    rows in that bin, the ciphertext 1 where none falls. ``key`` is the guest's native
    EncryptionKey; ``gh`` a raw native vector of one ciphertext per row of ``bins`` (features x rows,
    uint8); ``node_of_row`` each row's node; ``block`` the bytes ``gh`` was parsed from, if at hand
    (it saves serializing the vector again for the upload).
    """
    import numpy as np

    bins = np.asarray(bins)
    rows = len(gh)
    if (
        rows < GPU_MIN_PLAINTEXTS
        or current_engine().gpu is None
        or bins.ndim != 2
        or bins.shape[1] != rows
        or bins.dtype != np.uint8
        or gh.key_id != key.key_id
        or not 0 < n_bins <= 256
        or (bins.size and int(bins.max()) >= n_bins)
    ):
        _STATE["cpu_batches"] += 1
        return None  # the native call runs it, or names the field that is wrong
    node_of_row = np.asarray(node_of_row)
    slot = np.full(rows, 0xFFFFFFFF, dtype=np.uint32)
    for index, node in enumerate(nodes):
        slot[node_of_row == node] = index
    features = bins.shape[0]
    try:
        _gh, _bins, kern, gh_device, bins_device = _histogram_inputs(key, gh, bins, block)
        sums = kern.histograms(gh_device, rows, bins_device, features, slot, len(nodes), n_bins)
    except GpuUnavailable as exc:
        note_fallback(str(exc))
        return None
    from confide.crypto.gpu.engine import limbs_to_be_rows

    width = key.ciphertext_bytes
    table = limbs_to_be_rows(sums, width).reshape(len(nodes), n_bins, features, width).transpose(0, 2, 1, 3)
    _STATE["gpu_batches"] += 1
    return [_raw_block(key, np.ascontiguousarray(table[i]).tobytes(), features * n_bins) for i in range(len(nodes))]
