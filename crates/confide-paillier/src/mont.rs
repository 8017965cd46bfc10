//! Montgomery multiplication over GMP's public `mpn` kernels.
//!
//! With R = 2^(64·L) for an L-limb odd modulus M, `mul(a, b) = a·b·R⁻¹ mod M`.
//! Elements kept in Montgomery form (x·R mod M) multiply without any division:
//! the product is one `mpn_mul_n`/`mpn_sqr` plus a word-by-word REDC built on
//! `mpn_addmul_1` (the same algorithm as GMP's internal `redc_1`). At 4096 bits
//! this is ~2x cheaper here than `mpz_mul` + `mpz_tdiv_r`, and it is what the
//! fixed-base tables multiply with. Timing depends on the operands only through
//! the final conditional subtraction; it is used for public exponents and for
//! the DJN exponent `a`, never for p, q or λ (those go through `mpz_powm_sec`).
#![allow(unsafe_code)]

use gmp_mpfr_sys::gmp;
use rug::integer::Order;
use rug::Integer;

/// A Montgomery context for one odd modulus.
#[derive(Clone)]
pub(crate) struct Montgomery {
    modulus: Vec<u64>,
    modulus_int: Integer,
    /// −M⁻¹ mod 2^64.
    neg_inv: u64,
    /// R² mod M, to enter Montgomery form with one multiplication.
    r_squared: Vec<u64>,
    /// R mod M = Montgomery form of 1.
    one: Vec<u64>,
}

/// Scratch space for one thread: a 2L-limb product buffer.
pub(crate) struct Scratch(Vec<u64>);

impl Montgomery {
    /// `modulus` must be odd and greater than 1 (callers guarantee it).
    pub(crate) fn new(modulus: &Integer) -> Self {
        let modulus_limbs: Vec<u64> = modulus.to_digits(Order::Lsf);
        let limbs = modulus_limbs.len();
        let m0 = modulus_limbs[0];
        // Newton iteration for m0⁻¹ mod 2^64: each step doubles the correct bits.
        let mut inverse: u64 = 1;
        for _ in 0..7 {
            inverse = inverse.wrapping_mul(2u64.wrapping_sub(m0.wrapping_mul(inverse)));
        }
        let r = Integer::from(1) << (64 * limbs as u32);
        let r_mod = Integer::from(&r % modulus);
        let r_squared = Integer::from(&r_mod * &r_mod) % modulus;
        Montgomery {
            neg_inv: inverse.wrapping_neg(),
            r_squared: pad(&r_squared, limbs),
            one: pad(&r_mod, limbs),
            modulus: modulus_limbs,
            modulus_int: modulus.clone(),
        }
    }

    pub(crate) fn limbs(&self) -> usize {
        self.modulus.len()
    }

    pub(crate) fn modulus(&self) -> &Integer {
        &self.modulus_int
    }

    pub(crate) fn scratch(&self) -> Scratch {
        Scratch(vec![0; 2 * self.limbs()])
    }

    /// Montgomery form of 1.
    pub(crate) fn one(&self) -> &[u64] {
        &self.one
    }

    /// x·R mod M for 0 ≤ x < M.
    pub(crate) fn to_mont(&self, x: &Integer, out: &mut [u64], scratch: &mut Scratch) {
        let plain = pad(x, self.limbs());
        self.mul(&plain, &self.r_squared, out, scratch);
    }

    /// x·R mod M for an x of at most L limbs that may exceed M (reduced first).
    pub(crate) fn to_mont_reduce(&self, x: &Integer, out: &mut [u64], scratch: &mut Scratch) {
        if x < &self.modulus_int {
            self.to_mont(x, out, scratch);
        } else {
            let reduced = Integer::from(x % &self.modulus_int);
            self.to_mont(&reduced, out, scratch);
        }
    }

