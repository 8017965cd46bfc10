"""The GPU Paillier engine's arithmetic, checked on machines with no GPU.

``paillier.cu`` builds twice: for the GPU by NVRTC (the PTX test below), and for the CPU with the
system C compiler. The CPU build runs the same kernels through the same engine code as the GPU
(``CpuBackend`` against ``GpuBackend``), and every result is compared with GMP (gmpy2) bit for bit,
at both key sizes, packed and per value, with edge values. On a machine with a GPU and
``confide[gpu]`` installed, the last tests run the GPU backend against the same references.
"""

from __future__ import annotations

import random

import gmpy2
import numpy as np
import pytest

from confide import crypto
from confide.crypto.gpu import backend as gpu_backend
from confide.crypto.gpu import engine as gpu_engine
from confide.crypto.gpu import select_engine
from tests.fixtures.keys import fixed_key, fixed_native_key

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _primes(bits: int, seed: int) -> tuple[int, int]:
    rng = random.Random(seed)
    out = []
    while len(out) < 2:
        x = gmpy2.next_prime(rng.getrandbits(bits // 2) | (3 << (bits // 2 - 2)))
        if x.bit_length() == bits // 2 and x not in out:
            out.append(int(x))
    return out[0], out[1]


def _kernels(bits: int, seed: int, backend_for=None, window: int = 8):
    p, q = _primes(bits, seed)
    n = p * q
    rng = random.Random(seed + 1)
    h_s = gmpy2.powmod(rng.getrandbits(2 * bits) % (n * n), n, n * n)
    backend_for = backend_for or gpu_backend.CpuBackend
    return PaillierRef(n, int(h_s), bits // 2, p, q), gpu_engine.PaillierKernels(
        backend_for, n, int(h_s), bits // 2, p, q, window=window, chunk=48
    )


class PaillierRef:
    """The definitions, evaluated by GMP."""

    def __init__(self, n, h_s, rand_bits, p, q):
        self.n, self.h_s, self.rand_bits, self.p, self.q = n, h_s, rand_bits, p, q
        self.n2 = n * n
        self.lam = (p - 1) * (q - 1) // int(gmpy2.gcd(p - 1, q - 1))
        self.mu = int(gmpy2.invert((gmpy2.powmod(n + 1, self.lam, self.n2) - 1) // n, n))

    def encrypt(self, m, a):
        return int((1 + m * self.n) * gmpy2.powmod(self.h_s, a, self.n2) % self.n2)

    def decrypt(self, c):
        return int((gmpy2.powmod(c, self.lam, self.n2) - 1) // self.n * self.mu % self.n)


# The small size keeps the CPU reference quick; 2048 and 3072 are the product's key sizes.
SIZES = [(512, 3), (2048, 5), (3072, 7)]


@pytest.fixture(scope="module", params=SIZES, ids=[f"{b}-bit" for b, _ in SIZES])
def pair(request):
    bits, seed = request.param
    return _kernels(bits, seed)


def _edge_plaintexts(n: int, rng: random.Random, count: int) -> list[int]:
    edges = [0, 1, 2, n - 1, n - 2, n // 2, (1 << 32) - 1, 1 << 32, (1 << 64) + 1, n // 3 - 1]
    return edges + [rng.randrange(n) for _ in range(count - len(edges))]


def _edge_exponents(bits: int, rng: random.Random, count: int) -> list[int]:
    top = (1 << bits) - 1
    edges = [0, 1, top, 1 << (bits - 1), 0xFF, 0xFF00, top ^ 0xFF]
    return edges + [rng.getrandbits(bits) for _ in range(count - len(edges))]


def test_encrypt_equals_gmp_for_the_same_randomness(pair):
    ref, kern = pair
    rng = random.Random(11)
    count = 60  # more than one chunk of 48
    plaintexts = _edge_plaintexts(ref.n, rng, count)
    exponents = _edge_exponents(ref.rand_bits, rng, count)
    got = kern.encrypt_raw(plaintexts, exponents)
    assert got == [ref.encrypt(m, a) for m, a in zip(plaintexts, exponents, strict=False)]


def test_decrypt_is_exact_and_inverts_encrypt(pair):
    ref, kern = pair
    rng = random.Random(12)
    plaintexts = _edge_plaintexts(ref.n, rng, 30)
    ciphertexts = [ref.encrypt(m, rng.getrandbits(ref.rand_bits)) for m in plaintexts]
    assert kern.decrypt_raw(ciphertexts) == plaintexts
    assert [ref.decrypt(c) for c in kern.encrypt_raw(plaintexts)] == plaintexts


@pytest.mark.slow
def test_products_and_powers_equal_gmp(pair):
    ref, kern = pair
    rng = random.Random(13)
    a = [rng.randrange(1, ref.n2) for _ in range(20)] + [1, ref.n2 - 1]
    b = [rng.randrange(1, ref.n2) for _ in range(20)] + [ref.n2 - 1, ref.n2 - 1]
    assert kern.mul_many(a, b) == [x * y % ref.n2 for x, y in zip(a, b, strict=False)]
    shared = rng.getrandbits(ref.n.bit_length())
    assert kern.pow_many(a, shared) == [int(gmpy2.powmod(x, shared, ref.n2)) for x in a]
    each = [0, 1, 2, 3, (1 << 64) - 1] + [rng.getrandbits(70) for _ in range(len(a) - 5)]
    assert kern.pow_many(a, each) == [int(gmpy2.powmod(x, e, ref.n2)) for x, e in zip(a, each, strict=False)]


def test_crt_recombination_equals_gmp(pair):
    ref, kern = pair
    rng = random.Random(14)
    values = [0, 1, ref.n2 - 1] + [rng.randrange(ref.n2) for _ in range(20)]
    p2, q2 = ref.p**2, ref.q**2
    assert kern.crt_combine([v % p2 for v in values], [v % q2 for v in values]) == values


def test_homomorphic_sum_of_packed_blocks_round_trips():
    """Packed slots survive GPU encryption, the aggregator's product and GPU decryption."""
    ref, kern = _kernels(2048, 5)
    slot, slots = 64, 30  # 30 slots of 64 bits in one 2048-bit plaintext, 3 parties
    rng = random.Random(15)
    parties = [[rng.getrandbits(60) for _ in range(slots)] for _ in range(3)]
    packed = [sum(v << (slot * k) for k, v in enumerate(vals)) for vals in parties]
    ciphertexts = [kern.encrypt_raw([m])[0] for m in packed]
    total = kern.mul_many(kern.mul_many(ciphertexts[:1], ciphertexts[1:2]), ciphertexts[2:3])[0]
    plain = kern.decrypt_raw([total])[0]
    assert [(plain >> (slot * k)) & ((1 << slot) - 1) for k in range(slots)] == [
        sum(c) for c in zip(*parties, strict=False)
    ]


def test_interoperates_with_the_cpu_engine():
    """Ciphertexts of the Rust engine decrypt on the kernels, and the kernels' on the Rust engine."""
    native = fixed_native_key()
    n_bytes = native.encryption_key.n_bytes()
    n = int.from_bytes(n_bytes, "big")
    p, q = (int.from_bytes(x, "big") for x in native.primes_bytes())
    h_s, rand_bits = gpu_engine_key_parts(native.encryption_key)
    kern = gpu_engine.PaillierKernels(gpu_backend.CpuBackend, n, h_s, rand_bits, p, q, chunk=64)
    values = np.array([0, 1, -1, 123456789, -(2**40)], dtype=np.int64)
    vector = native.encryption_key.encrypt_i64(values)
    ciphertexts = [int.from_bytes(vector.element_bytes(i), "big") for i in range(len(vector))]
    decoded = [m - n if m > n // 3 else m for m in kern.decrypt_raw(ciphertexts)]
    assert decoded == values.tolist()
    mine = kern.encrypt_raw([v % n for v in values.tolist()])
    back = crypto._native.CiphertextVector.from_elements(
        [c.to_bytes(native.encryption_key.ciphertext_bytes, "big") for c in mine], native.encryption_key
    )
    assert native.decrypt_i64(back, 1).tolist() == values.tolist()


def gpu_engine_key_parts(public) -> tuple[int, int]:
    from confide.crypto.gpu import public_key_parts

    n, h_s, rand_bits = public_key_parts(public)
    assert n == int.from_bytes(public.n_bytes(), "big")
    return h_s, rand_bits


def test_bad_input_is_refused_with_the_field_named():
    ref, kern = _kernels(512, 3)
    with pytest.raises(ValueError, match=r"plaintexts\[1\]"):
        kern.encrypt_raw([1, ref.n])
    with pytest.raises(ValueError, match=r"ciphertexts\[0\]"):
        kern.decrypt_raw([0])
    with pytest.raises(ValueError, match="exponents"):
        kern.encrypt_raw([1, 2], [3])


def test_out_of_memory_halves_the_chunk_then_gives_up(monkeypatch):
    ref, kern = _kernels(512, 3)
    calls = []
    real = gpu_backend.CpuBackend.launch

    def tight(self, kernel, count, *args):
        calls.append(count)
        if count > 20:
            raise MemoryError("simulated: GPU out of memory")
        return real(self, kernel, count, *args)

    monkeypatch.setattr(gpu_backend.CpuBackend, "launch", tight)
    monkeypatch.setattr(gpu_backend.CpuBackend, "parallel_items", 1)  # one thread an item: launches count items
    monkeypatch.setattr(gpu_engine, "MIN_CHUNK", 8)
    kern.chunk = 64
    plaintexts = list(range(50))
    exps = [7] * 50
    assert kern.encrypt_raw(plaintexts, exps) == [ref.encrypt(m, 7) for m in plaintexts]
    assert calls[:2] == [50, 32] and all(c <= 20 for c in calls[2:])  # 64 -> 32 -> 16 items a launch

    def never(self, kernel, count, *args):
        raise MemoryError("simulated")

    monkeypatch.setattr(gpu_backend.CpuBackend, "launch", never)
    with pytest.raises(gpu_backend.GpuUnavailable, match="out of memory"):
        kern.encrypt_raw(plaintexts, exps)


@pytest.mark.slow
def test_ptx_compiles_without_a_gpu():
    """NVRTC turns the kernel source into PTX for Hopper at both key sizes' limb counts."""
    try:
        gpu_backend.nvrtc_version()
    except gpu_backend.GpuUnavailable as exc:
        pytest.skip(str(exc))
    for limbs in (64, 128, 192):
        ptx = gpu_backend.compile_ptx(limbs, "compute_90")
        text = ptx.decode(errors="replace")
        assert ".target sm_90" in text
        for kernel in gpu_backend.KERNELS:
            assert f".entry {kernel}(" in text


def test_engine_selection_without_a_gpu(monkeypatch):
    monkeypatch.setenv("CONFIDE_ENGINE", "cpu")
    choice = select_engine()
    assert choice.gpu is None and choice.name == f"cpu:{crypto._native.engine()}"
    monkeypatch.setenv("CONFIDE_ENGINE", "auto")
    choice = select_engine(probe=lambda: (_ for _ in ()).throw(gpu_backend.GpuUnavailable("no device")))
    assert choice.gpu is None and "no device" in choice.reason and choice.name.startswith("cpu:")
    monkeypatch.setenv("CONFIDE_ENGINE", "gpu")
    with pytest.raises(gpu_backend.GpuUnavailable, match="CONFIDE_ENGINE=gpu.*no device"):
        select_engine(probe=lambda: (_ for _ in ()).throw(gpu_backend.GpuUnavailable("no device")))
    monkeypatch.setenv("CONFIDE_ENGINE", "tpu")
    with pytest.raises(ValueError, match="CONFIDE_ENGINE must be one of auto, cpu, gpu"):
        select_engine()


def _gpu_or_skip():
    try:
        return gpu_backend.GpuBackend(128)
    except gpu_backend.GpuUnavailable as exc:
        pytest.skip(f"no GPU here: {exc}")


@pytest.mark.parametrize("bits,seed", [(2048, 5), (3072, 7)])
def test_gpu_equals_gmp(bits, seed):
    _gpu_or_skip()
    ref, kern = _kernels(bits, seed, backend_for=gpu_backend.GpuBackend)
    rng = random.Random(21)
    plaintexts = _edge_plaintexts(ref.n, rng, 300)
    exponents = _edge_exponents(ref.rand_bits, rng, 300)
    ciphertexts = kern.encrypt_raw(plaintexts, exponents)
    assert ciphertexts == [ref.encrypt(m, a) for m, a in zip(plaintexts, exponents, strict=False)]
    assert kern.decrypt_raw(ciphertexts) == plaintexts
    assert kern.mul_many(ciphertexts, ciphertexts[::-1]) == [
        x * y % ref.n2 for x, y in zip(ciphertexts, ciphertexts[::-1], strict=False)
    ]


@pytest.fixture
def reference_engine(monkeypatch):
    """The product's GPU hooks with the kernels' CPU build standing in for the device."""
    from confide.crypto import gpu

    gpu.reset_engine()
    monkeypatch.setitem(gpu._STATE, "choice", gpu.EngineChoice("gpu:cpu-reference", gpu_backend.CpuBackend, "test"))
    monkeypatch.setattr(gpu, "GPU_MIN_PLAINTEXTS", 4)
    yield gpu
    gpu.reset_engine()


def test_packed_encryption_and_decryption_run_on_the_selected_engine(reference_engine):
    """encrypt_packed / decrypt_packed hand the codec's plaintexts to the engine and back."""
    gpu = reference_engine
    key = fixed_key()
    codec = crypto.BatchCryptCodec(bits=16, max_parties=3, alpha=1.0)
    rng = np.random.default_rng(3)
    parts = [rng.uniform(-0.5, 0.5, 700).astype(np.float32) for _ in range(3)]
    on_gpu = [crypto.encrypt_packed(v, codec, key) for v in parts]
    assert gpu.engine_report()["gpu_batches"] == 3
    gpu.reset_engine()
    gpu._STATE["choice"] = gpu.EngineChoice("cpu:test", None, "test")
    on_cpu = crypto.encrypt_packed(parts[0], codec, key)
    expected = crypto.decrypt_packed(crypto.sum_encrypted([on_cpu, *on_gpu[1:]]), key)
    total = crypto.sum_encrypted(on_gpu)
    cpu_sum = crypto.decrypt_packed(total, key)  # the CPU engine decrypts the GPU's ciphertexts
    np.testing.assert_allclose(cpu_sum, np.sum(parts, axis=0), atol=2e-3)
    np.testing.assert_allclose(expected, cpu_sum, atol=2e-3)
    gpu._STATE["choice"] = gpu.EngineChoice("gpu:cpu-reference", gpu_backend.CpuBackend, "test")
    np.testing.assert_array_equal(crypto.decrypt_packed(total, key), cpu_sum)
    report = gpu.engine_report()
    assert report["crypto_engine"] == "gpu:cpu-reference" and report["gpu_batches"] == 1


def test_a_failed_gpu_batch_runs_on_the_cpu_and_is_reported(reference_engine, monkeypatch):
    gpu = reference_engine
    from confide.crypto.gpu import engine as kernels

    def out_of_memory(self, *args, **kwargs):
        raise gpu_backend.GpuUnavailable("GPU out of memory even for 256 items")

    monkeypatch.setattr(kernels.PaillierKernels, "encrypt_limbs", out_of_memory)
    key = fixed_key()
    codec = crypto.BatchCryptCodec(bits=16, max_parties=2, alpha=1.0)
    values = np.linspace(-0.4, 0.4, 900).astype(np.float32)
    vector = crypto.encrypt_packed(values, codec, key)
    np.testing.assert_allclose(crypto.decrypt_packed(vector, key), values, atol=2e-3)
    report = gpu.engine_report()
    assert report["gpu_fallbacks"] == 1 and "out of memory" in report["gpu_last_fallback"]


def test_an_engine_returning_bad_ciphertexts_is_refused():
    key = fixed_key()
    native = key._native
    values = np.zeros(300, dtype=np.float32)
    with pytest.raises(
        crypto.InvalidParameterError if hasattr(crypto, "InvalidParameterError") else Exception, match="engine"
    ):
        native.encrypt_packed(values, "batchcrypt", 16, 2, 1.0, "exact_bound", None, 1, lambda limbs, per, h: b"\0" * 7)
    zero = lambda limbs, per, h: b"\0" * (len(limbs) // per * native.encryption_key.ciphertext_bytes)  # noqa: E731
    with pytest.raises(Exception, match="(?i)ciphertext"):
        native.encrypt_packed(values, "batchcrypt", 16, 2, 1.0, "exact_bound", None, 1, zero)


def test_report_names_the_cpu_when_every_batch_was_small(reference_engine):
    gpu = reference_engine
    gpu.GPU_MIN_PLAINTEXTS = 10_000
    key = fixed_key()
    crypto.encrypt_packed(np.zeros(50, np.float32), crypto.BatchCryptCodec(bits=16, max_parties=2, alpha=1.0), key)
    report = gpu.engine_report()
    assert report["crypto_engine"].startswith("cpu:") and "under 10000 plaintexts" in report["crypto_engine_reason"]
    assert report["cpu_batches"] == 1 and report["gpu_batches"] == 0


def test_raw_and_i64_paths_match_the_native_engine(reference_engine):
    """The vertical algorithms' calls (encrypt_raw, encrypt_i64, decrypt_raw) on the engine."""
    gpu = reference_engine
    native = fixed_native_key()
    public = native.encryption_key
    n = int.from_bytes(public.n_bytes(), "big")
    rng = random.Random(31)
    ints = [0, 1, n - 1, 2**64, 2**32 - 1] + [rng.randrange(n) for _ in range(7)]
    plaintexts = [v.to_bytes((v.bit_length() + 7) // 8, "big") for v in ints]
    for key in (public, native):  # the public-key and the key-holder entry points
        vector = gpu.encrypt_raw(key, plaintexts, "fixed_base", 1)
        assert native.decrypt_raw(vector, 1) == plaintexts
        assert gpu.decrypt_raw(native, vector, 1) == plaintexts
    values = np.array([0, 1, -1, 2**63 - 1, -(2**63), -(2**32), 2**32, -123456789], dtype=np.int64)
    vector = gpu.encrypt_i64(native, values, "fixed_base", 1)
    assert native.decrypt_i64(vector, 1).tolist() == values.tolist()
    cpu_vector = public.encrypt_i64(values, "fixed_base", 1)
    assert gpu.decrypt_raw(native, cpu_vector, 1) == native.decrypt_raw(cpu_vector, 1)
    assert gpu.engine_report()["gpu_batches"] == 6
    # Small batches and the classical randomizer stay on the native engine.
    gpu.GPU_MIN_PLAINTEXTS = 100
    assert native.decrypt_raw(gpu.encrypt_raw(public, plaintexts[:3]), 1) == plaintexts[:3]
    assert gpu.engine_report()["gpu_batches"] == 6
    with pytest.raises(Exception, match="(?i)plaintext"):
        gpu.encrypt_raw(public, [(n + 5).to_bytes(256, "big")] * 4)


def test_raw_and_packed_paths_on_the_gpu(monkeypatch):
    """The vertical and packed entry points on a real GPU, against the native engine."""
    _gpu_or_skip()
    from confide.crypto import gpu

    gpu.reset_engine()
    monkeypatch.setenv("CONFIDE_ENGINE", "gpu")
    try:
        native = fixed_native_key()
        public = native.encryption_key
        n = int.from_bytes(public.n_bytes(), "big")
        rng = random.Random(41)
        ints = [0, 1, n - 1] + [rng.randrange(n) for _ in range(997)]
        plaintexts = [v.to_bytes((v.bit_length() + 7) // 8, "big") for v in ints]
        vector = gpu.encrypt_raw(public, plaintexts, "fixed_base", 0)
        assert native.decrypt_raw(vector, 0) == plaintexts
        assert gpu.decrypt_raw(native, vector, 0) == plaintexts
        values = np.random.default_rng(5).integers(-(2**62), 2**62, 1000, dtype=np.int64)
        assert native.decrypt_i64(gpu.encrypt_i64(native, values, "fixed_base", 0), 0).tolist() == values.tolist()
        key = crypto.DecryptionKey(native)
        codec = crypto.BatchCryptCodec(bits=16, max_parties=3, alpha=1.0)
        floats = np.random.default_rng(6).uniform(-1, 1, 100_000).astype(np.float32)
        packed = crypto.encrypt_packed(floats, codec, key)
        on_gpu = crypto.decrypt_packed(packed, key)
        report = gpu.engine_report()
        assert report["crypto_engine"].startswith("gpu:") and report["gpu_batches"] == 5
        monkeypatch.setenv("CONFIDE_ENGINE", "cpu")
        gpu.reset_engine()
        np.testing.assert_array_equal(crypto.decrypt_packed(packed, key), on_gpu)
    finally:
        gpu.reset_engine()


def test_a_driver_too_old_for_the_ptx_is_a_clear_error_and_auto_runs_the_cpu(monkeypatch):
    """A driver that refuses NVRTC's PTX: ``gpu`` fails with what to do, ``auto`` names the CPU and why."""
    import enum
    import types

    cuda_bindings = pytest.importorskip("cuda.bindings")
    from confide.crypto import gpu

    class Result(enum.Enum):
        CUDA_SUCCESS = 0
        CUDA_ERROR_OUT_OF_MEMORY = 2
        CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222

    ok = Result.CUDA_SUCCESS
    fake = types.SimpleNamespace(
        CUresult=Result,
        CUdevice_attribute=types.SimpleNamespace(
            CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=75, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=76
        ),
        cuInit=lambda flags: (ok,),
        cuDeviceGet=lambda index: (ok, 0),
        cuDevicePrimaryCtxRetain=lambda device: (ok, "context"),
        cuCtxSetCurrent=lambda context: (ok,),
        cuDeviceGetAttribute=lambda attribute, device: (ok, 9 if attribute == 75 else 0),
        cuDeviceGetName=lambda size, device: (ok, b"Old Driver GPU\0"),
        cuModuleLoadData=lambda ptx: (Result.CUDA_ERROR_UNSUPPORTED_PTX_VERSION, None),
    )
    monkeypatch.setattr(cuda_bindings, "driver", fake, raising=False)
    monkeypatch.setattr(gpu_backend, "compile_ptx", lambda limbs, arch: b"// PTX")
    monkeypatch.setattr(gpu_backend, "nvrtc_version", lambda: (13, 2))
    monkeypatch.setattr(gpu, "_BACKENDS", {})
    with pytest.raises(gpu_backend.GpuUnavailable, match="driver is older than the NVRTC library.*update the driver"):
        gpu_backend.GpuBackend(128)
    monkeypatch.setenv("CONFIDE_ENGINE", "gpu")
    with pytest.raises(gpu_backend.GpuUnavailable, match="CONFIDE_ENGINE=gpu"):
        select_engine()
    monkeypatch.setenv("CONFIDE_ENGINE", "auto")
    choice = select_engine()
    assert choice.gpu is None and choice.name.startswith("cpu:") and "older than the NVRTC" in choice.reason


def test_histograms_equal_the_native_kernel(reference_engine, monkeypatch):
    """SecureBoost's host histograms on the engine: every node's bytes equal the Rust kernel's."""
    from confide.vertical.histograms import node_histograms

    native = fixed_native_key()
    public = native.encryption_key
    rng = np.random.default_rng(11)
    rows, features, n_bins = 203, 5, 8
    values = rng.integers(-(2**40), 2**40, rows, dtype=np.int64)
    gh = public.encrypt_i64(values, "fixed_base", 0)
    bins = rng.integers(0, n_bins, (features, rows), dtype=np.uint8)
    bins[1] = 3  # one feature in a single bin: every other bin of it is empty
    node_of_row = rng.choice(np.array([-1, 4, 5, 6], dtype=np.int32), rows)
    nodes = [6, 4, 9]  # 9 holds no row here
    monkeypatch.setattr(gpu_backend.CpuBackend, "parallel_items", 12)  # several chunks and reduction steps
    on_engine, members = node_histograms(gh, bins, node_of_row, nodes, n_bins, public)
    assert reference_engine._STATE["gpu_batches"] == 1
    expected = [gh.histogram(bins, m, n_bins, 1).to_bytes() for m in members]
    assert on_engine == expected
    sums = [np.asarray(native.decrypt_i64(type(gh).from_bytes(h, public), 0)) for h in on_engine]
    for node_sums, member in zip(sums, members, strict=True):
        for f in range(features):
            plain = np.zeros(n_bins, dtype=np.int64)
            np.add.at(plain, bins[f, member], values[member])
            assert node_sums[f * n_bins : (f + 1) * n_bins].tolist() == plain.tolist()
    # the device copies are reused for the next layer of the same tree
    again, _ = node_histograms(gh, bins, node_of_row, [5], n_bins, public, block=b"not read again")
    assert again == [gh.histogram(bins, np.flatnonzero(node_of_row == 5).astype(np.uint32), n_bins, 1).to_bytes()]
    assert len(reference_engine._HISTOGRAM_INPUTS) == 1
    # the next tree's gradients, handed over as the bytes they came in, replace the last tree's
    block = public.encrypt_i64(values[::-1].copy(), "fixed_base", 0).to_bytes()
    gh2 = type(gh).from_bytes(block, public)
    nxt, members2 = node_histograms(gh2, bins, node_of_row, nodes, n_bins, public, block)
    assert nxt == [gh2.histogram(bins, m, n_bins, 1).to_bytes() for m in members2]
    assert len(reference_engine._HISTOGRAM_INPUTS) == 1
    # bad input is left to the native kernel, which names it
    with pytest.raises(ValueError, match="bin"):
        node_histograms(gh, np.full((features, rows), n_bins, np.uint8), node_of_row, nodes, n_bins, public)


def test_histograms_out_of_memory_run_on_the_cpu_and_are_reported(reference_engine, monkeypatch):
    from confide.vertical.histograms import node_histograms

    public = fixed_native_key().encryption_key
    rng = np.random.default_rng(12)
    gh = public.encrypt_i64(rng.integers(0, 1000, 40, dtype=np.int64), "fixed_base", 0)
    bins = rng.integers(0, 4, (3, 40), dtype=np.uint8)
    monkeypatch.setattr(gpu_engine, "HISTOGRAM_BUDGET", 1000)
    out, members = node_histograms(gh, bins, np.zeros(40, np.int32), [0], 4, public)
    assert out == [gh.histogram(bins, members[0], 4, 1).to_bytes()]
    report = reference_engine.engine_report()
    assert report["gpu_fallbacks"] == 1 and "histogram sums do not fit" in report["gpu_last_fallback"]


def test_secureboost_on_the_engine_builds_the_trees_of_the_cpu_engine(reference_engine):
    """Guest encryption, host histograms and guest decryption on the engine: the same trees."""
    from sklearn.datasets import load_breast_cancer

    from confide.vertical import secureboost as sb
    from confide.vertical.channel import LocalChannel, run_parties

    X, y = load_breast_cancer(return_X_y=True)
    X, y = X[:150], y[:150].astype(float)
    params = sb.SecureBoostParams(n_trees=2, max_depth=2, learning_rate=0.3, n_bins=8)
    native = fixed_native_key()

    def fit():
        channels = LocalChannel.group(["guest", "host"])
        out = run_parties(
            {
                "guest": lambda: sb.train_guest(channels["guest"], ["host"], X[:, :4], y, params, "t", key=native),
                "host": lambda: sb.serve_host(channels["host"], "guest", X[:, 4:10], "t"),
            }
        )
        return [[(n.owner, n.feature, n.bin, round(n.weight, 12)) for n in tree] for tree in out["guest"].trees]

    on_engine = fit()
    report = reference_engine.engine_report()
    assert report["crypto_engine"] == "gpu:cpu-reference" and report["gpu_batches"] >= 6
    assert any(node[0] is not None and node[0] >= 0 for tree in on_engine for node in tree)  # host splits
    reference_engine._STATE["choice"] = reference_engine.EngineChoice("cpu:test", None, "test")
    assert fit() == on_engine


def test_histograms_on_the_gpu(monkeypatch):
    """SecureBoost's host histograms on a real GPU: the Rust kernel's bytes, at a size that fills it."""
    _gpu_or_skip()
    from confide.crypto import gpu
    from confide.vertical.histograms import node_histograms

    gpu.reset_engine()
    monkeypatch.setenv("CONFIDE_ENGINE", "gpu")
    try:
        public = fixed_native_key().encryption_key
        rng = np.random.default_rng(13)
        rows, features, n_bins = 20_000, 30, 32
        gh = public.encrypt_i64(rng.integers(0, 2**50, rows, dtype=np.int64), "fixed_base", 0)
        bins = rng.integers(0, n_bins, (features, rows), dtype=np.uint8)
        node_of_row = rng.integers(0, 4, rows).astype(np.int32)
        on_gpu, members = node_histograms(gh, bins, node_of_row, [0, 2, 3], n_bins, public)
        assert gpu.engine_report()["gpu_batches"] == 1
        assert on_gpu == [gh.histogram(bins, m, n_bins, 0).to_bytes() for m in members]
    finally:
        gpu.reset_engine()


def test_wire_bytes_in_and_out_equal_the_limb_path():
    """encrypt_be turns the byte order on the device: the same ciphertexts as the limb path, m < n enforced."""
    ref, kern = _kernels(512, 3)
    rng = random.Random(31)
    plaintexts = _edge_plaintexts(ref.n, rng, 40)
    exponents = _edge_exponents(ref.rand_bits, rng, 40)
    width = kern.mod_n2.limbs * 2
    rows = np.frombuffer(b"".join(m.to_bytes(width, "big") for m in plaintexts), dtype=np.uint8).reshape(40, width)
    e_limbs = gpu_engine.to_limbs(exponents, (ref.rand_bits + 31) // 32)
    body = kern.encrypt_be(rows, e_limbs)
    assert [int.from_bytes(body[i * 2 * width : (i + 1) * 2 * width], "big") for i in range(40)] == [
        ref.encrypt(m, a) for m, a in zip(plaintexts, exponents, strict=True)
    ]
    too_big = rows.copy()
    too_big[7] = np.frombuffer(ref.n.to_bytes(width, "big"), dtype=np.uint8)  # m = n exactly
    with pytest.raises(ValueError, match=r"plaintexts\[7\] must satisfy 0 <= m < n"):
        kern.encrypt_be(too_big)
    with pytest.raises(ValueError, match="rows of"):
        kern.encrypt_be(rows[:, 1:])


@pytest.mark.parametrize("parallel_items", [64, 120, 600])
def test_small_batches_split_the_table_product_with_the_same_ciphertexts(monkeypatch, parallel_items):
    """One thread per item, or up to 16 threads per item for a small batch: the same residues as GMP."""
    monkeypatch.setattr(gpu_backend.CpuBackend, "parallel_items", parallel_items)
    ref, kern = _kernels(512, 3)
    rng = random.Random(33)
    plaintexts = _edge_plaintexts(ref.n, rng, 37)
    exponents = _edge_exponents(ref.rand_bits, rng, 36) + [0]  # every digit zero: h_s^0 = 1
    assert kern.encrypt_raw(plaintexts, exponents) == [
        ref.encrypt(m, a) for m, a in zip(plaintexts, exponents, strict=True)
    ]
