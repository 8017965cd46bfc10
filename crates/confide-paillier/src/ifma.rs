//! 8-lane Montgomery arithmetic with AVX-512 IFMA (`vpmadd52luq`/`vpmadd52huq`).
//!
//! Eight numbers modulo one odd modulus M are held digit-interleaved in radix
//! 2^52: vector i holds digit i of all eight lanes. With R = 2^(52·D) > 4M, the
//! "almost Montgomery" product AMM(a, b) = a·b·R⁻¹ mod M lies in [0, 2M) for
//! inputs in [0, 2M) and needs no final subtraction, so it runs in constant time
//! and chains freely. This is the parallel Montgomery arithmetic of FLBooster
//! (seed 002) on a CPU's SIMD units instead of a GPU: at 2048 bits one 8-lane
//! product costs about as much as two scalar GMP products.
//!
//! Used for CRT decryption (c^(p−1) mod p², exponent the same in all lanes,
//! fixed window, table entries chosen by a masked scan of all entries) and for
//! fixed-base table encryption. Selected at run time; without IFMA the GMP path runs.
#![allow(unsafe_code)]

use rug::integer::Order;
use rug::Integer;
use std::arch::x86_64::{
    _mm512_add_epi64, _mm512_and_si512, _mm512_cmpeq_epi64_mask, _mm512_loadu_si512, _mm512_madd52hi_epu64, _mm512_madd52lo_epu64,
    _mm512_mask_blend_epi64, _mm512_set1_epi64, _mm512_setzero_si512, _mm512_srli_epi64, _mm512_storeu_si512,
};

/// Lanes per vector.
pub(crate) const LANES: usize = 8;
const DIGIT_BITS: u32 = 52;
const MASK: u64 = (1u64 << DIGIT_BITS) - 1;
/// Largest modulus, in radix-2^52 digits, the engine takes: n² of a 4096-bit key
/// (8192 bits → 158 digits). Accumulators then stay below 4·160·2^52 < 2^62.
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

/// Radix-2^52 digits of x (at most `digits` of them, zero-padded).
pub(crate) fn to_digits52(x: &Integer, digits: usize) -> Vec<u64> {
    let limbs: Vec<u64> = x.to_digits(Order::Lsf);
    let mut out = vec![0u64; digits];
    for (i, slot) in out.iter_mut().enumerate() {
        let bit = i * DIGIT_BITS as usize;
        let word = bit / 64;
        let shift = bit % 64;
        if word >= limbs.len() {
            break;
        }
        let mut value = limbs[word] >> shift;
        if shift + DIGIT_BITS as usize > 64 && word + 1 < limbs.len() {
            value |= limbs[word + 1] << (64 - shift);
        }
        *slot = value & MASK;
    }
    out
}

/// Integer from normalized radix-2^52 digits.
pub(crate) fn from_digits52(digits: &[u64]) -> Integer {
    let bits = digits.len() * DIGIT_BITS as usize;
    let mut limbs = vec![0u64; bits.div_ceil(64) + 1];
    for (i, &d) in digits.iter().enumerate() {
        let bit = i * DIGIT_BITS as usize;
        let word = bit / 64;
        let shift = bit % 64;
        limbs[word] |= d << shift;
        if shift + DIGIT_BITS as usize > 64 {
            limbs[word + 1] |= d >> (64 - shift);
        }
    }
    Integer::from_digits(&limbs, Order::Lsf)
}

/// Digits of eight lanes, interleaved: out[i·8 + l] = digit i of lane l.
pub(crate) type Lanes = Vec<u64>;

/// An odd modulus prepared for 8-lane AMM.
pub(crate) struct IfmaModulus {
    digits: usize,
    modulus: Integer,
    /// Modulus digits broadcast to all lanes.
    modulus_lanes: Lanes,
    /// −M⁻¹ mod 2^52.
    neg_inverse: u64,
    /// R² mod M, broadcast (enters Montgomery form with one AMM).
    r_squared: Lanes,
    /// 1, broadcast (leaves Montgomery form with one AMM).
    unit: Lanes,
    /// R mod M, broadcast: Montgomery form of 1.
    one: Lanes,
}

