"""Where the kernels of ``paillier.cu`` run: the GPU (NVRTC + the CUDA driver) or the CPU (same source, C).

Both backends take the same calls (``upload``, ``empty``, ``download``, ``launch``) so the engine in
:mod:`confide.crypto.gpu.engine` is one piece of code whichever runs it, and the test suite checks
that code and the kernels' arithmetic against GMP on machines with no GPU (:class:`CpuBackend`).

Nothing here imports a CUDA package at module import time: ``cuda.bindings`` (the ``confide[gpu]``
extra) is imported only when a :class:`GpuBackend` is made or PTX is compiled.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SOURCE = Path(__file__).with_name("paillier.cu")
KERNELS = (
    "cf_mul_shared",
    "cf_mulmod",
    "cf_fixed_base",
    "cf_factor",
    "cf_pow",
    "cf_garner",
    "cf_hist_partial",
    "cf_hist_reduce",
    "cf_hist_finish",
    "cf_from_be",
    "cf_to_be",
    "cf_fixed_base_part",
    "cf_times_factor",
)
# Threads per block: the CIOS accumulator holds CF_LIMBS + 2 registers per thread.
BLOCK = 128


class GpuUnavailable(RuntimeError):
    """No usable GPU: the reason says which step failed (package, driver, device, PTX)."""


def source_text() -> str:
    """The kernels' CUDA C source."""
    return SOURCE.read_text()


# --------------------------------------------------------------------------------------------
# NVRTC: source -> PTX (works on a machine with no GPU, given the NVRTC library)
# --------------------------------------------------------------------------------------------


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:  # the confide[gpu] extra is not installed
        raise GpuUnavailable(f"cuda-bindings is not installed (pip install 'confide[gpu]'): {exc}") from exc
    return nvrtc


def _check_nvrtc(nvrtc, result, what: str, program=None) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        log = ""
        if program is not None:
            _, size = nvrtc.nvrtcGetProgramLogSize(program)
            buf = b" " * size
            nvrtc.nvrtcGetProgramLog(program, buf)
            log = buf.decode(errors="replace").strip()
        raise GpuUnavailable(f"NVRTC {what} failed: {err}{': ' + log if log else ''}")
    return rest[0] if len(rest) == 1 else rest


def compile_ptx(limbs: int, arch: str = "compute_90") -> bytes:
    """PTX of ``paillier.cu`` for a modulus of ``limbs`` 32-bit limbs (NVRTC, no GPU needed)."""
    nvrtc = _nvrtc()
    program = _check_nvrtc(nvrtc, nvrtc.nvrtcCreateProgram(source_text().encode(), b"paillier.cu", 0, [], []), "create")
    try:
        options = [f"--gpu-architecture={arch}".encode(), f"-DCF_LIMBS={limbs}".encode(), b"-default-device"]
        _check_nvrtc(nvrtc, nvrtc.nvrtcCompileProgram(program, len(options), options), "compile", program)
        size = _check_nvrtc(nvrtc, nvrtc.nvrtcGetPTXSize(program), "PTX size")
        ptx = b" " * size
        _check_nvrtc(nvrtc, nvrtc.nvrtcGetPTX(program, ptx), "PTX")
        return ptx
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library that compiles the kernels."""
    nvrtc = _nvrtc()
    major, minor = _check_nvrtc(nvrtc, nvrtc.nvrtcVersion(), "version")
    return int(major), int(minor)


# --------------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------------


@dataclass
class CpuArray:
    """A backend array on the CPU: a numpy uint32 array (limb-major where it holds a batch)."""

    host: np.ndarray

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return self.host.nbytes


class CpuBackend:
    """Runs the kernels' C build on one core: the arithmetic's reference, checked against GMP."""

    name = "cpu-reference"

    def __init__(self, limbs: int) -> None:
        self.limbs = limbs
        self.lib = _load_cpu_library(limbs)
        self.kernel_seconds = 0.0

    def upload(self, array: np.ndarray) -> CpuArray:
        """A backend copy of a uint32 array."""
        return CpuArray(np.ascontiguousarray(array, dtype=np.uint32).copy())

    def empty(self, count: int) -> CpuArray:
        """A zeroed (CPU) or uninitialised (GPU) array of ``count`` uint32."""
        return CpuArray(np.zeros(count, dtype=np.uint32))

    def zeros(self, count: int) -> CpuArray:
        """A zeroed array of ``count`` uint32."""
        return CpuArray(np.zeros(count, dtype=np.uint32))

    #: Threads one launch should keep busy: small here, so the tests cross several chunks.
    parallel_items = 64

    def download(self, array: CpuArray) -> np.ndarray:
        """The array's contents as numpy uint32."""
        return array.host.copy()

    def launch(self, kernel: str, count: int, *args: Any) -> None:
        """Runs ``kernel`` over ``count`` items with ``args`` (arrays or uint32 scalars); returns when done."""
        converted = []
        for arg in args:
            if isinstance(arg, CpuArray):
                converted.append(ctypes.c_void_p(arg.host.ctypes.data))
            else:
                converted.append(ctypes.c_uint32(int(arg)))
        start = time.perf_counter()
        getattr(self.lib, kernel)(*converted)
        self.kernel_seconds += time.perf_counter() - start

    def synchronize(self) -> None:
        """Waits for the work queued so far."""
        pass

    def free_bytes(self) -> int:
        """Free memory of the device, in bytes."""
        return 1 << 62