    #[cfg(test)]
    /// Leaves Montgomery form: returns a·R⁻¹ mod M as an integer.
    pub(crate) fn to_normal(&self, a: &[u64], scratch: &mut Scratch) -> Integer {
        let limbs = self.limbs();
        let mut out = vec![0u64; limbs];
        scratch.0[..limbs].copy_from_slice(a);
        scratch.0[limbs..].fill(0);
        self.redc(&mut scratch.0, &mut out);
        Integer::from_digits(&out, Order::Lsf)
    }

    /// out = a·b·R⁻¹ mod M. All slices have exactly L limbs; a, b < M.
    pub(crate) fn mul(&self, a: &[u64], b: &[u64], out: &mut [u64], scratch: &mut Scratch) {
        let limbs = self.limbs();
        debug_assert!(a.len() == limbs && b.len() == limbs && out.len() == limbs);
        let size = limbs as gmp::size_t;
        // SAFETY: `scratch` has 2L limbs, `a` and `b` have L limbs each; GMP
        // writes exactly 2L limbs and does not keep the pointers.
        unsafe {
            if a.as_ptr() == b.as_ptr() {
                gmp::mpn_sqr(scratch.0.as_mut_ptr(), a.as_ptr(), size);
            } else {
                gmp::mpn_mul_n(scratch.0.as_mut_ptr(), a.as_ptr(), b.as_ptr(), size);
            }
        }
        self.redc(&mut scratch.0, out);
    }

    /// In-place square: a = a²·R⁻¹ mod M.
    pub(crate) fn square_in_place(&self, a: &mut [u64], scratch: &mut Scratch) {
        let copy = a.to_vec();
        self.mul(&copy, &copy, a, scratch);
    }

    /// REDC of a 2L-limb value t < M·R; result (< M) in `out`; t is clobbered.
    fn redc(&self, t: &mut [u64], out: &mut [u64]) {
        let limbs = self.limbs();
        let size = limbs as gmp::size_t;
        let modulus = self.modulus.as_ptr();
        // SAFETY: every pointer stays inside `t` (2L limbs), `out` or the
        // modulus (L limbs each): t.add(i) has at least L limbs for i < L.
        unsafe {
            let base = t.as_mut_ptr();
            for i in 0..limbs {
                let q = (*base.add(i)).wrapping_mul(self.neg_inv);
                // After this call limb i is zero; keep its carry-out there, to
                // be added at position i + L in one pass below.
                let carry = gmp::mpn_addmul_1(base.add(i), modulus, size, q);
                *base.add(i) = carry;
            }
            let carry = gmp::mpn_add_n(out.as_mut_ptr(), base.add(limbs), base, size);
            if carry != 0 || gmp::mpn_cmp(out.as_ptr(), modulus, size) >= 0 {
                gmp::mpn_sub_n(out.as_mut_ptr(), out.as_ptr(), modulus, size);
            }
        }
    }
}

/// Little-endian limbs of x, zero-padded to `limbs` (x must fit).
pub(crate) fn pad(x: &Integer, limbs: usize) -> Vec<u64> {
    let mut digits: Vec<u64> = x.to_digits(Order::Lsf);
    digits.resize(limbs, 0);
    digits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn montgomery_product_matches_mpz() {
        let modulus = (Integer::from(1) << 4095u32) + Integer::from(12345);
        let mont = Montgomery::new(&modulus);
        let mut scratch = mont.scratch();
        let a = (Integer::from(3) << 4000u32) + 17;
        let b = (Integer::from(5) << 3000u32) + 99;
        let mut am = vec![0; mont.limbs()];
        let mut bm = vec![0; mont.limbs()];
        let mut product = vec![0; mont.limbs()];
        mont.to_mont(&a, &mut am, &mut scratch);
        mont.to_mont(&b, &mut bm, &mut scratch);
        mont.mul(&am, &bm, &mut product, &mut scratch);
        let got = mont.to_normal(&product, &mut scratch);
        assert_eq!(got, Integer::from(&a * &b) % &modulus);
        mont.square_in_place(&mut am, &mut scratch);
        assert_eq!(mont.to_normal(&am, &mut scratch), Integer::from(&a * &a) % &modulus);
    }
}
