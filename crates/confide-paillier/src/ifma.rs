//! 8-lane Montgomery arithmetic with AVX-512 IFMA (`vpmadd52luq`/`vpmadd52huq`):
//! the one multiplier of the crate's IFMA engine, used by CRT decryption, the
//! fixed-base table encryption (public and key-holder) and the vertical-FL
//! kernels (`kernels.rs`).
//!
//! Eight numbers modulo one odd modulus M are held digit-interleaved in radix
//! 2^52: vector i holds digit i of all eight lanes. With R = 2^(52·D) > 4M, the
//! "almost Montgomery" product AMM(a, b) = a·b·R⁻¹ mod M lies in [0, 2M) for
//! inputs in [0, 2M) and needs no final subtraction, so it runs in constant time
//! and chains freely. This is the parallel Montgomery arithmetic of FLBooster
//! (seed 002) on a CPU's SIMD units instead of a GPU.
//!
//! The product (`amm`) scans products column by column, two columns per pass
//! (a_i loaded once for both, b rolled in registers, eight independent
//! accumulators), with a dedicated squaring that sums each cross product once.
//! Measured here: 0.11 µs per lane-product and 0.085 µs per lane-squaring mod a
//! 2048-bit p², 0.42–0.45 µs per lane-product at 4096 bits (n² of a 2048-bit key),
//! against 0.30 and 1.05 µs for the operand-scanning kernel it replaced. Every
//! AMM result is the integer (a·b + q·M)/R with q = −a·b·M⁻¹ mod R, whatever the
//! order of evaluation, so no output depends on which kernel computed it.
//!
//! Used for CRT decryption (c^(p−1) mod p², exponent the same in all lanes,
//! fixed window, table entries chosen by a masked scan of all entries), for
//! fixed-base table encryption (one product per row whatever the digits) with
//! the key holder's Garner step, and by `kernels.rs`. Selected at run time;
//! without IFMA the GMP path runs.
#![allow(unsafe_code)]

use rug::integer::Order;
use rug::Integer;
use std::arch::x86_64::{
    __m512i, _mm512_add_epi64, _mm512_and_si512, _mm512_cmpeq_epi64_mask, _mm512_loadu_si512, _mm512_madd52hi_epu64, _mm512_madd52lo_epu64,
    _mm512_mask_storeu_epi64, _mm512_maskz_loadu_epi64, _mm512_maskz_mov_epi64, _mm512_permutex2var_epi64, _mm512_set1_epi64,
    _mm512_set_epi64, _mm512_setzero_si512, _mm512_shuffle_i64x2, _mm512_srli_epi64, _mm512_storeu_si512, _mm512_ternarylogic_epi64,
    _mm512_unpackhi_epi64, _mm512_unpacklo_epi64, _mm_prefetch, _MM_HINT_T0,
};
use std::mem::MaybeUninit;

/// Lanes per vector.
pub(crate) const LANES: usize = 8;
const DIGIT_BITS: u32 = 52;
const MASK: u64 = (1u64 << DIGIT_BITS) - 1;
/// Largest modulus, in radix-2^52 digits, the engine takes: n² of a 4096-bit key
/// (8192 bits → 158 digits). The kernel's column sums then stay below
/// 4·160·2^52 + carries < 2^62.
pub(crate) const MAX_DIGITS: usize = 160;

/// Whether this CPU can run the IFMA engine (and it is not disabled by
/// `CONFIDE_DISABLE_IFMA=1`, used to test the fallback).
pub(crate) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        std::env::var_os("CONFIDE_DISABLE_IFMA").is_none_or(|v| v == "0")
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512ifma")
    })
}

fn digits_of(modulus: &Integer) -> usize {
    (modulus.significant_bits() as usize + 2).div_ceil(DIGIT_BITS as usize)
}

/// Whether the engine takes this modulus (odd, 2 ≤ D ≤ `MAX_DIGITS`).
pub(crate) fn fits(modulus: &Integer) -> bool {
    (2..=MAX_DIGITS).contains(&digits_of(modulus)) && modulus.is_odd()
}

/// Calls `put(i, digit_i)` for the first `digits` radix-2^52 digits of x ≥ 0.
fn for_each_digit52(x: &Integer, digits: usize, mut put: impl FnMut(usize, u64)) {
    let limbs: &[u64] = x.as_limbs();
    for i in 0..digits {
        let bit = i * DIGIT_BITS as usize;
        let (word, shift) = (bit / 64, bit % 64);
        let Some(&low) = limbs.get(word) else {
            put(i, 0);
            continue;
        };
        let mut value = low >> shift;
        if shift + DIGIT_BITS as usize > 64 {
            if let Some(&high) = limbs.get(word + 1) {
                value |= high << (64 - shift);
            }
        }
        put(i, value & MASK);
    }
}

/// Radix-2^52 digits of x (at most `digits` of them, zero-padded).
pub(crate) fn to_digits52(x: &Integer, digits: usize) -> Vec<u64> {
    let mut out = vec![0u64; digits];
    for_each_digit52(x, digits, |i, d| out[i] = d);
    out
}

/// Integer from normalized radix-2^52 digits, `digit(i)` for i < `count`.
fn from_digit_fn(count: usize, digit: impl Fn(usize) -> u64) -> Integer {
    // MAX_DIGITS·52 bits fit in 130 limbs.
    let mut limbs = [0u64; (MAX_DIGITS * DIGIT_BITS as usize).div_ceil(64) + 1];
    let words = (count * DIGIT_BITS as usize).div_ceil(64).min(limbs.len());
    for i in 0..count {
        let d = digit(i);
        let bit = i * DIGIT_BITS as usize;
        let (word, shift) = (bit / 64, bit % 64);
        if let Some(slot) = limbs.get_mut(word) {
            *slot |= d << shift;
        }
        if shift + DIGIT_BITS as usize > 64 {
            if let Some(slot) = limbs.get_mut(word + 1) {
                *slot |= d >> (64 - shift);
            }
        }
    }
    Integer::from_digits(&limbs[..words], Order::Lsf)
}

/// Integer from normalized radix-2^52 digits.
#[cfg(test)]
pub(crate) fn from_digits52(digits: &[u64]) -> Integer {
    from_digit_fn(digits.len(), |i| digits[i])
}

