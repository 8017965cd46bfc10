//! t-of-m Shamir sharing of a key polynomial over `Z_q`, coefficient by coefficient.
//!
//! Party `i` shares its round key `s_i` among the `m` parties (points `1..=m`); party `j` adds the
//! shares it received from the parties whose ciphertexts made the sum, which gives its share of the
//! key sum (Shamir is linear); any `t` such summed shares rebuild the key sum and nothing else (the
//! sum, not any one key, while fewer than `t` parties pool what they received). The arithmetic on
//! shares is constant-time (`mul_mod` reduces with the modulus' special form, no division).

#[cfg(test)]
use rand_core::SeedableRng;

use crate::{add_mod, lift, KeySum, LatticeError, SecretKey, Q};
use rand_core::{CryptoRng, RngCore};

/// `2^62 mod q`: `q = 2^62 - 18 * 2^32 + 1`.
const FOLD: u128 = 18 * (1 << 32) - 1;

/// `a * b mod q` for `a, b < q`, constant-time: `2^62 = 18 * 2^32 - 1 (mod q)` folds the product.
///
/// Each fold maps `v` to `(v >> 62) * FOLD + (v mod 2^62)`; from below `2^124` five folds bring it
/// below `2^62` (bounds `2^99`, `2^74`, `2^62 + 2^50`, `2^62 + 2^37`, then `2^62`), and one
/// subtraction, selected without a branch, below `q`.
pub(crate) fn mul_mod(a: u64, b: u64) -> u64 {
    let x = a as u128 * b as u128; // < 2^124
    let mask62 = (1u128 << 62) - 1;
    let fold = |v: u128| (v >> 62) * FOLD + (v & mask62);
    let y = fold(fold(fold(fold(fold(x))))) as u64;
    let reduced = y.wrapping_sub(Q);
    let wrapped = ((reduced as i64) >> 63) as u64; // all ones when y < q
    (y & wrapped) | (reduced & !wrapped)
}

fn pow_mod(mut base: u64, mut exponent: u64) -> u64 {
    let mut out = 1u64;
    while exponent > 0 {
        if exponent & 1 == 1 {
            out = mul_mod(out, base);
        }
        base = mul_mod(base, base);
        exponent >>= 1;
    }
    out
}

fn uniform<R: RngCore + CryptoRng>(rng: &mut R) -> u64 {
    loop {
        let v = rng.next_u64() >> 2; // < 2^62: rejection below q almost never repeats
        if v < Q {
            return v;
        }
    }
}

/// Shares of ``key`` for the points `1..=parties`, any ``threshold`` of which rebuild it.
pub fn share_key<R: RngCore + CryptoRng>(
    key: &SecretKey,
    threshold: usize,
    parties: usize,
    rng: &mut R,
) -> Result<Vec<Vec<u64>>, LatticeError> {
    if threshold < 1 || threshold > parties || parties > 65_535 {
        return Err(LatticeError::Threshold { threshold, parties });
    }
    let n = key.coefficients().len();
    let mut shares = vec![vec![0u64; n]; parties];
    let mut polynomial = vec![0u64; threshold];
    for (c, &coefficient) in key.coefficients().iter().enumerate() {
        polynomial[0] = lift(coefficient);
        for r in polynomial.iter_mut().skip(1) {
            *r = uniform(rng);
        }
        for (j, share) in shares.iter_mut().enumerate() {
            let x = (j + 1) as u64;
            // Horner: f(x) = p0 + x (p1 + x (p2 + ...))
            let mut value = 0u64;
            for &p in polynomial.iter().rev() {
                value = add_mod(mul_mod(value, x), p);
            }
            share[c] = value;
        }
    }
    polynomial.iter_mut().for_each(|v| *v = 0);
    Ok(shares)
}

/// The key sum of ``parties`` keys from the summed shares of the points ``points`` (1-based).
///
/// Lagrange interpolation at 0 over the given points (at least the threshold, distinct); the
/// result's coefficients are centred (a sum of `parties` ternary keys lies in `[-parties, parties]`).
pub fn reconstruct_key_sum(points: &[u64], shares: &[&[u64]], parties: usize) -> Result<KeySum, LatticeError> {
    if points.is_empty() || points.len() != shares.len() {
        return Err(LatticeError::Points(format!("{} points for {} shares", points.len(), shares.len())));
    }
    for (i, &p) in points.iter().enumerate() {
        if p == 0 || p >= Q || points[..i].contains(&p) {
            return Err(LatticeError::Points(format!("point {p} is zero, too large or repeated")));
        }
    }
    let n = shares[0].len();
    if let Some(bad) = shares.iter().find(|s| s.len() != n) {
        return Err(LatticeError::Length { what: "a share", got: bad.len(), expected: n });
    }
    let weights: Vec<u64> = points
        .iter()
        .map(|&xj| {
            let (mut num, mut den) = (1u64, 1u64);
            for &xk in points.iter().filter(|&&xk| xk != xj) {
                num = mul_mod(num, xk);
                den = mul_mod(den, add_mod(xk, Q - xj));
            }
            mul_mod(num, pow_mod(den, Q - 2))
        })
        .collect();
    let half = Q / 2;
    let coefficients = (0..n)
        .map(|c| {
            let v = shares.iter().zip(&weights).fold(0u64, |acc, (s, &w)| add_mod(acc, mul_mod(s[c], w)));
            if v > half {
                -((Q - v) as i64)
            } else {
                v as i64
            }
        })
        .collect();
    Ok(KeySum::from_coefficients(coefficients, parties))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mul_mod_agrees_with_u128_arithmetic() {
        let samples = [0u64, 1, 2, 3, Q - 1, Q - 2, Q / 2, 1 << 61, (1 << 62) - (1 << 38), 0x1234_5678_9abc_def0 % Q];
        for &a in &samples {
            for &b in &samples {
                assert_eq!(mul_mod(a, b) as u128, (a as u128 * b as u128) % Q as u128, "{a} * {b}");
            }
        }
        assert_eq!(mul_mod(pow_mod(12345, Q - 2), 12345), 1);
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(5);
        for _ in 0..100_000 {
            let (a, b) = (uniform(&mut rng), uniform(&mut rng));
            assert_eq!(mul_mod(a, b) as u128, (a as u128 * b as u128) % Q as u128, "{a} * {b}");
        }
    }
}
