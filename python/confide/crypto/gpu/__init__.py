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

    from confide.crypto.gpu.engine import limbs_to_be_rows

    kern = _kernels_for(native_key, holder)
    half = kern.mod_n2.limbs // 2
    width = 4 * kern.mod_n2.limbs  # ciphertext bytes (n^2)

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
        return limbs_to_be_rows(kern.encrypt_limbs(plain), width).tobytes()

    return encrypt


def decrypt_hook(native_key, ciphertexts: int):
    """The GPU decryptor for ``native_key`` (for ``decrypt_packed(engine=...)``), or None."""
    if ciphertexts < GPU_MIN_PLAINTEXTS or current_engine().gpu is None:
        _STATE["cpu_batches"] += 1
        return None
    kern = _kernels_for(native_key, True)
    width = 2 * kern.mod_n2.limbs  # plaintext bytes (n)

    def decrypt(data: bytes, count: int) -> bytes:
        step = 2 * width
        values = [int.from_bytes(data[i * step : (i + 1) * step], "big") for i in range(count)]
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