fn broadcast(digits: &[u64]) -> Lanes {
    digits.iter().flat_map(|&d| [d; LANES]).collect()
}

impl IfmaModulus {
    /// Prepares M (odd, > 1). R = 2^(52·D) with D chosen so that R > 4M.
    /// `None` when M needs more than `MAX_DIGITS` digits (callers use GMP then).
    pub(crate) fn new(modulus: &Integer) -> Option<Self> {
        let digits = (modulus.significant_bits() as usize + 2).div_ceil(DIGIT_BITS as usize);
        if digits > MAX_DIGITS {
            return None;
        }
        let m0 = modulus.to_digits::<u64>(Order::Lsf)[0] & MASK;
        let mut inverse: u64 = 1;
        for _ in 0..6 {
            inverse = inverse.wrapping_mul(2u64.wrapping_sub(m0.wrapping_mul(inverse)));
        }
        let r = Integer::from(1) << (digits as u32 * DIGIT_BITS);
        let r_mod = Integer::from(&r % modulus);
        let r_squared = Integer::from(&r_mod * &r_mod) % modulus;
        Some(IfmaModulus {
            digits,
            modulus_lanes: broadcast(&to_digits52(modulus, digits)),
            modulus: modulus.clone(),
            neg_inverse: inverse.wrapping_neg() & MASK,
            r_squared: broadcast(&to_digits52(&r_squared, digits)),
            unit: broadcast(&to_digits52(&Integer::from(1), digits)),
            one: broadcast(&to_digits52(&r_mod, digits)),
        })
    }

    pub(crate) fn zero_lanes(&self) -> Lanes {
        vec![0u64; self.digits * LANES]
    }

    /// Interleaves up to eight values (< M) into lanes; missing lanes get 1.
    pub(crate) fn pack(&self, values: &[&Integer]) -> Lanes {
        let mut out = self.zero_lanes();
        for lane in 0..LANES {
            let digits = match values.get(lane) {
                Some(v) => to_digits52(v, self.digits),
                None => to_digits52(&Integer::from(1), self.digits),
            };
            for (i, d) in digits.iter().enumerate() {
                out[i * LANES + lane] = *d;
            }
        }
        out
    }

    /// Lanes → integers fully reduced into [0, M) (inputs in [0, 2M)).
    pub(crate) fn unpack(&self, lanes: &Lanes, count: usize) -> Vec<Integer> {
        (0..count)
            .map(|lane| {
                let digits: Vec<u64> = (0..self.digits).map(|i| lanes[i * LANES + lane]).collect();
                let mut value = from_digits52(&digits);
                if value >= self.modulus {
                    value -= &self.modulus;
                }
                value
            })
            .collect()
    }

    /// out = AMM(a, b) = a·b·R⁻¹ mod M, in [0, 2M), for a, b in [0, 2M) with normalized digits.
    pub(crate) fn mul(&self, a: &Lanes, b: &Lanes, out: &mut Lanes) {
        debug_assert!(a.len() == self.digits * LANES && b.len() == a.len() && out.len() == a.len());
        // SAFETY: callers only construct IfmaModulus after `available()` returned true
        // (checked in the public entry points), and every slice has D·8 elements.
        unsafe { amm(a, b, &self.modulus_lanes, self.neg_inverse, self.digits, out) }
    }

    /// x·R mod M (Montgomery form) of packed lanes.
    pub(crate) fn to_mont(&self, lanes: &Lanes) -> Lanes {
        let mut out = self.zero_lanes();
        self.mul(lanes, &self.r_squared, &mut out);
        out
    }

    /// Leaves Montgomery form.
    pub(crate) fn to_normal(&self, lanes: &Lanes) -> Lanes {
        let mut out = self.zero_lanes();
        self.mul(lanes, &self.unit, &mut out);
        out
    }

