//! Fixed-base windowed ("stair") exponentiation, algorithms.md §1.5.
//!
//! For a base B, window w and exponents of at most ℓ bits, row j holds
//! `T[j][d] = B^(d·2^(w·j))` for d = 1 … 2^w − 1, in Montgomery form. Then
//! `B^a = Π_{j: a_j ≠ 0} T[j][a_j]` for the base-2^w digits a_j of a:
//! at most ⌈ℓ/w⌉ multiplications and no squarings.
//! Memory: ⌈ℓ/w⌉·(2^w − 1) entries of L limbs (2048-bit n, w = 8: 16 MiB).

use crate::error::{invalid, Result};
use crate::mont::{pad, Montgomery, Scratch};
use rayon::prelude::*;
use rug::integer::Order;
use rug::Integer;

/// A fixed-base table on the fastest engine this CPU has: 8-lane AVX-512 IFMA
/// when available, GMP `mpn` Montgomery products otherwise.
pub(crate) enum BaseTable {
    Gmp(FixedBaseTable),
    #[cfg(target_arch = "x86_64")]
    Ifma(crate::ifma::IfmaTable),
}

impl BaseTable {
    pub(crate) fn new(modulus: &Integer, base: &Integer, max_bits: u32, window: u32) -> Result<Self> {
        if !(1..=16).contains(&window) {
            return Err(invalid("window", format!("must be in 1..=16, got {window}")));
        }
        #[cfg(target_arch = "x86_64")]
        if crate::ifma::available() {
            if let Some(table) = crate::ifma::IfmaTable::new(modulus, base, max_bits, window) {
                return Ok(BaseTable::Ifma(table));
            }
        }
        Ok(BaseTable::Gmp(FixedBaseTable::new(Montgomery::new(modulus), base, max_bits, window)?))
    }

    pub(crate) fn size_bytes(&self) -> usize {
        match self {
            BaseTable::Gmp(t) => t.size_bytes(),
            #[cfg(target_arch = "x86_64")]
            BaseTable::Ifma(t) => t.size_bytes(),
        }
    }

    pub(crate) fn modulus(&self) -> &Integer {
        match self {
            BaseTable::Gmp(t) => t.montgomery().modulus(),
            #[cfg(target_arch = "x86_64")]
            BaseTable::Ifma(t) => t.modulus(),
        }
    }

    /// factor_i · B^(exponent_i) mod M for every i (factors < M), fully reduced.
    /// IFMA evaluates eight at a time, so callers pass chunks of 8 where they can.
    pub(crate) fn power_times(&self, exponents: &[Vec<u64>], factors: &[&Integer]) -> Vec<Integer> {
        match self {
            BaseTable::Gmp(table) => {
                let mont = table.montgomery();
                let mut scratch = mont.scratch();
                let mut rho = vec![0u64; mont.limbs()];
                let mut out = vec![0u64; mont.limbs()];
                exponents
                    .iter()
                    .zip(factors)
                    .map(|(exponent, factor)| {
                        table.pow_mont(exponent, &mut rho, &mut scratch);
                        // (ρR)·f·R⁻¹ = ρ·f: the normal-form factor leaves Montgomery form.
                        mont.mul(&rho, &pad(factor, mont.limbs()), &mut out, &mut scratch);
                        Integer::from_digits(&out, Order::Lsf)
                    })
                    .collect()
            }
            #[cfg(target_arch = "x86_64")]
            BaseTable::Ifma(table) => exponents
                .chunks(crate::ifma::LANES)
                .zip(factors.chunks(crate::ifma::LANES))
                .flat_map(|(e, f)| table.power_times(e, f))
                .collect(),
        }
    }
}

/// Precomputed powers of one fixed base modulo one modulus.
pub(crate) struct FixedBaseTable {
    mont: Montgomery,
    window: u32,
    rows: usize,
    entries: Vec<u64>,
}