def _cpu_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "confide" / "gpu-cpu-build"


_CPU_LIBS: dict[int, ctypes.CDLL] = {}


def _load_cpu_library(limbs: int) -> ctypes.CDLL:
    if limbs in _CPU_LIBS:
        return _CPU_LIBS[limbs]
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc) to build the GPU kernels' CPU reference")
    digest = hashlib.sha256(source_text().encode() + str(limbs).encode()).hexdigest()[:16]
    target = _cpu_cache_dir() / f"paillier-{limbs}-{digest}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / target.name
            command = [
                compiler,
                "-O2",
                "-shared",
                "-fPIC",
                "-x",
                "c",
                f"-DCF_LIMBS={limbs}",
                str(SOURCE),
                "-o",
                str(out),
            ]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"building the CPU reference failed: {' '.join(command)}\n{done.stderr}")
            os.replace(out, target)
    lib = ctypes.CDLL(str(target))
    _CPU_LIBS[limbs] = lib
    return lib


@dataclass
class GpuArray:
    """Device memory of ``nbytes`` bytes (a CUdeviceptr), freed when dropped."""

    ptr: Any
    nbytes: int
    backend: GpuBackend

    def __del__(self) -> None:  # pragma: no cover - needs a GPU
        try:
            self.backend._bind()
            self.backend.cu.cuMemFree(self.ptr)
        except Exception:
            pass