    /// base^exponent mod M for up to eight bases sharing one (secret) exponent.
    /// Fixed 5-bit windows, every table entry read for every window (masked
    /// select), no data-dependent branches: constant time in base and exponent.
    pub(crate) fn pow_shared_exponent(&self, bases: &[&Integer], exponent: &Integer) -> Vec<Integer> {
        const WINDOW: usize = 5;
        let base = self.to_mont(&self.pack(bases));
        let mut table = Vec::with_capacity(1 << WINDOW);
        table.push(self.one.clone());
        table.push(base.clone());
        for k in 2..(1 << WINDOW) {
            let mut next = self.zero_lanes();
            self.mul(&table[k - 1], &base, &mut next);
            table.push(next);
        }
        let bits = exponent.significant_bits() as usize;
        let windows = bits.div_ceil(WINDOW).max(1);
        let mut acc = self.one.clone();
        let mut tmp = self.zero_lanes();
        let mut selected = self.zero_lanes();
        for w in (0..windows).rev() {
            for _ in 0..WINDOW {
                self.mul(&acc, &acc, &mut tmp);
                std::mem::swap(&mut acc, &mut tmp);
            }
            let mut digit = 0usize;
            for b in 0..WINDOW {
                digit |= usize::from(exponent.get_bit((w * WINDOW + b) as u32)) << b;
            }
            // SAFETY: as in `mul`; all tables have D·8 elements.
            unsafe { select(&table, digit as u64, &mut selected) };
            self.mul(&acc, &selected, &mut tmp);
            std::mem::swap(&mut acc, &mut tmp);
        }
        self.unpack(&self.to_normal(&acc), bases.len())
    }
}

/// out = table[index], reading every entry (constant time in `index`).
#[target_feature(enable = "avx512f")]
unsafe fn select(table: &[Lanes], index: u64, out: &mut Lanes) {
    let wanted = _mm512_set1_epi64(index as i64);
    for chunk in 0..out.len() / LANES {
        let mut value = _mm512_setzero_si512();
        for (k, entry) in table.iter().enumerate() {
            let mask = _mm512_cmpeq_epi64_mask(_mm512_set1_epi64(k as i64), wanted);
            let candidate = _mm512_loadu_si512(entry.as_ptr().add(chunk * LANES).cast());
            value = _mm512_mask_blend_epi64(mask, value, candidate);
        }
        _mm512_storeu_si512(out.as_mut_ptr().add(chunk * LANES).cast(), value);
    }
}

/// Word-serial almost-Montgomery multiplication (operand scanning) on 8 lanes.
/// Accumulators are 64-bit: absolute digit k receives at most 4·D products'
/// 52-bit halves plus carries (< 2^60.4 for D ≤ 80) before the final carry
/// pass, so nothing overflows.
#[target_feature(enable = "avx512f,avx512ifma")]
unsafe fn amm(a: &[u64], b: &[u64], modulus: &[u64], neg_inverse: u64, digits: usize, out: &mut [u64]) {
    // IfmaModulus::new refuses larger moduli; `t` below is sized for MAX_DIGITS.
    debug_assert!(digits <= MAX_DIGITS);
    let mask = _mm512_set1_epi64(MASK as i64);
    let m_prime = _mm512_set1_epi64(neg_inverse as i64);
    let zero = _mm512_setzero_si512();
    let a = a.as_ptr();
    let b = b.as_ptr();
    let modulus = modulus.as_ptr();
    let mut t = [zero; 2 * MAX_DIGITS + 1];
    let t = t.as_mut_ptr();
    for i in 0..digits {
        let a_i = _mm512_loadu_si512(a.add(i * LANES).cast());
        let row = t.add(i);
        for j in 0..digits {
            let b_j = _mm512_loadu_si512(b.add(j * LANES).cast());
            *row.add(j) = _mm512_madd52lo_epu64(*row.add(j), a_i, b_j);
            *row.add(j + 1) = _mm512_madd52hi_epu64(*row.add(j + 1), a_i, b_j);
        }
        // q = t_i · (−M⁻¹) mod 2^52 makes t_i + q·M ≡ 0 (mod 2^52).
        let q = _mm512_madd52lo_epu64(zero, *row, m_prime);
        for j in 0..digits {
            let m_j = _mm512_loadu_si512(modulus.add(j * LANES).cast());
            *row.add(j) = _mm512_madd52lo_epu64(*row.add(j), q, m_j);
            *row.add(j + 1) = _mm512_madd52hi_epu64(*row.add(j + 1), q, m_j);
        }
        // Digit i is now 0 mod 2^52: its carry moves up to digit i + 1.
        *row.add(1) = _mm512_add_epi64(*row.add(1), _mm512_srli_epi64(*row, DIGIT_BITS));
    }
    // The result is t[D..2D]; propagate carries so every digit is < 2^52 again.
    let mut carry = zero;
    for j in 0..digits {
        let value = _mm512_add_epi64(*t.add(digits + j), carry);
        carry = _mm512_srli_epi64(value, DIGIT_BITS);
        _mm512_storeu_si512(out.as_mut_ptr().add(j * LANES).cast(), _mm512_and_si512(value, mask));
    }
}