/// An odd modulus M prepared for 8-lane AMM. Only built when `available()`
/// said yes (the kernels need AVX-512F and IFMA).
pub(crate) struct IfmaModulus {
    /// D: digits per value.
    pub(crate) digits: usize,
    modulus: Integer,
    /// Digits of M.
    m: Vec<u64>,
    /// −M⁻¹ mod 2^52.
    m_prime: u64,
    /// R² mod M (enters Montgomery form).
    r_squared: Vec<u64>,
    /// The integer 1 (leaves Montgomery form).
    unit: Vec<u64>,
    /// R mod M, the Montgomery form of 1.
    pub(crate) one: Vec<u64>,
    /// `one` in all eight lanes.
    pub(crate) one_lanes: Vec<u64>,
}

impl IfmaModulus {
    /// Prepares M. `None` when M is even, needs fewer than 2 or more than
    /// `MAX_DIGITS` digits (callers use GMP then), or the CPU lacks IFMA.
    pub(crate) fn new(modulus: &Integer) -> Option<Self> {
        if !fits(modulus) || !available() {
            return None;
        }
        let digits = digits_of(modulus);
        let m = to_digits52(modulus, digits);
        // Newton iteration for M⁻¹ mod 2^64 (each step doubles the correct bits).
        let mut inverse: u64 = 1;
        for _ in 0..6 {
            inverse = inverse.wrapping_mul(2u64.wrapping_sub(m[0].wrapping_mul(inverse)));
        }
        let r_mod = (Integer::from(1) << (digits as u32 * DIGIT_BITS)) % modulus;
        let r_squared = Integer::from(&r_mod * &r_mod) % modulus;
        let one = to_digits52(&r_mod, digits);
        Some(IfmaModulus {
            digits,
            modulus: modulus.clone(),
            m,
            m_prime: inverse.wrapping_neg() & MASK,
            r_squared: to_digits52(&r_squared, digits),
            unit: to_digits52(&Integer::from(1), digits),
            one_lanes: one.iter().flat_map(|&d| [d; LANES]).collect(),
            one,
        })
    }

    /// Words of one interleaved operand: D·8.
    pub(crate) fn width(&self) -> usize {
        self.digits * LANES
    }

    pub(crate) fn zero_lanes(&self) -> Vec<u64> {
        vec![0u64; self.width()]
    }

    /// out = AMM(a, b) of two interleaved operands (normalized digits, values in [0, 2M)).
    pub(crate) fn mul(&self, a: &[u64], b: &[u64], out: &mut [u64]) {
        self.kernel::<false, false>(a, b, out, self.width(), LANES);
    }

    /// out = AMM(a, b) with one value b (D digits) in every lane.
    pub(crate) fn mul_broadcast(&self, a: &[u64], b: &[u64], out: &mut [u64]) {
        self.kernel::<true, false>(a, b, out, self.digits, 1);
    }

    /// out = AMM(a, b) with lane `lane` of the interleaved `block` in every lane.
    pub(crate) fn mul_broadcast_lane(&self, a: &[u64], block: &[u64], lane: usize, out: &mut [u64]) {
        if lane < LANES {
            self.kernel::<true, false>(a, &block[lane..], out, (self.digits - 1) * LANES + 1, LANES);
        }
    }

    /// out = AMM(a, a).
    pub(crate) fn square(&self, a: &[u64], out: &mut [u64]) {
        self.kernel::<false, true>(a, a, out, self.width(), LANES);
    }

    /// `b_len`: words of `b` read; `b_stride`: distance between broadcast digits.
    /// Too short slices leave `out` untouched (callers size them from `width()`).
    fn kernel<const BROADCAST: bool, const SQUARE: bool>(&self, a: &[u64], b: &[u64], out: &mut [u64], b_len: usize, b_stride: usize) {
        let width = self.width();
        if a.len() < width || b.len() < b_len || out.len() < width {
            debug_assert!(false, "AMM operand shorter than D·8 words");
            return;
        }
        // SAFETY: lengths checked above; `IfmaModulus::new` only succeeds when the CPU
        // has AVX-512F and IFMA and 2 ≤ D ≤ MAX_DIGITS; `out` is a distinct &mut, so
        // it cannot overlap a or b.
        unsafe { amm::<BROADCAST, SQUARE>(a.as_ptr(), b.as_ptr(), b_stride, self.m.as_ptr(), self.m_prime, self.digits, out.as_mut_ptr()) }
    }

    /// Normal-form values (each below 2^(52·D)) into interleaved lanes; missing lanes get 1.
    pub(crate) fn pack(&self, values: &[&Integer], out: &mut [u64]) {
        if out.len() < self.width() {
            return;
        }
        for lane in 0..LANES {
            match values.get(lane) {
                Some(v) => for_each_digit52(v, self.digits, |i, d| out[i * LANES + lane] = d),
                None => {
                    for (i, &d) in self.unit.iter().enumerate() {
                        out[i * LANES + lane] = d;
                    }
                }
            }
        }
    }

    /// Montgomery form of up to eight values < M, interleaved (missing lanes: one).
    pub(crate) fn enter(&self, values: &[&Integer], out: &mut [u64]) {
        let mut packed = self.zero_lanes();
        self.pack(values, &mut packed);
        self.mul_broadcast(&packed, &self.r_squared, out);
    }

    /// The first `count` lanes of normal-form values in [0, 2M), fully reduced.
    pub(crate) fn unpack(&self, lanes: &[u64], count: usize) -> Vec<Integer> {
        if lanes.len() < self.width() {
            return Vec::new();
        }
        (0..count.min(LANES))
            .map(|lane| {
                let mut value = from_digit_fn(self.digits, |i| lanes[i * LANES + lane]);
                if value >= self.modulus {
                    value -= &self.modulus;
                }
                value
            })
            .collect()
    }

    /// The first `count` lanes, out of Montgomery form, fully reduced.
    pub(crate) fn leave(&self, lanes: &[u64], count: usize) -> Vec<Integer> {
        let mut normal = self.zero_lanes();
        // AMM(x, 1) ≤ M; equality only for x ≡ 0, which `unpack` maps to 0.
        self.mul_broadcast(lanes, &self.unit, &mut normal);
        self.unpack(&normal, count)
    }

    /// Interleaves eight D-digit values.
    pub(crate) fn gather(&self, sources: [&[u64]; LANES], out: &mut [u64]) {
        let d = self.digits;
        if out.len() < d * LANES || sources.iter().any(|s| s.len() < d) {
            return;
        }
        let pointers = sources.map(<[u64]>::as_ptr);
        // SAFETY: every source has at least D words and `out` D·8 (checked above);
        // an `IfmaModulus` exists only on CPUs with AVX-512F.
        unsafe { transpose_in(&pointers, d, out.as_mut_ptr()) }
    }