class GpuBackend:  # pragma: no cover - exercised on the GPU machine (scripts/gpu-check.sh)
    """One CUDA device: the module for ``limbs`` compiled by NVRTC, loaded through the driver API."""

    def __init__(self, limbs: int, device: int = 0) -> None:
        try:
            from cuda.bindings import driver as cu
        except ImportError as exc:
            raise GpuUnavailable(f"cuda-bindings is not installed (pip install 'confide[gpu]'): {exc}") from exc
        self.cu = cu
        self.limbs = limbs
        try:
            initialized = cu.cuInit(0)
        except Exception as exc:  # cuda-pathfinder: no driver library on this machine
            raise GpuUnavailable("no NVIDIA driver on this machine") from exc
        self._check(initialized, "cuInit (no driver or no device)")
        self.device = self._check(cu.cuDeviceGet(device), f"cuDeviceGet({device})")
        self.context = self._check(cu.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        self._check(cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        attr = cu.CUdevice_attribute
        major = self._check(
            cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device), "capability"
        )
        minor = self._check(
            cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device), "capability"
        )
        self.capability = (int(major), int(minor))
        name = self._check(cu.cuDeviceGetName(100, self.device), "name")
        self.device_name = bytes(name).split(b"\0", 1)[0].decode()
        self.name = f"gpu:{self.device_name}"
        ptx = compile_ptx(limbs, f"compute_{major}{minor}")
        err, module = cu.cuModuleLoadData(ptx)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise GpuUnavailable(
                f"the driver cannot load the PTX from NVRTC {'.'.join(map(str, nvrtc_version()))} ({err}): "
                "the driver is older than the NVRTC library; update the driver or install a matching "
                "nvidia-cuda-nvrtc"
            )
        self.module = module
        self.functions = {k: self._check(cu.cuModuleGetFunction(module, k.encode()), k) for k in KERNELS}
        self.stream = self._check(cu.cuStreamCreate(0), "stream")
        self.kernel_seconds = 0.0

    def _bind(self) -> None:
        # The context is current per thread: a party's guest and host threads share the device.
        self.cu.cuCtxSetCurrent(self.context)

    def _check(self, result, what: str):
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            if err == self.cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
                raise MemoryError(f"GPU out of memory in {what}")
            raise GpuUnavailable(f"CUDA {what} failed: {err}")
        return rest[0] if len(rest) == 1 else (rest or None)

    def empty(self, count: int) -> GpuArray:
        """A zeroed (CPU) or uninitialised (GPU) array of ``count`` uint32."""
        self._bind()
        nbytes = max(4, 4 * int(count))
        return GpuArray(self._check(self.cu.cuMemAlloc(nbytes), f"cuMemAlloc({nbytes})"), nbytes, self)

    def zeros(self, count: int) -> GpuArray:
        """A zeroed array of ``count`` uint32."""
        out = self.empty(count)
        self._check(self.cu.cuMemsetD32Async(out.ptr, 0, max(1, int(count)), self.stream), "memset")
        return out

    #: Threads one launch should keep busy (132 SMs of an H100 at a few hundred threads each).
    parallel_items = 1 << 16

    def upload(self, array: np.ndarray) -> GpuArray:
        """A backend copy of a uint32 array."""
        self._bind()
        host = np.ascontiguousarray(array, dtype=np.uint32)
        out = self.empty(host.size)
        self._check(self.cu.cuMemcpyHtoDAsync(out.ptr, host.ctypes.data, host.nbytes, self.stream), "copy in")
        self.synchronize()
        return out

    def download(self, array: GpuArray) -> np.ndarray:
        """The array's contents as numpy uint32."""
        self._bind()
        host = np.empty(array.nbytes // 4, dtype=np.uint32)
        self._check(self.cu.cuMemcpyDtoHAsync(host.ctypes.data, array.ptr, array.nbytes, self.stream), "copy out")
        self.synchronize()
        return host

    def launch(self, kernel: str, count: int, *args: Any) -> None:
        """Runs ``kernel`` over ``count`` items with ``args`` (arrays or uint32 scalars); returns when done."""
        self._bind()
        holders = []
        for arg in args:
            if isinstance(arg, GpuArray):
                holders.append(np.array([int(arg.ptr)], dtype=np.uint64))
            else:
                holders.append(np.array([int(arg)], dtype=np.uint32))
        params = np.array([h.ctypes.data for h in holders], dtype=np.uint64)
        grid = max(1, (int(count) + BLOCK - 1) // BLOCK)
        start = time.perf_counter()
        self._check(
            self.cu.cuLaunchKernel(
                self.functions[kernel], grid, 1, 1, BLOCK, 1, 1, 0, self.stream, params.ctypes.data, 0
            ),
            f"launch {kernel}",
        )
        self.synchronize()
        self.kernel_seconds += time.perf_counter() - start
        del holders

    def synchronize(self) -> None:
        """Waits for the work queued so far."""
        self._bind()
        self._check(self.cu.cuStreamSynchronize(self.stream), "synchronize")

    def free_bytes(self) -> int:
        """Free memory of the device, in bytes."""
        self._bind()
        free, _total = self._check(self.cu.cuMemGetInfo(), "cuMemGetInfo")
        return int(free)