/// A fixed-base table (algorithms.md §1.5) in AMM Montgomery form, evaluated
/// for eight different exponents at once: per row, each lane's entry is copied
/// into one interleaved operand and a single 8-lane product follows.
pub(crate) struct IfmaTable {
    modulus: IfmaModulus,
    window: u32,
    rows: usize,
    one_digits: Vec<u64>,
    entries: Vec<u64>,
}

impl IfmaTable {
    /// Table of `base` mod M for exponents of at most `max_bits` bits (rows in parallel).
    /// `None` when the modulus is too large for the engine.
    pub(crate) fn new(modulus: &Integer, base: &Integer, max_bits: u32, window: u32) -> Option<Self> {
        use rayon::prelude::*;
        let context = IfmaModulus::new(modulus)?;
        let digits = context.digits;
        let shift = digits as u32 * DIGIT_BITS;
        let rows = max_bits.div_ceil(window) as usize;
        let per_row = (1usize << window) - 1;
        let mut row_bases = Vec::with_capacity(rows);
        let mut current = Integer::from(base % modulus);
        let step = Integer::from(1) << window;
        for _ in 0..rows {
            row_bases.push(current.clone());
            current = current.pow_mod(&step, modulus).unwrap_or_default();
        }
        let mut entries = vec![0u64; rows * per_row * digits];
        entries.par_chunks_mut(per_row * digits).zip(row_bases.par_iter()).for_each(|(row, row_base)| {
            let mut power = row_base.clone();
            for d in 0..per_row {
                let montgomery = Integer::from(&power << shift) % modulus;
                row[d * digits..(d + 1) * digits].copy_from_slice(&to_digits52(&montgomery, digits));
                power *= row_base;
                power %= modulus;
            }
        });
        let r_mod = (Integer::from(1) << shift) % modulus;
        Some(IfmaTable { one_digits: to_digits52(&r_mod, digits), modulus: context, window, rows, entries })
    }

    pub(crate) fn size_bytes(&self) -> usize {
        self.entries.len() * 8
    }

    pub(crate) fn modulus(&self) -> &Integer {
        &self.modulus.modulus
    }

    /// factor_i · B^(exponent_i) mod M, fully reduced, for up to eight pairs.
    /// Exponents are little-endian u64 limbs; factors must be < M.
    pub(crate) fn power_times(&self, exponents: &[Vec<u64>], factors: &[&Integer]) -> Vec<Integer> {
        let digits = self.modulus.digits;
        let per_row = (1usize << self.window) - 1;
        let mut acc = self.modulus.one.clone();
        let mut gathered = self.modulus.zero_lanes();
        let mut tmp = self.modulus.zero_lanes();
        for row in 0..self.rows {
            for lane in 0..LANES {
                let digit =
                    exponents.get(lane).map_or(0, |e| crate::table::extract_bits(e, row * self.window as usize, self.window as usize));
                let source = if digit == 0 {
                    &self.one_digits[..]
                } else {
                    let offset = (row * per_row + digit as usize - 1) * digits;
                    &self.entries[offset..offset + digits]
                };
                for (i, value) in source.iter().enumerate() {
                    gathered[i * LANES + lane] = *value;
                }
            }
            self.modulus.mul(&acc, &gathered, &mut tmp);
            std::mem::swap(&mut acc, &mut tmp);
        }
        // (B^a·R)·f·R⁻¹ = B^a·f: multiplying by the normal-form factor leaves Montgomery form.
        let factors = self.modulus.pack(factors);
        self.modulus.mul(&acc, &factors, &mut tmp);
        self.modulus.unpack(&tmp, exponents.len())
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
    }