    /// Lane l of `lanes` → table[offsets[l] .. + D].
    pub(crate) fn scatter(&self, lanes: &[u64], table: &mut [u64], offsets: &[usize; LANES]) {
        let d = self.digits;
        if lanes.len() < d * LANES || offsets.iter().any(|&o| o + d > table.len()) {
            return;
        }
        let base = table.as_mut_ptr();
        // SAFETY: each offset + D is within `table` (checked above), so every pointer
        // stays inside it; `lanes` has D·8 words; AVX-512F as in `gather`.
        unsafe { transpose_out(lanes.as_ptr(), d, &offsets.map(|o| base.add(o))) }
    }

    /// Hints the cache lines of eight table entries into L1.
    pub(crate) fn prefetch(&self, table: &[u64], offsets: &[usize; LANES]) {
        for &offset in offsets {
            if let Some(entry) = table.get(offset..offset + self.digits) {
                prefetch_words(entry);
            }
        }
    }

    /// base^exponent mod M for up to eight bases (< M) sharing one (secret) exponent.
    /// Fixed windows (the count set by the exponent's bit length), every table entry
    /// read for every window (masked select), the same products in the same order
    /// whatever the bits: constant time in base and exponent. Window 4: the scan of
    /// 16 entries (40 KiB at D = 40, in L1) costs a fifth of a product, that of 32
    /// entries (from L2) 0.7 of one; measured 4 % faster than window 5 at D = 40,
    /// 1 % at D = 60 and 79.
    pub(crate) fn pow_shared_exponent(&self, bases: &[&Integer], exponent: &Integer) -> Vec<Integer> {
        self.pow_shared_exponent_window(bases, exponent, 4)
    }

    fn pow_shared_exponent_window(&self, bases: &[&Integer], exponent: &Integer, window: usize) -> Vec<Integer> {
        let mut base = self.zero_lanes();
        self.enter(bases, &mut base);
        let mut table = Vec::with_capacity(1 << window);
        table.push(self.one_lanes.clone());
        table.push(base.clone());
        for k in 2..(1 << window) {
            let mut next = self.zero_lanes();
            if k % 2 == 0 {
                self.square(&table[k / 2], &mut next);
            } else {
                self.mul(&table[k - 1], &base, &mut next);
            }
            table.push(next);
        }
        let bits = exponent.significant_bits() as usize;
        let windows = bits.div_ceil(window).max(1);
        let digit_at = |w: usize| -> u64 {
            let mut digit = 0u64;
            for b in 0..window {
                digit |= u64::from(exponent.get_bit((w * window + b) as u32)) << b;
            }
            digit
        };
        let mut acc = self.zero_lanes();
        let mut tmp = self.zero_lanes();
        let mut selected = self.zero_lanes();
        // The top window starts the accumulator (its squarings of one would be no-ops).
        // SAFETY: an `IfmaModulus` exists only with AVX-512F; every table entry,
        // `acc` and `selected` have D·8 words.
        unsafe { select(&table, digit_at(windows - 1), &mut acc) };
        for w in (0..windows - 1).rev() {
            for _ in 0..window {
                self.square(&acc, &mut tmp);
                std::mem::swap(&mut acc, &mut tmp);
            }
            // SAFETY: as above.
            unsafe { select(&table, digit_at(w), &mut selected) };
            self.mul(&acc, &selected, &mut tmp);
            std::mem::swap(&mut acc, &mut tmp);
        }
        self.leave(&acc, bases.len())
    }
}

/// Prefetches the cache lines of `words` into L1.
fn prefetch_words(words: &[u64]) {
    for line in words.chunks(8) {
        // SAFETY: a prefetch never faults and `line` is a valid reference; SSE is
        // part of the x86_64 baseline.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
    }
}

/// out = table[index], reading every entry in full (constant time in `index`):
/// entry k is OR-ed in under a vector mask that is all ones when k == index and
/// all zeros otherwise (no branch, no masked load). Output vectors are built
/// eight at a time, so the accumulators stay in registers while the entries stream by.
///
/// # Safety
/// AVX-512F; every entry at least `out.len()` words, `out.len()` a multiple of 8.
#[target_feature(enable = "avx512f")]
unsafe fn select(table: &[Vec<u64>], index: u64, out: &mut [u64]) {
    let vectors = out.len() / LANES;
    let mut first = 0;
    while first < vectors {
        let left = vectors - first;
        if left >= 8 {
            select_block::<8>(table, index, first, out);
            first += 8;
        } else if left >= 4 {
            select_block::<4>(table, index, first, out);
            first += 4;
        } else {
            select_block::<1>(table, index, first, out);
            first += 1;
        }
    }
}

/// Output vectors `first .. first + N` of `select`.
///
/// # Safety
/// As `select`, and `first + N` ≤ `out.len()` / 8.
#[inline(always)]
unsafe fn select_block<const N: usize>(table: &[Vec<u64>], index: u64, first: usize, out: &mut [u64]) {
    let wanted = _mm512_set1_epi64(index as i64);
    let ones = _mm512_set1_epi64(-1);
    let mut acc = [_mm512_setzero_si512(); N];
    for (k, entry) in table.iter().enumerate() {
        let keep = _mm512_maskz_mov_epi64(_mm512_cmpeq_epi64_mask(_mm512_set1_epi64(k as i64), wanted), ones);
        let base = entry.as_ptr().add(first * LANES);
        for (j, slot) in acc.iter_mut().enumerate() {
            // slot | (entry & keep)
            *slot = _mm512_ternarylogic_epi64::<0xF8>(*slot, _mm512_loadu_si512(base.add(j * LANES).cast()), keep);
        }
    }
    for (j, slot) in acc.iter().enumerate() {
        _mm512_storeu_si512(out.as_mut_ptr().add((first + j) * LANES).cast(), *slot);
    }
}

