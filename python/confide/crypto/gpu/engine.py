"""Paillier on a kernel backend: DJN encryption, CRT decryption, ciphertext products and powers.

The same arithmetic as the Rust crate (crates/confide-paillier): DJN encryption
c = (1 + m·n) · h_s^a mod n² with a fresh ``rand_bits``-bit a from a fixed-base table of h_s
(algorithms.md §1.5), CRT decryption m_p = L_p(c^(p-1) mod p²)·h_p mod p (§1.7) and Garner. Every
result is a canonical residue, so for the same exponents a it is byte for byte what the CPU
engine and GMP give (tests/unit/crypto/test_gpu_engine.py checks that on the CPU build of the kernels; the
GPU run checks it on the device, scripts/gpu-check.sh).

Batches are split into chunks that fit the device's free memory; a chunk that still does not
fit is halved until it does (down to :data:`MIN_CHUNK`), then :class:`~confide.crypto.gpu.backend.
GpuUnavailable` tells the caller to use the CPU engine, which it names in its report.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import gmpy2
import numpy as np

from confide.crypto.gpu.backend import GpuUnavailable

MIN_CHUNK = 256
MAX_CHUNK = 1 << 17
DEFAULT_WINDOW = 8
POW_WINDOW = 4
#: Device bytes a histogram call may take for its partial products (and at most a quarter of what is free).
HISTOGRAM_BUDGET = 2 << 30
#: Partials multiplied per thread in each reduction step of a histogram (and of a split table product).
HISTOGRAM_FANIN = 8
#: At most this many threads share one item's fixed-base product when a batch is too small to fill
#: the device (one thread per item leaves most of it idle and the chain's latency is the time).
MAX_TABLE_PARTS = 16


def limbs_of(modulus: int) -> int:
    """32-bit limbs of ``modulus``."""
    return (int(modulus).bit_length() + 31) // 32


def to_limbs(values: Sequence[int], limbs: int) -> np.ndarray:
    """Limb-major (limbs, count) uint32 array of non-negative integers below 2^(32·limbs)."""
    width = 4 * limbs
    data = b"".join(int(v).to_bytes(width, "little") for v in values)
    rows = np.frombuffer(data, dtype="<u4").reshape(len(values), limbs)
    return np.ascontiguousarray(rows.T)


def from_limbs(array: np.ndarray, count: int, limbs: int) -> list[int]:
    """Integers from a flat or (limbs, count) limb-major uint32 array."""
    rows = np.ascontiguousarray(np.asarray(array, dtype="<u4")[: limbs * count].reshape(limbs, count).T)
    data = rows.tobytes()
    width = 4 * limbs
    return [int.from_bytes(data[i * width : (i + 1) * width], "little") for i in range(count)]


class Modulus:
    """An odd modulus M with its Montgomery constants for R = 2^(32·limbs), as kernel arguments."""

    def __init__(self, backend, value: int) -> None:
        if value % 2 == 0 or value < 3:
            raise ValueError("modulus must be odd and at least 3")
        self.value = gmpy2.mpz(value)
        self.limbs = limbs_of(value)
        if backend.limbs != self.limbs:
            raise ValueError(f"backend built for {backend.limbs} limbs, modulus needs {self.limbs}")
        self.backend = backend
        r = gmpy2.mpz(1) << (32 * self.limbs)
        self.r = r
        self.minv = int((-gmpy2.invert(self.value, 1 << 32)) % (1 << 32))
        self.m = backend.upload(to_limbs([int(self.value)], self.limbs).ravel())
        self.r2 = backend.upload(to_limbs([int(r * r % self.value)], self.limbs).ravel())
        self.one = backend.upload(to_limbs([int(r % self.value)], self.limbs).ravel())

    def to_montgomery(self, x: int) -> int:
        """x·R mod M."""
        return int((gmpy2.mpz(x) << (32 * self.limbs)) % self.value)


def _less_than(values: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """Per item (column) of limb-major ``values``: whether it is below the limb vector ``bound``."""
    decided = np.zeros(values.shape[1], dtype=bool)
    less = np.zeros(values.shape[1], dtype=bool)
    for k in range(values.shape[0] - 1, -1, -1):
        row = values[k]
        less |= ~decided & (row < bound[k])
        decided |= row != bound[k]
    return less


def be_rows_to_limbs(data: np.ndarray, limbs: int) -> np.ndarray:
    """Limb-major (limbs, count) uint32 of big-endian fixed-width rows (count, width) of bytes."""
    data = np.asarray(data, dtype=np.uint8)
    count, width = data.shape
    if width > 4 * limbs:
        raise ValueError(f"rows of {width} bytes do not fit {limbs} limbs")
    little = np.zeros((count, 4 * limbs), dtype=np.uint8)
    little[:, :width] = data[:, ::-1]
    return np.ascontiguousarray(little.view("<u4").T)


def limbs_to_be_rows(limb_major: np.ndarray, width: int) -> np.ndarray:
    """Big-endian rows (count, width) of bytes from limb-major (limbs, count) uint32."""
    rows = np.ascontiguousarray(np.asarray(limb_major, dtype="<u4").T)
    little = rows.view(np.uint8)
    if np.any(little[:, width:]):
        raise ValueError(f"values do not fit {width} bytes")
    return np.ascontiguousarray(little[:, :width][:, ::-1])


def _upload_bytes(backend, data) -> Any:
    """Bytes (any shape of uint8, or bytes) on the backend as a uint32 array, zero-padded to whole words."""
    flat = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes | bytearray) else np.asarray(data).ravel()
    padded = np.zeros(-(-max(1, flat.size) // 4) * 4, dtype=np.uint8)
    padded[: flat.size] = flat
    return backend.upload(padded.view("<u4"))


def _download_be(backend, limbs_device, count: int, width: int) -> bytes:
    """``count`` items of limb-major ``limbs_device`` as big-endian rows of ``width`` bytes (turned on the device)."""
    out = backend.empty(-(-count * width // 4))
    backend.launch("cf_to_be", count * width, out, limbs_device, count, width)
    return backend.download(out).view(np.uint8)[: count * width].tobytes()


def _reduce_parts(mod: Modulus, part: Any, flag: Any, groups: int, parts: int) -> tuple[Any, Any]:
    """One product per group of the ``parts`` marked partials per group (``cf_hist_reduce``, repeated)."""
    be = mod.backend
    while parts > 1:
        out_parts = -(-parts // HISTOGRAM_FANIN)
        out, out_flag = be.empty(mod.limbs * out_parts * groups), be.empty(out_parts * groups)
        be.launch(
            "cf_hist_reduce", out_parts * groups, out, out_flag, part, flag, groups, parts, HISTOGRAM_FANIN,
            mod.m, mod.minv,
        )  # fmt: skip
        part, flag, parts = out, out_flag, out_parts
    return part, flag


def _chunks(count: int, chunk: int):
    for start in range(0, count, chunk):
        yield start, min(count, start + chunk)


def _run_chunked(count: int, run: Callable[[int, int], list[int]], chunk: int) -> list[int]:
    """``run(start, stop)`` over chunks; halves the chunk on device out-of-memory."""
    out: list[int] = []
    start = 0
    while start < count:
        stop = min(count, start + chunk)
        try:
            out.extend(run(start, stop))
        except MemoryError:
            if chunk <= MIN_CHUNK:
                raise GpuUnavailable(f"GPU out of memory even for {chunk} items") from None
            chunk = max(MIN_CHUNK, chunk // 2)
            continue
        start = stop
    return out


class FixedBaseTable:
    """T[j][d-1] = B^(d·2^(w·j))·R mod M for d = 1 … 2^w - 1, rows for exponents of ``bits`` bits."""

    def __init__(self, modulus: Modulus, base: int, bits: int, window: int = DEFAULT_WINDOW) -> None:
        if 32 % window:
            raise ValueError(f"window must divide 32, got {window}")
        self.window = window
        self.rows = (bits + window - 1) // window
        self.bits = bits
        m = modulus.value
        per_row = (1 << window) - 1
        entries = []
        row_base = gmpy2.mpz(base) % m
        for _ in range(self.rows):
            x = row_base
            for _d in range(per_row):
                entries.append(x)
                x = x * row_base % m
            row_base = x  # B^(2^w · 2^(w j)) = next row's base
        mont = [modulus.to_montgomery(int(e)) for e in entries]
        limbs = modulus.limbs
        # Entries contiguous (item-major): one table row is read by one thread at a time.
        flat = np.frombuffer(b"".join(int(v).to_bytes(4 * limbs, "little") for v in mont), dtype="<u4")
        self.device = modulus.backend.upload(flat)
        self.bytes = flat.nbytes


class PaillierKernels:
    """Paillier operations for one key on one backend factory (``limbs -> backend``)."""

    def __init__(
        self,
        backend_for: Callable[[int], Any],
        n: int,
        h_s: int,
        rand_bits: int,
        p: int | None = None,
        q: int | None = None,
        window: int = DEFAULT_WINDOW,
        chunk: int = MAX_CHUNK,
    ) -> None:
        self.n = gmpy2.mpz(n)
        self.n2 = self.n * self.n
        self.h_s = gmpy2.mpz(h_s)
        self.rand_bits = int(rand_bits)
        self.window = window
        self.chunk = chunk
        self.backend_for = backend_for
        self.backend = backend_for(limbs_of(self.n2))
        self.mod_n2 = Modulus(self.backend, int(self.n2))
        if limbs_of(self.n) > self.mod_n2.limbs // 2:
            raise ValueError("n must fit in half the limbs of n^2")
        self._n_limbs = to_limbs([int(self.n)], self.mod_n2.limbs // 2)[:, 0]
        self._n_device = self.backend.upload(self._n_limbs)
        self._table: FixedBaseTable | None = None
        self.secret = None
        if p is not None and q is not None:
            self._init_secret(gmpy2.mpz(p), gmpy2.mpz(q))

    @property
    def engine(self) -> str:
        """The backend's name, for reports."""
        return self.backend.name

    def _init_secret(self, p, q) -> None:
        if p * q != self.n:
            raise ValueError("p * q != n")
        p2, q2 = p * p, q * q
        half = self.backend_for(limbs_of(max(p2, q2)))
        mod_p2, mod_q2 = Modulus(half, int(p2)), Modulus(half, int(q2))
        g = self.n + 1

        def h_of(prime, prime2):
            return gmpy2.invert((gmpy2.powmod(g, prime - 1, prime2) - 1) // prime, prime)

        self.secret = {
            "p": p,
            "q": q,
            "p2": p2,
            "q2": q2,
            "mod_p2": mod_p2,
            "mod_q2": mod_q2,
            "h_p": h_of(p, p2),
            "h_q": h_of(q, q2),
            "p_inv_q": gmpy2.invert(p, q),
            "half": half,
        }

    def table(self) -> FixedBaseTable:
        """The fixed-base table of h_s mod n², built and uploaded on first use."""
        if self._table is None:
            self._table = FixedBaseTable(self.mod_n2, int(self.h_s), self.rand_bits, self.window)
        return self._table

    # ---------------------------------------------------------------------------------------
    def encrypt_raw(self, plaintexts: Sequence[int], exponents: Sequence[int] | None = None) -> list[int]:
        """(1 + m·n)·h_s^a mod n² for each plaintext 0 ≤ m < n (fresh a unless given)."""
        count = len(plaintexts)
        for index, m in enumerate(plaintexts):
            if not 0 <= m < self.n:
                raise ValueError(f"plaintexts[{index}] must satisfy 0 <= m < n")
        if exponents is not None and len(exponents) != count:
            raise ValueError(f"exponents: {len(exponents)} given for {count} plaintexts")
        half = self.mod_n2.limbs // 2
        e_limbs = (self.rand_bits + 31) // 32
        exps = None if exponents is None else to_limbs(exponents, e_limbs)
        out = self.encrypt_limbs(to_limbs(plaintexts, half), exps)
        return from_limbs(out, count, self.mod_n2.limbs)

    def random_exponent_limbs(self, count: int) -> np.ndarray:
        """Limb-major ``rand_bits``-bit exponents from the OS's CSPRNG."""
        e_limbs = (self.rand_bits + 31) // 32
        exps = np.frombuffer(os.urandom(4 * e_limbs * count), dtype="<u4").reshape(e_limbs, count).copy()
        spare = 32 * e_limbs - self.rand_bits
        if spare:
            exps[-1] &= np.uint32((1 << (32 - spare)) - 1)
        return exps

    def encrypt_limbs(self, plain: np.ndarray, exponents: np.ndarray | None = None, as_bytes: bool = False):
        """Ciphertexts (limb-major, NL x count) of limb-major plaintexts (NL/2 x count), each < n.

        Fresh exponents come from the OS's CSPRNG unless given (limb-major, ⌈rand_bits/32⌉ x count).
        ``as_bytes``: big-endian rows of 4·NL bytes instead, turned on the device.
        """
        half = self.mod_n2.limbs // 2
        plain = np.asarray(plain, dtype=np.uint32)
        if plain.ndim != 2 or plain.shape[0] != half:
            raise ValueError(f"plaintexts must be limb-major with {half} limbs, got shape {plain.shape}")
        if not np.all(_less_than(plain, self._n_limbs)):
            bad = int(np.argmin(_less_than(plain, self._n_limbs)))
            raise ValueError(f"plaintexts[{bad}] must satisfy 0 <= m < n")
        return self._encrypt(plain, plain.shape[1], exponents, as_bytes=as_bytes, bytes_in=False)

    def encrypt_be(self, rows: np.ndarray, exponents: np.ndarray | None = None) -> bytes:
        """Ciphertexts as big-endian bytes (count x 2·width) of big-endian plaintext rows (count x width).

        The wire form in and out: the byte order is turned on the device (``cf_from_be``,
        ``cf_to_be``), so the host only checks each plaintext against n.
        """
        rows = np.asarray(rows, dtype=np.uint8)
        width = self.mod_n2.limbs * 2
        if rows.ndim != 2 or rows.shape[1] != width:
            raise ValueError(f"plaintexts must be rows of {width} big-endian bytes, got shape {rows.shape}")
        n_row = np.frombuffer(int(self.n).to_bytes(width, "big"), dtype=np.uint8)
        differs = rows != n_row
        first = np.argmax(differs, axis=1)
        below = differs[np.arange(len(rows)), first] & (rows[np.arange(len(rows)), first] < n_row[first])
        if not np.all(below):
            raise ValueError(f"plaintexts[{int(np.argmin(below))}] must satisfy 0 <= m < n")
        return self._encrypt(rows, rows.shape[0], exponents, as_bytes=True, bytes_in=True)

    def _encrypt(self, plain: np.ndarray, count: int, exponents: np.ndarray | None, as_bytes: bool, bytes_in: bool):
        mod = self.mod_n2
        limbs, half = mod.limbs, mod.limbs // 2
        if exponents is None:
            exponents = self.random_exponent_limbs(count)
        e_limbs = exponents.shape[0]
        table = self.table()
        be = self.backend
        width = 4 * limbs  # ciphertext bytes
        out = bytearray(count * width) if as_bytes else np.empty((limbs, count), dtype=np.uint32)

        def run(start: int, stop: int) -> list[int]:
            k = stop - start
            if bytes_in:
                m = be.empty(half * k)
                source = _upload_bytes(be, plain[start:stop])
                be.launch("cf_from_be", half * k, m, source, k, 2 * limbs, half)
            else:
                m = be.upload(np.ascontiguousarray(plain[:, start:stop]))
            e = be.upload(np.ascontiguousarray(exponents[:, start:stop]))
            f = be.empty(limbs * k)
            acc = be.empty(limbs * k)
            be.launch("cf_factor", k, f, m, k, self._n_device)
            parts = min(MAX_TABLE_PARTS, table.rows, be.parallel_items // k)
            if parts > 1:  # too few items to fill the device: several threads per item, then a product
                self._fixed_base_parts(acc, f, e, e_limbs, k, parts)
            else:
                be.launch(
                    "cf_fixed_base", k, acc, acc, f, e, e_limbs, k, table.device, table.rows, table.window,
                    mod.one, mod.m, mod.minv,
                )  # fmt: skip
            if as_bytes:
                out[start * width : stop * width] = _download_be(be, acc, k, width)
            else:
                out[:, start:stop] = be.download(acc)[: limbs * k].reshape(limbs, k)
            return [k]

        _run_chunked(count, run, self.chunk)
        return bytes(out) if as_bytes else out

    def _fixed_base_parts(self, out: Any, factor: Any, exps: Any, e_limbs: int, count: int, parts: int) -> None:
        """``out`` = factor · h_s^e for ``count`` items with the table's rows cut into ``parts`` per item."""
        mod, be, table = self.mod_n2, self.backend, self.table()
        rows_per = -(-table.rows // parts)
        parts = -(-table.rows // rows_per)
        part = be.empty(mod.limbs * parts * count)
        flag = be.empty(parts * count)
        be.launch(
            "cf_fixed_base_part", parts * count, part, flag, exps, e_limbs, count, table.device, table.rows,
            table.window, rows_per, parts, mod.m, mod.minv,
        )  # fmt: skip
        part, flag = _reduce_parts(mod, part, flag, count, parts)
        be.launch("cf_times_factor", count, out, part, flag, factor, count, mod.m, mod.minv)

    def mul_many(self, a: Sequence[int], b: Sequence[int]) -> list[int]:
        """a_i · b_i mod n² (the homomorphic sum of two ciphertext vectors)."""
        if len(a) != len(b):
            raise ValueError(f"b: {len(b)} ciphertexts against {len(a)}")
        mod, be = self.mod_n2, self.backend

        def run(start: int, stop: int) -> list[int]:
            k = stop - start
            x = be.upload(to_limbs(a[start:stop], mod.limbs).ravel())
            y = be.upload(to_limbs(b[start:stop], mod.limbs).ravel())
            be.launch("cf_mulmod", k, x, x, y, k, mod.r2, mod.m, mod.minv)
            return from_limbs(be.download(x), k, mod.limbs)

        return _run_chunked(len(a), run, self.chunk)

    def pow_many(
        self, bases: Sequence[int], exponent: int | Sequence[int], modulus: Modulus | None = None
    ) -> list[int]:
        """base_i^e mod M for one shared non-negative exponent or one per base (M = n² by default)."""
        mod = modulus or self.mod_n2
        return _pow(mod, bases, exponent, self.chunk)

    def decrypt_raw(self, ciphertexts: Sequence[int]) -> list[int]:
        """Plaintexts in [0, n) by CRT; the exponentiations c^(p-1) mod p², c^(q-1) mod q² on the backend."""
        if self.secret is None:
            raise ValueError("decryption needs the secret primes")
        s = self.secret
        for index, c in enumerate(ciphertexts):
            if not 0 < c < self.n2:
                raise ValueError(f"ciphertexts[{index}] must satisfy 0 < c < n^2")
        base_p = [gmpy2.mpz(c) % s["p2"] for c in ciphertexts]
        base_q = [gmpy2.mpz(c) % s["q2"] for c in ciphertexts]
        u_p = _pow(s["mod_p2"], base_p, int(s["p"] - 1), self.chunk)
        u_q = _pow(s["mod_q2"], base_q, int(s["q"] - 1), self.chunk)
        p, q, h_p, h_q, p_inv_q = s["p"], s["q"], s["h_p"], s["h_q"], s["p_inv_q"]
        out = []
        for up, uq in zip(u_p, u_q, strict=False):
            m_p = (gmpy2.mpz(up) - 1) // p * h_p % p
            m_q = (gmpy2.mpz(uq) - 1) // q * h_q % q
            out.append(int(m_p + p * ((m_q - m_p) * p_inv_q % q)))
        return out

    def crt_combine(self, x_p: Sequence[int], x_q: Sequence[int]) -> list[int]:
        """X mod n² from residues mod p² and q² (Garner; the modular product on the backend)."""
        if self.secret is None:
            raise ValueError("CRT needs the secret primes")
        s = self.secret
        mod = s["mod_p2"]
        be = mod.backend
        qinv_m = be.upload(to_limbs([mod.to_montgomery(int(gmpy2.invert(s["q2"], s["p2"])))], mod.limbs).ravel())

        def run(start: int, stop: int) -> list[int]:
            k = stop - start
            xp = be.upload(to_limbs(x_p[start:stop], mod.limbs).ravel())
            xq = be.upload(to_limbs(x_q[start:stop], mod.limbs).ravel())
            h = be.empty(mod.limbs * k)
            be.launch("cf_garner", k, h, xp, xq, k, qinv_m, mod.m, mod.minv)
            hs = from_limbs(be.download(h), k, mod.limbs)
            return [int(gmpy2.mpz(xq_i) + s["q2"] * hi) for xq_i, hi in zip(x_q[start:stop], hs, strict=False)]

        return _run_chunked(len(x_p), run, self.chunk)

    # ---------------------------------------------------------------------------------------
    # SecureBoost host histograms: products of the guest's ciphertexts per (node, feature, bin)
    # ---------------------------------------------------------------------------------------
    def gradients_to_device(self, body: bytes, count: int) -> Any:
        """The guest's ciphertexts on the backend, limb-major in Montgomery form.

        ``body``: ``count`` big-endian rows of 2·|n| bytes (a raw block's body); the byte order is
        turned on the device.
        """
        mod, be = self.mod_n2, self.backend
        width = 4 * mod.limbs
        if len(body) != count * width:
            raise ValueError(f"gradients: {len(body)} bytes for {count} ciphertexts of {width}")
        if count * mod.limbs >= 1 << 32:  # the kernels index items with 32 bits
            raise GpuUnavailable(f"{count} ciphertexts are more than one device call takes")
        device = be.empty(mod.limbs * count)
        be.launch("cf_from_be", mod.limbs * count, device, _upload_bytes(be, body), count, width, mod.limbs)
        be.launch("cf_mul_shared", count, device, count, mod.r2, mod.m, mod.minv)
        return device

    def bins_to_device(self, bins: np.ndarray) -> Any:
        """A holder's bins ((features, rows) uint8) on the backend, row-major (one row's features together)."""
        return _upload_bytes(self.backend, np.ascontiguousarray(np.asarray(bins, dtype=np.uint8).T))

    def histograms(
        self, gh: Any, n_rows: int, bins: Any, features: int, slot: np.ndarray, slots: int, n_bins: int
    ) -> np.ndarray:
        """Limb-major (NL x G) histogram sums in normal form, group g = (slot · n_bins + bin) · features + f.

        ``gh`` and ``bins`` come from :meth:`gradients_to_device` and :meth:`bins_to_device`;
        ``slot[r]`` is row r's node (0 .. slots - 1) or 0xFFFFFFFF for none. A group no row falls in
        is the ciphertext 1, as on the CPU engine. Partials are cut to the device's memory; out of
        memory halves them, down to one chunk, then :class:`GpuUnavailable`.
        """
        mod, be = self.mod_n2, self.backend
        limbs = mod.limbs
        groups = slots * n_bins * features
        per_partial = 4 * (limbs + 1)
        budget = min(be.free_bytes() // 4, HISTOGRAM_BUDGET)
        if groups * per_partial * 2 > budget:
            raise GpuUnavailable(f"GPU memory: {groups} histogram sums do not fit {budget} bytes")
        chunks = max(1, min(n_rows, -(-be.parallel_items // max(1, features))))
        chunks = max(1, min(chunks, budget // (groups * per_partial * 2)))
        slot_device = be.upload(np.asarray(slot, dtype=np.uint32))
        while True:
            rows_per = max(1, -(-n_rows // chunks))
            chunks = max(1, -(-n_rows // rows_per))
            try:
                part = be.empty(limbs * chunks * groups)
                flag = be.zeros(chunks * groups)
                be.launch(
                    "cf_hist_partial", chunks * features, part, flag, gh, n_rows, bins, features, slot_device, slots,
                    n_bins, rows_per, chunks, mod.m, mod.minv,
                )  # fmt: skip
                part, flag = _reduce_parts(mod, part, flag, groups, chunks)
                result = be.empty(limbs * groups)
                be.launch("cf_hist_finish", groups, result, part, flag, groups, mod.m, mod.minv)
                return be.download(result)[: limbs * groups].reshape(limbs, groups)
            except MemoryError:
                if chunks == 1:
                    raise GpuUnavailable(f"GPU out of memory for {groups} histogram sums") from None
                chunks = max(1, chunks // 2)


def _pow(mod: Modulus, bases: Sequence[int], exponent: int | Sequence[int], chunk: int) -> list[int]:
    be = mod.backend
    shared = not isinstance(exponent, list | tuple | np.ndarray)
    if shared:
        if exponent < 0:
            raise ValueError("exponent must be non-negative")
        e_bits = max(1, int(exponent).bit_length())
    else:
        if len(exponent) != len(bases):
            raise ValueError(f"exponents: {len(exponent)} given for {len(bases)} bases")
        if any(e < 0 for e in exponent):
            raise ValueError("exponents must be non-negative")
        e_bits = max(1, max((int(e).bit_length() for e in exponent), default=1))
    e_limbs = (e_bits + 31) // 32
    w = POW_WINDOW
    shared_e = be.upload(to_limbs([int(exponent)], e_limbs).ravel()) if shared else None

    def run(start: int, stop: int) -> list[int]:
        k = stop - start
        x = be.upload(to_limbs(bases[start:stop], mod.limbs).ravel())
        table = be.empty(((1 << w) - 1) * mod.limbs * k)
        if shared:
            e, stride = shared_e, 0
        else:
            e, stride = be.upload(to_limbs(exponent[start:stop], e_limbs).ravel()), k
        be.launch("cf_pow", k, x, x, k, e, stride, e_limbs, e_bits, table, w, mod.r2, mod.one, mod.m, mod.minv)
        return from_limbs(be.download(x), k, mod.limbs)

    return _run_chunked(len(bases), run, chunk)