    #[test]
    fn lanes_multiply_like_gmp() {
        if !available() {
            return;
        }
        assert!(IfmaModulus::new(&modulus(8400)).is_none());
        for bits in [1024u32, 2048, 3072, 6144, 8192] {
            let m = modulus(bits);
            let ctx = IfmaModulus::new(&m).unwrap();
            let values: Vec<Integer> = (0..8u32).map(|i| (Integer::from(i + 3) << (bits - 10)) + i * 977).collect();
            let refs: Vec<&Integer> = values.iter().collect();
            let a = ctx.to_mont(&ctx.pack(&refs));
            let mut product = ctx.zero_lanes();
            ctx.mul(&a, &a, &mut product);
            let got = ctx.unpack(&ctx.to_normal(&product), 8);
            for (v, g) in values.iter().zip(&got) {
                assert_eq!(*g, Integer::from(v * v) % &m, "bits {bits}");
            }
            let exponent = (Integer::from(1) << (bits / 2 - 1)) + Integer::from(0xfedc_ba98u32);
            let table = IfmaTable::new(&m, &values[1], 300, 6).unwrap();
            let exponents: Vec<Vec<u64>> = (0..5u64).map(|i| vec![i * 0x9e37_79b9_7f4a_7c15, i, 0, 0, i << 40]).collect();
            let factors: Vec<Integer> = (0..5u32).map(|i| Integer::from(i + 1)).collect();
            let got = table.power_times(&exponents, &factors.iter().collect::<Vec<_>>());
            for ((e, f), g) in exponents.iter().zip(&factors).zip(&got) {
                let e = Integer::from_digits(e, Order::Lsf);
                assert_eq!(*g, values[1].clone().pow_mod(&e, &m).unwrap() * f % &m, "table, bits {bits}");
            }
            let powers = ctx.pow_shared_exponent(&refs, &exponent);
            for (v, g) in values.iter().zip(&powers) {
                assert_eq!(*g, v.clone().pow_mod(&exponent, &m).unwrap(), "bits {bits}");
            }
        }
    }
}

#[cfg(test)]
mod timing {
    use super::*;

    #[test]
    #[ignore = "timing probe: cargo test --release -- --ignored --nocapture"]
    fn probe() {
        assert!(available());
        let m = (Integer::from(1) << 2047u32) + Integer::from(0x1234_5678_9abc_def1u64);
        let ctx = IfmaModulus::new(&m).unwrap();
        let values: Vec<Integer> = (0..8u32).map(|i| (Integer::from(i + 3) << 2030u32) + i).collect();
        let refs: Vec<&Integer> = values.iter().collect();
        let a = ctx.to_mont(&ctx.pack(&refs));
        let mut out = ctx.zero_lanes();
        let start = std::time::Instant::now();
        for _ in 0..20000 {
            ctx.mul(&a, &a, &mut out);
        }
        println!("8-lane AMM 2048: {:.3} us per lane-product", start.elapsed().as_secs_f64() / 20000.0 / 8.0 * 1e6);
        let exponent = (Integer::from(1) << 1023u32) + Integer::from(12345);
        let start = std::time::Instant::now();
        for _ in 0..20 {
            ctx.pow_shared_exponent(&refs, &exponent);
        }
        println!("pow 1024-bit exp, mod 2048: {:.1} us per lane", start.elapsed().as_secs_f64() / 20.0 / 8.0 * 1e6);
        let start = std::time::Instant::now();
        for _ in 0..40 {
            std::hint::black_box(values[0].clone().secure_pow_mod(&exponent, &m));
        }
        println!("gmp powm_sec: {:.1} us", start.elapsed().as_secs_f64() / 40.0 * 1e6);
        let m4 = (Integer::from(1) << 4095u32) + Integer::from(0x1234_5678_9abc_def1u64);
        let ctx4 = IfmaModulus::new(&m4).unwrap();
        let a4 = ctx4.to_mont(&ctx4.pack(&refs));
        let mut out4 = ctx4.zero_lanes();
        let start = std::time::Instant::now();
        for _ in 0..5000 {
            ctx4.mul(&a4, &a4, &mut out4);
        }
        println!("8-lane AMM 4096: {:.3} us per lane-product", start.elapsed().as_secs_f64() / 5000.0 / 8.0 * 1e6);
    }
}