/// In-register transpose of an 8×8 block of u64: rows[l][i] → rows[i][l].
#[inline(always)]
unsafe fn transpose8(rows: &mut [__m512i; LANES]) {
    let mut s = [_mm512_setzero_si512(); LANES];
    for p in 0..4 {
        s[2 * p] = _mm512_unpacklo_epi64(rows[2 * p], rows[2 * p + 1]); // columns 0 2 4 6 of rows 2p, 2p+1
        s[2 * p + 1] = _mm512_unpackhi_epi64(rows[2 * p], rows[2 * p + 1]); // columns 1 3 5 7
    }
    let low = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
    let high = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    // u[q]: rows 0–3 (q < 4) or 4–7, two columns each.
    let u = [
        _mm512_permutex2var_epi64(s[0], low, s[2]),  // columns 0, 4
        _mm512_permutex2var_epi64(s[0], high, s[2]), // columns 2, 6
        _mm512_permutex2var_epi64(s[1], low, s[3]),  // columns 1, 5
        _mm512_permutex2var_epi64(s[1], high, s[3]), // columns 3, 7
        _mm512_permutex2var_epi64(s[4], low, s[6]),
        _mm512_permutex2var_epi64(s[4], high, s[6]),
        _mm512_permutex2var_epi64(s[5], low, s[7]),
        _mm512_permutex2var_epi64(s[5], high, s[7]),
    ];
    rows[0] = _mm512_shuffle_i64x2::<0x44>(u[0], u[4]);
    rows[4] = _mm512_shuffle_i64x2::<0xEE>(u[0], u[4]);
    rows[2] = _mm512_shuffle_i64x2::<0x44>(u[1], u[5]);
    rows[6] = _mm512_shuffle_i64x2::<0xEE>(u[1], u[5]);
    rows[1] = _mm512_shuffle_i64x2::<0x44>(u[2], u[6]);
    rows[5] = _mm512_shuffle_i64x2::<0xEE>(u[2], u[6]);
    rows[3] = _mm512_shuffle_i64x2::<0x44>(u[3], u[7]);
    rows[7] = _mm512_shuffle_i64x2::<0xEE>(u[3], u[7]);
}

/// Interleaves eight D-word runs: out[i·8 + l] = sources[l][i].
///
/// # Safety
/// AVX-512F; every source readable for D words, `out` writable for D·8.
#[target_feature(enable = "avx512f")]
unsafe fn transpose_in(sources: &[*const u64; LANES], d: usize, out: *mut u64) {
    for block in (0..d).step_by(LANES) {
        let count = (d - block).min(LANES);
        let mask: u8 = if count == LANES { 0xFF } else { (1u8 << count) - 1 };
        let mut rows: [__m512i; LANES] = std::array::from_fn(|l| _mm512_maskz_loadu_epi64(mask, sources[l].add(block).cast()));
        transpose8(&mut rows);
        for (i, row) in rows.iter().take(count).enumerate() {
            _mm512_storeu_si512(out.add((block + i) * LANES).cast(), *row);
        }
    }
}

/// The inverse: destinations[l][i] = lanes[i·8 + l].
///
/// # Safety
/// AVX-512F; `lanes` readable for D·8 words, every destination writable for D.
#[target_feature(enable = "avx512f")]
unsafe fn transpose_out(lanes: *const u64, d: usize, destinations: &[*mut u64; LANES]) {
    for block in (0..d).step_by(LANES) {
        let count = (d - block).min(LANES);
        let mask: u8 = if count == LANES { 0xFF } else { (1u8 << count) - 1 };
        let mut rows: [__m512i; LANES] =
            std::array::from_fn(|i| if i < count { load(lanes.add((block + i) * LANES)) } else { _mm512_setzero_si512() });
        transpose8(&mut rows);
        for (l, row) in rows.iter().enumerate() {
            _mm512_mask_storeu_epi64(destinations[l].add(block).cast(), mask, *row);
        }
    }
}

#[inline(always)]
unsafe fn load(p: *const u64) -> __m512i {
    _mm512_loadu_si512(p.cast())
}

#[inline(always)]
unsafe fn broadcast(p: *const u64) -> __m512i {
    _mm512_set1_epi64(*p as i64)
}