impl FixedBaseTable {
    /// Builds the table for exponents of up to `max_bits` bits (rows built in parallel).
    pub(crate) fn new(mont: Montgomery, base: &Integer, max_bits: u32, window: u32) -> Result<Self> {
        if !(1..=16).contains(&window) {
            return Err(invalid("window", format!("must be in 1..=16, got {window}")));
        }
        let limbs = mont.limbs();
        let rows = max_bits.div_ceil(window) as usize;
        let per_row = (1usize << window) - 1;
        let mut scratch = mont.scratch();
        // Row bases B^(2^(w·j)), by w squarings each (sequential, cheap).
        let mut row_bases = Vec::with_capacity(rows);
        let mut current = vec![0u64; limbs];
        mont.to_mont_reduce(base, &mut current, &mut scratch);
        for _ in 0..rows {
            row_bases.push(current.clone());
            for _ in 0..window {
                mont.square_in_place(&mut current, &mut scratch);
            }
        }
        let mut entries = vec![0u64; rows * per_row * limbs];
        entries.par_chunks_mut(per_row * limbs).zip(row_bases.par_iter()).for_each(|(row, row_base)| {
            let mut scratch = mont.scratch();
            row[..limbs].copy_from_slice(row_base);
            for d in 1..per_row {
                let (done, rest) = row.split_at_mut(d * limbs);
                mont.mul(&done[(d - 1) * limbs..], row_base, &mut rest[..limbs], &mut scratch);
            }
        });
        Ok(FixedBaseTable { mont, window, rows, entries })
    }

    pub(crate) fn montgomery(&self) -> &Montgomery {
        &self.mont
    }

    /// Table size in bytes.
    pub(crate) fn size_bytes(&self) -> usize {
        self.entries.len() * 8
    }

    /// out = B^a in Montgomery form, for `exponent` given as little-endian u64 limbs.
    /// Exponent bits beyond `max_bits()` must be zero (checked by callers).
    pub(crate) fn pow_mont(&self, exponent: &[u64], out: &mut [u64], scratch: &mut Scratch) {
        let limbs = self.mont.limbs();
        let per_row = (1usize << self.window) - 1;
        let mut started = false;
        let mut tmp = vec![0u64; limbs];
        for row in 0..self.rows {
            let digit = extract_bits(exponent, row * self.window as usize, self.window as usize);
            if digit == 0 {
                continue;
            }
            let offset = (row * per_row + digit as usize - 1) * limbs;
            let entry = &self.entries[offset..offset + limbs];
            if started {
                self.mont.mul(out, entry, &mut tmp, scratch);
                out.copy_from_slice(&tmp);
            } else {
                out.copy_from_slice(entry);
                started = true;
            }
        }
        if !started {
            out.copy_from_slice(self.mont.one());
        }
    }
}

/// Bits [start, start + width) of a little-endian limb array (width ≤ 16).
pub(crate) fn extract_bits(limbs: &[u64], start: usize, width: usize) -> u64 {
    let word = start / 64;
    let shift = start % 64;
    if word >= limbs.len() {
        return 0;
    }
    let mut value = limbs[word] >> shift;
    if shift + width > 64 && word + 1 < limbs.len() {
        value |= limbs[word + 1] << (64 - shift);
    }
    value & ((1u64 << width) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rug::integer::Order;

    #[test]
    fn table_power_matches_pow_mod() {
        let modulus = (Integer::from(1) << 1023u32) + Integer::from(4711);
        let base = Integer::from(123_456_789u64);
        for window in [1u32, 4, 7, 8] {
            let table = FixedBaseTable::new(Montgomery::new(&modulus), &base, 300, window).unwrap();
            let mut scratch = table.montgomery().scratch();
            for exponent in [Integer::from(0), Integer::from(1), (Integer::from(1) << 299u32) - 1, Integer::from(0xdead_beefu64) << 170u32]
            {
                let mut out = vec![0; table.montgomery().limbs()];
                let digits: Vec<u64> = exponent.to_digits(Order::Lsf);
                table.pow_mont(&digits, &mut out, &mut scratch);
                let got = table.montgomery().to_normal(&out, &mut scratch);
                let want = base.clone().pow_mod(&exponent, &modulus).unwrap();
                assert_eq!(got, want, "window {window}");
            }
        }
    }

    #[test]
    fn extract_bits_spans_limbs() {
        let limbs = [0xF000_0000_0000_0000u64, 0x3];
        assert_eq!(extract_bits(&limbs, 60, 6), 0x3F);
        assert_eq!(extract_bits(&limbs, 62, 8), 0xF);
        assert_eq!(extract_bits(&limbs, 200, 8), 0);
    }
}