/// Almost-Montgomery product AMM(a, b) = a·b·R⁻¹ mod M in [0, 2M) of eight lanes
/// (inputs in [0, 2M) with digits < 2^52), by product scanning: t = a·b + q·M
/// column by column, q_k chosen as column k completes (k < D) so that the
/// column is ≡ 0 mod 2^52; columns D … 2D − 1 are the result. Two columns per
/// pass: a_i is loaded once for both, b_{k−i} carries over to the next i, and
/// eight independent accumulators hide the multiply latency. Column sums
/// stay below 4·D·2^52 + carries < 2^62 for D ≤ 160. With `SQUARE`, the
/// cross products a_i·a_j (i < j) are summed once and doubled.
///
/// # Safety
/// The CPU must have AVX-512F and IFMA; `a` and `out` hold D·8 words, `b`
/// D·8 (with `BROADCAST`: (D − 1)·`b_stride` + 1), `m` D digits; `out` must not overlap `a` or `b`;
/// 2 ≤ D ≤ MAX_DIGITS.
#[target_feature(enable = "avx512f,avx512ifma")]
unsafe fn amm<const BROADCAST: bool, const SQUARE: bool>(
    a: *const u64,
    b: *const u64,
    b_stride: usize,
    m: *const u64,
    m_prime: u64,
    d: usize,
    out: *mut u64,
) {
    let zero = _mm512_setzero_si512();
    let mask = _mm512_set1_epi64(MASK as i64);
    let mp = _mm512_set1_epi64(m_prime as i64);
    // q_i are written (k < D) before they are read (i < k).
    let mut q_store: MaybeUninit<[__m512i; MAX_DIGITS]> = MaybeUninit::uninit();
    let qp = q_store.as_mut_ptr().cast::<__m512i>();
    let al = |i: usize| load(a.add(i * LANES));
    let bl = |j: usize| {
        if SQUARE {
            load(a.add(j * LANES))
        } else if BROADCAST {
            broadcast(b.add(j * b_stride))
        } else {
            load(b.add(j * LANES))
        }
    };
    let ql = |i: usize| *qp.add(i);
    let ml = |j: usize| broadcast(m.add(j));
    macro_rules! lo {
        ($acc:expr, $x:expr, $y:expr) => {
            $acc = _mm512_madd52lo_epu64($acc, $x, $y)
        };
    }
    macro_rules! hi {
        ($acc:expr, $x:expr, $y:expr) => {
            $acc = _mm512_madd52hi_epu64($acc, $x, $y)
        };
    }
    // Sums over a range of i shared by columns k and k + 1:
    // (l0, h1) += x_i·y_{k−i}, (l1, h2) += x_i·y_{k+1−i}, for i in start..=end.
    macro_rules! shared {
        ($x:expr, $y:expr, $k:expr, $start:expr, $end:expr,
         $l0a:ident, $h1a:ident, $l1a:ident, $h2a:ident, $l0b:ident, $h1b:ident, $l1b:ident, $h2b:ident) => {{
            let (k, end) = ($k, $end);
            let mut i = $start;
            if i <= end {
                let mut y1 = $y(k + 1 - i);
                while i < end {
                    let x0 = $x(i);
                    let y0 = $y(k - i);
                    lo!($l0a, x0, y0);
                    hi!($h1a, x0, y0);
                    lo!($l1a, x0, y1);
                    hi!($h2a, x0, y1);
                    let x1 = $x(i + 1);
                    let y2 = $y(k - i - 1);
                    lo!($l0b, x1, y2);
                    hi!($h1b, x1, y2);
                    lo!($l1b, x1, y0);
                    hi!($h2b, x1, y0);
                    y1 = y2;
                    i += 2;
                }
                if i == end {
                    let x0 = $x(i);
                    let y0 = $y(k - i);
                    lo!($l0a, x0, y0);
                    hi!($h1a, x0, y0);
                    lo!($l1a, x0, y1);
                    hi!($h2a, x0, y1);
                }
            }
        }};
    }
    let mut carry = zero;
    let mut hi_in = zero;
    let mut k = 0;
    while k + 1 < 2 * d - 1 {
        let (mut l0a, mut h1a, mut l1a, mut h2a) = (zero, zero, zero, zero);
        let (mut l0b, mut h1b, mut l1b, mut h2b) = (zero, zero, zero, zero);
        let low = (k + 1).saturating_sub(d); // smallest i of column k
        if SQUARE {
            // Cross terms i < j only, then doubled, then the squares.
            let mut start = low;
            if k + 1 >= d {
                let (x, y) = (al(low), al(k - low)); // j = D − 1: column k only
                lo!(l0a, x, y);
                hi!(h1a, x, y);
                start += 1;
            }
            if k >= 1 && start <= (k - 1) / 2 {
                shared!(al, al, k, start, (k - 1) / 2, l0a, h1a, l1a, h2a, l0b, h1b, l1b, h2b);
            }
            if k % 2 == 0 && k / 2 + 1 < d {
                let (x, y) = (al(k / 2), al(k / 2 + 1)); // column k + 1 only
                lo!(l1b, x, y);
                hi!(h2b, x, y);
            }
            l0a = _mm512_add_epi64(l0a, l0b);
            h1a = _mm512_add_epi64(h1a, h1b);
            l1a = _mm512_add_epi64(l1a, l1b);
            h2a = _mm512_add_epi64(h2a, h2b);
            l0a = _mm512_add_epi64(l0a, l0a);
            h1a = _mm512_add_epi64(h1a, h1a);
            l1a = _mm512_add_epi64(l1a, l1a);
            h2a = _mm512_add_epi64(h2a, h2a);
            (l0b, h1b, l1b, h2b) = (zero, zero, zero, zero);
            if k % 2 == 0 {
                let x = al(k / 2);
                lo!(l0a, x, x);
                hi!(h1a, x, x);
            } else {
                let x = al(k.div_ceil(2));
                lo!(l1a, x, x);
                hi!(h2a, x, x);
            }
        } else {
            let mut start = low;
            if k + 1 >= d {
                let (x, y) = (al(low), bl(k - low));
                lo!(l0a, x, y);
                hi!(h1a, x, y);
                start += 1;
            }
            shared!(al, bl, k, start, k.min(d - 1), l0a, h1a, l1a, h2a, l0b, h1b, l1b, h2b);
            if k + 1 < d {
                let (x, y) = (al(k + 1), bl(0)); // column k + 1 only
                lo!(l1b, x, y);
                hi!(h2b, x, y);
            }
        }
        // q·M terms with the known q_0 … q_{k−1}.
        if k >= 1 {
            let end = (k - 1).min(d - 1);
            let mut start = low;
            if k + 1 >= d && low <= end {
                let (x, y) = (ql(low), ml(k - low));
                lo!(l0a, x, y);
                hi!(h1a, x, y);
                start += 1;
            }
            shared!(ql, ml, k, start, end, l0a, h1a, l1a, h2a, l0b, h1b, l1b, h2b);
        }
        let mut acc = _mm512_add_epi64(_mm512_add_epi64(carry, hi_in), _mm512_add_epi64(l0a, l0b));
        let mut h1 = _mm512_add_epi64(h1a, h1b);
        let mut l1 = _mm512_add_epi64(l1a, l1b);
        let mut h2 = _mm512_add_epi64(h2a, h2b);
        if k < d {
            let qk = _mm512_madd52lo_epu64(zero, acc, mp);
            *qp.add(k) = qk;
            let m0 = ml(0);
            lo!(acc, qk, m0);
            hi!(h1, qk, m0);
            let m1 = ml(1);
            lo!(l1, qk, m1);
            hi!(h2, qk, m1);
        } else {
            _mm512_storeu_si512(out.add((k - d) * LANES).cast(), _mm512_and_si512(acc, mask));
        }
        carry = _mm512_srli_epi64(acc, DIGIT_BITS);
        let mut acc = _mm512_add_epi64(_mm512_add_epi64(carry, h1), l1);
        if k + 1 < d {
            let qk = _mm512_madd52lo_epu64(zero, acc, mp);
            *qp.add(k + 1) = qk;
            let m0 = ml(0);
            lo!(acc, qk, m0);
            hi!(h2, qk, m0);
        } else {
            _mm512_storeu_si512(out.add((k + 1 - d) * LANES).cast(), _mm512_and_si512(acc, mask));
        }
        carry = _mm512_srli_epi64(acc, DIGIT_BITS);
        hi_in = h2;
        k += 2;
    }
    // Column 2D − 2 (an output column for D ≥ 2): the pairs (D − 1, D − 1).
    let (x, y) = (al(d - 1), bl(d - 1));
    let (qx, my) = (ql(d - 1), ml(d - 1));
    let mut acc = _mm512_add_epi64(carry, hi_in);
    let mut h = zero;
    lo!(acc, x, y);
    hi!(h, x, y);
    lo!(acc, qx, my);
    hi!(h, qx, my);
    _mm512_storeu_si512(out.add((d - 2) * LANES).cast(), _mm512_and_si512(acc, mask));
    let acc = _mm512_add_epi64(_mm512_srli_epi64(acc, DIGIT_BITS), h);
    _mm512_storeu_si512(out.add((d - 1) * LANES).cast(), _mm512_and_si512(acc, mask));
}

/// A fixed-base table (algorithms.md §1.5) in AMM Montgomery form, evaluated
/// for eight different exponents at once: per row, each lane's entry is picked
/// by its digit, the eight entries are transposed into one interleaved operand
/// (the next row's entries prefetched meanwhile) and a single 8-lane product follows.
pub(crate) struct IfmaTable {
    modulus: IfmaModulus,
    window: u32,
    rows: usize,
    /// Row j, digit d (0 ≤ d < 2^w): B^(d·2^(w·j))·R mod M, D digits each; d = 0 is one.
    entries: Vec<u64>,
}

/// Rows ahead of the current one whose entries are prefetched.
const PREFETCH_ROWS: usize = 2;

impl IfmaTable {
    /// Table of `base` mod M for exponents of at most `max_bits` bits (rows in parallel).
    /// `None` when the modulus does not suit the engine.
    pub(crate) fn new(modulus: &Integer, base: &Integer, max_bits: u32, window: u32) -> Option<Self> {
        use rayon::prelude::*;
        let context = IfmaModulus::new(modulus)?;
        let digits = context.digits;
        let shift = digits as u32 * DIGIT_BITS;
        let rows = max_bits.div_ceil(window) as usize;
        let per_row = 1usize << window;
        let mut row_bases = Vec::with_capacity(rows);
        let mut current = Integer::from(base % modulus);
        let step = Integer::from(1) << window;
        for _ in 0..rows {
            row_bases.push(current.clone());
            current = current.pow_mod(&step, modulus).unwrap_or_default();
        }
        let mut entries = vec![0u64; rows * per_row * digits];
        entries.par_chunks_mut(per_row * digits).zip(row_bases.par_iter()).for_each(|(row, row_base)| {
            row[..digits].copy_from_slice(&context.one);
            let mut power = row_base.clone();
            for d in 1..per_row {
                let montgomery = Integer::from(&power << shift) % modulus;
                for_each_digit52(&montgomery, digits, |i, v| row[d * digits + i] = v);
                power *= row_base;
                power %= modulus;
            }
        });
        Some(IfmaTable { modulus: context, window, rows, entries })
    }

    pub(crate) fn size_bytes(&self) -> usize {
        self.entries.len() * 8
    }

    pub(crate) fn modulus(&self) -> &Integer {
        &self.modulus.modulus
    }

    /// factor_i · B^(exponent_i) mod M, fully reduced, for up to eight pairs.
    /// Exponents are little-endian u64 limbs of at most `max_bits` bits; factors must be < M.
    /// One product per row whatever the digits (a zero digit reads the row's entry
    /// one); which entries are read depends on the digits.
    pub(crate) fn power_times(&self, exponents: &[Vec<u64>], factors: &[&Integer]) -> Vec<Integer> {
        self.modulus.unpack(&self.power_times_lanes(exponents, factors), exponents.len())
    }

    /// As `power_times`, the products left in lanes (normal form, [0, 2M)).
    fn power_times_lanes(&self, exponents: &[Vec<u64>], factors: &[&Integer]) -> Vec<u64> {
        let ctx = &self.modulus;
        let d = ctx.digits;
        let w = self.window as usize;
        let per_row = 1usize << self.window;
        let offset = |row: usize, lane: usize| -> usize {
            let digit = exponents.get(lane).map_or(0, |e| crate::table::extract_bits(e, row * w, w)) as usize;
            (row * per_row + digit) * d
        };
        let entries = |row: usize| -> [&[u64]; LANES] {
            std::array::from_fn(|lane| {
                let start = offset(row, lane);
                &self.entries[start..start + d]
            })
        };
        let mut acc = ctx.one_lanes.clone();
        let mut gathered = ctx.zero_lanes();
        let mut tmp = ctx.zero_lanes();
        for row in 0..self.rows.min(PREFETCH_ROWS) {
            entries(row).iter().for_each(|e| prefetch_words(e));
        }
        for row in 0..self.rows {
            if row + PREFETCH_ROWS < self.rows {
                entries(row + PREFETCH_ROWS).iter().for_each(|e| prefetch_words(e));
            }
            if row == 0 {
                // one·T = T: the first row is the accumulator itself.
                ctx.gather(entries(0), &mut acc);
                continue;
            }
            ctx.gather(entries(row), &mut gathered);
            ctx.mul(&acc, &gathered, &mut tmp);
            std::mem::swap(&mut acc, &mut tmp);
        }
        // (B^a·R)·f·R⁻¹ = B^a·f: multiplying by the normal-form factor leaves Montgomery form.
        ctx.pack(factors, &mut gathered);
        ctx.mul(&acc, &gathered, &mut tmp);
        tmp
    }
}

/// Garner's recombination of key-holder (CRT) encryption on the lanes:
/// c = c_q + q²·((c_p − c_q)·(q²)⁻¹ mod p²). The two products by (q²)⁻¹ are
/// 8-lane AMMs mod p² (c·(q²)⁻¹·R·R⁻¹), which leaves one GMP product (by q²) per
/// value instead of a product, a division and a product.
pub(crate) struct IfmaCrt {
    /// (q²)⁻¹·R mod p², R of the p² context.
    inverse_r: Vec<u64>,
    p_squared: Integer,
    q_squared: Integer,
}

impl IfmaCrt {
    /// `None` unless p² and q² have the same digit count (then GMP recombines).
    pub(crate) fn new(table_p: &IfmaTable, table_q: &IfmaTable, q_squared_inverse: &Integer) -> Option<Self> {
        let ctx = &table_p.modulus;
        if ctx.digits != table_q.modulus.digits {
            return None;
        }
        let inverse_r = Integer::from(q_squared_inverse << (ctx.digits as u32 * DIGIT_BITS)) % &ctx.modulus;
        Some(IfmaCrt {
            inverse_r: to_digits52(&inverse_r, ctx.digits),
            p_squared: ctx.modulus.clone(),
            q_squared: table_q.modulus.modulus.clone(),
        })
    }

    /// CRT encryptions of up to eight values: c_i mod p² = factor_p,i·B^(a_i) (table
    /// mod p²), c_i mod q² = factor_q,i·B^(a_i) (table mod q²), c_i in [0, p²q²).
    /// The tables must be the ones `new` was given.
    pub(crate) fn power_times(
        &self,
        table_p: &IfmaTable,
        table_q: &IfmaTable,
        exponents: &[Vec<u64>],
        factors_p: &[&Integer],
        factors_q: &[&Integer],
    ) -> Vec<Integer> {
        let ctx = &table_p.modulus;
        let c_p = table_p.power_times_lanes(exponents, factors_p);
        let c_q = table_q.power_times_lanes(exponents, factors_q);
        // The q side must enter fully reduced: c_q may hold r_q + q² (lanes end in [0, 2q²)),
        // and q² is not 0 mod p², so the unreduced lane would give t − 1 and c − q². (That
        // happens with probability ≈ q²/(4R) per value: 2^-14 for 4096-bit keys, whose q² has
        // 12 bits of headroom in R; it made one of eleven decryptions wrong, once, in CI.)
        let residues_q = table_q.modulus.unpack(&c_q, exponents.len());
        let mut reduced_q = ctx.zero_lanes();
        ctx.pack(&residues_q.iter().collect::<Vec<_>>(), &mut reduced_q);
        // AMM(c, (q²)⁻¹·R) = c·(q²)⁻¹ mod p², in [0, 2p²): c_p < 2p² and r_q < q² < R/2,
        // so a·b/R < p² for both.
        let mut x = ctx.zero_lanes();
        let mut y = ctx.zero_lanes();
        ctx.mul_broadcast(&c_p, &self.inverse_r, &mut x);
        ctx.mul_broadcast(&reduced_q, &self.inverse_r, &mut y);
        let digits = ctx.digits;
        residues_q
            .into_iter()
            .enumerate()
            .map(|(lane, residue_q)| {
                // t = x − y in (−2p², 2p²), brought into [0, p²).
                let mut t = from_digit_fn(digits, |i| x[i * LANES + lane]) - from_digit_fn(digits, |i| y[i * LANES + lane]);
                if t < 0 {
                    t += &self.p_squared;
                    if t < 0 {
                        t += &self.p_squared;
                    }
                } else if t >= self.p_squared {
                    t -= &self.p_squared;
                }
                t *= &self.q_squared;
                t += residue_q;
                t
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modulus(bits: u32) -> Integer {
        (Integer::from(1) << (bits - 1)) + Integer::from(0x1234_5678_9abc_def1u64)
    }

    #[test]
    fn digits_round_trip() {
        let x = (Integer::from(1) << 2047u32) - Integer::from(977);
        assert_eq!(from_digits52(&to_digits52(&x, 40)), x);
        assert_eq!(from_digits52(&to_digits52(&x, 158)), x);
        assert_eq!(from_digits52(&to_digits52(&Integer::new(), 3)), 0);
    }

    #[test]
    fn lanes_multiply_like_gmp() {
        if !available() {
            return;
        }
        assert!(IfmaModulus::new(&modulus(8400)).is_none());
        assert!(IfmaModulus::new(&(modulus(2048) + 1u32)).is_none());
        for bits in [1024u32, 2048, 3072, 6144, 8192] {
            let m = modulus(bits);
            let ctx = IfmaModulus::new(&m).unwrap();
            let values: Vec<Integer> = (0..8u32).map(|i| (Integer::from(i + 3) << (bits - 10)) + i * 977).collect();
            let refs: Vec<&Integer> = values.iter().collect();
            let mut a = ctx.zero_lanes();
            ctx.enter(&refs, &mut a);
            let mut product = ctx.zero_lanes();
            ctx.mul(&a, &a, &mut product);
            let got = ctx.leave(&product, 8);
            for (v, g) in values.iter().zip(&got) {
                assert_eq!(*g, Integer::from(v * v) % &m, "bits {bits}");
            }
            ctx.square(&a, &mut product);
            assert_eq!(ctx.leave(&product, 8), got, "square, bits {bits}");
            let exponent = (Integer::from(1) << (bits / 2 - 1)) + Integer::from(0xfedc_ba98u32);
            for window in [1u32, 6, 8] {
                let table = IfmaTable::new(&m, &values[1], 300, window).unwrap();
                let mut exponents: Vec<Vec<u64>> =
                    (0..5u64).map(|i| vec![i.wrapping_mul(0x9e37_79b9_7f4a_7c15), i, 0, 0, i << 40]).collect();
                exponents.push(vec![u64::MAX, u64::MAX, u64::MAX, u64::MAX, (1u64 << 44) - 1]);
                let factors: Vec<Integer> = (0..6u32).map(|i| Integer::from(i + 1)).collect();
                let got = table.power_times(&exponents, &factors.iter().collect::<Vec<_>>());
                assert_eq!(got.len(), 6);
                for ((e, f), g) in exponents.iter().zip(&factors).zip(&got) {
                    let e = Integer::from_digits(e, Order::Lsf);
                    assert_eq!(*g, values[1].clone().pow_mod(&e, &m).unwrap() * f % &m, "table, bits {bits} window {window}");
                }
            }
            let powers = ctx.pow_shared_exponent(&refs, &exponent);
            for (v, g) in values.iter().zip(&powers) {
                assert_eq!(*g, v.clone().pow_mod(&exponent, &m).unwrap(), "bits {bits}");
            }
            // Short exponents (one window, a partial top window) and fewer than eight bases.
            for exponent in
                [Integer::new(), Integer::from(1), Integer::from(15), Integer::from(16), Integer::from(31), Integer::from(0x1_2345u32)]
            {
                let powers = ctx.pow_shared_exponent(&refs[..3], &exponent);
                assert_eq!(powers.len(), 3);
                for (v, g) in values.iter().zip(&powers) {
                    assert_eq!(*g, v.clone().pow_mod(&exponent, &m).unwrap(), "bits {bits} exponent {exponent}");
                }
            }
        }
    }

    /// Lane Garner against GMP's and against the definition, with p² > q² and
    /// p² < q² (the same key, primes swapped).
    #[test]
    fn crt_lanes_match_gmp_garner() {
        use crate::keys::DecryptionKey;
        use crate::table::BaseTable;
        if !available() {
            return;
        }
        let key = DecryptionKey::generate(2048).unwrap();
        let public = key.encryption_key().with_window(4).unwrap();
        let (p, q) = key.primes();
        for (first, second) in [(p, q), (q, p)] {
            let key = DecryptionKey::from_primes(first.clone(), second.clone(), Some(public.clone())).unwrap();
            let (table_p, table_q) = key.crt_tables().unwrap();
            let (BaseTable::Ifma(ifma_p), BaseTable::Ifma(ifma_q)) = (table_p, table_q) else { panic!("IFMA tables expected") };
            let crt = IfmaCrt::new(ifma_p, ifma_q, &key.secret.q_squared_inverse_mod_p_squared).unwrap();
            let mut exponents = crate::random::random_limbs_many(6, public.rand_bits()).unwrap();
            exponents.push(vec![0; exponents[0].len()]);
            // g = 1 + m·n for m = n − 1, n − 1001, …, and m = 0.
            let g: Vec<Integer> = (0..7u32)
                .map(|i| if i == 6 { Integer::from(1) } else { Integer::from(public.n() - (i * 1000 + 1)) * public.n() + 1u32 })
                .collect();
            let g_p: Vec<Integer> = g.iter().map(|v| Integer::from(v % table_p.modulus())).collect();
            let g_q: Vec<Integer> = g.iter().map(|v| Integer::from(v % table_q.modulus())).collect();
            let (g_p, g_q): (Vec<&Integer>, Vec<&Integer>) = (g_p.iter().collect(), g_q.iter().collect());
            let got = crt.power_times(ifma_p, ifma_q, &exponents, &g_p, &g_q);
            let c_p = table_p.power_times(&exponents, &g_p);
            let c_q = table_q.power_times(&exponents, &g_q);
            assert_eq!(got.len(), 7);
            for (i, c) in got.iter().enumerate() {
                assert_eq!(*c, key.combine_mod_n_squared(&c_p[i], &c_q[i]), "lane {i}");
                let exponent = Integer::from_digits(&exponents[i], Order::Lsf);
                let rho = public.h_s().clone().pow_mod(&exponent, public.n_squared()).unwrap();
                assert_eq!(*c, rho * &g[i] % public.n_squared(), "lane {i}");
            }
        }
    }

    /// A prime of `bits` bits whose two top bits are set: p² then fills its radix-2^52
    /// digits almost to the top, so lanes often end in [q², 2q²) (the case Garner must reduce).
    fn tight_prime(bits: u32, seed: u64) -> Integer {
        // A fixed pseudo-random pattern (splitmix64) below the two top bits.
        let mut state = seed;
        let limbs: Vec<u64> = (0..bits.div_ceil(64))
            .map(|_| {
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^ (z >> 31)
            })
            .collect();
        let mut x = Integer::from_digits(&limbs, Order::Lsf);
        x.keep_bits_mut(bits - 2);
        x |= Integer::from(3) << (bits - 2);
        x.next_prime()
    }

    #[test]
    fn key_holder_encryption_reduces_the_q_side_before_garner() {
        use crate::keys::DecryptionKey;
        use crate::ops::Randomizer;
        if !available() {
            return;
        }
        // 1039-bit primes: q² has 2078 bits in 40 digits (R = 2^2080), so about 6 % of the
        // lanes end above q². Before the fix those values decrypted wrong mod p.
        let (p, q) = (tight_prime(1039, 1), tight_prime(1039, 2));
        let key = DecryptionKey::from_primes(p, q, None).unwrap();
        let public = key.encryption_key();
        let plaintexts: Vec<Integer> = (1..=200u32).map(|i| (Integer::from(public.n()) >> 3u32) * i % public.n()).collect();
        let ciphertexts = key.encrypt_many(&plaintexts, Randomizer::FixedBase).unwrap();
        assert_eq!(key.decrypt_many(&ciphertexts).unwrap(), plaintexts);
    }
}

#[cfg(test)]
mod timing {
    use super::*;

    #[test]
    #[ignore = "timing probe: cargo test --release -- --ignored --nocapture"]
    fn probe() {
        assert!(available());
        let values: Vec<Integer> = (0..8u32).map(|i| (Integer::from(i + 3) << 2030u32) + i).collect();
        let refs: Vec<&Integer> = values.iter().collect();
        for bits in [2048u32, 4096] {
            let m = (Integer::from(1) << (bits - 1)) + Integer::from(0x1234_5678_9abc_def1u64);
            let ctx = IfmaModulus::new(&m).unwrap();
            let mut a = ctx.zero_lanes();
            ctx.enter(&refs, &mut a);
            let mut out = ctx.zero_lanes();
            let count = 20000;
            let start = std::time::Instant::now();
            for _ in 0..count {
                ctx.mul(&a, &a, &mut out);
            }
            let per = start.elapsed().as_secs_f64() / f64::from(count) / 8.0 * 1e6;
            let start = std::time::Instant::now();
            for _ in 0..count {
                ctx.square(&a, &mut out);
            }
            let per_square = start.elapsed().as_secs_f64() / f64::from(count) / 8.0 * 1e6;
            println!("8-lane AMM {bits}: {per:.3} us per lane-product, {per_square:.3} us per lane-squaring");
        }
        let m = (Integer::from(1) << 2047u32) + Integer::from(0x1234_5678_9abc_def1u64);
        let ctx = IfmaModulus::new(&m).unwrap();
        let exponent = (Integer::from(1) << 1023u32) + Integer::from(12345);
        let start = std::time::Instant::now();
        for _ in 0..20 {
            ctx.pow_shared_exponent(&refs, &exponent);
        }
        println!("pow 1024-bit exp, mod 2048: {:.1} us per lane", start.elapsed().as_secs_f64() / 20.0 / 8.0 * 1e6);
        for (bits, exp_bits) in [(2048u32, 1023u32), (3072, 1535), (4096, 2047)] {
            let m = (Integer::from(1) << (bits - 1)) + Integer::from(0x1234_5678_9abc_def1u64);
            let ctx = IfmaModulus::new(&m).unwrap();
            let exponent = (Integer::from(1) << exp_bits) + Integer::from(12345);
            for window in [3usize, 4, 5, 6] {
                let start = std::time::Instant::now();
                for _ in 0..10 {
                    ctx.pow_shared_exponent_window(&refs, &exponent, window);
                }
                println!("  D={} window {window}: {:.1} us per lane", ctx.digits, start.elapsed().as_secs_f64() / 10.0 / 8.0 * 1e6);
            }
        }
        let start = std::time::Instant::now();
        for _ in 0..40 {
            std::hint::black_box(values[0].clone().secure_pow_mod(&exponent, &m));
        }
        println!("gmp powm_sec: {:.1} us", start.elapsed().as_secs_f64() / 40.0 * 1e6);
    }
}
