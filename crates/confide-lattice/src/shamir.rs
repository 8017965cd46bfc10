//! t-of-m Shamir sharing of a ternary key polynomial over the prime field `F_p`, `p = 65521`,
//! coefficient by coefficient.
//!
//! Party `i` shares its round key `s_i` among the `m` parties (points `1..=m`); party `j` adds the
//! shares it received from the parties whose ciphertexts made the sum ([`add_shares`]), which
//! gives its share of the key sum (Shamir is linear); any `t` such summed shares rebuild the key
//! sum and nothing else (the sum, not any one key, while fewer than `t` parties pool what they
//! received).
//!
//! Why a 16-bit field and not the ciphertext modulus: Shamir hides the secret perfectly over any
//! field with more elements than parties, and what is rebuilt, the sum of at most [`MAX_PARTIES`]
//! ternary keys, has coefficients in `[-m, m]`, which `F_p` holds centred. A share is then two
//! bytes a coefficient (8 KiB for `n = 4096`) instead of eight: the key exchange, which a round
//! pays whatever the model's size, is a quarter as large. The arithmetic on shares is
//! constant-time: products stay under `2^32` and are reduced by a constant divisor (a multiply
//! and a shift, no division instruction, no branch).

#[cfg(test)]
use rand_core::SeedableRng;

use crate::{KeySum, LatticeError, SecretKey};
use rand_core::{CryptoRng, RngCore};
use zeroize::Zeroize;

/// The share field's prime: the largest under `2^16`.
pub const P: u32 = 65_521;
/// The most parties one key sum may cover: its coefficients must stay under `p / 2` in magnitude.
pub const MAX_PARTIES: usize = (P as usize - 1) / 2;

fn mul_mod(a: u32, b: u32) -> u32 {
    (a * b) % P // both under 2^16: the product fits, and % by a constant compiles to a multiply
}

fn add_mod(a: u32, b: u32) -> u32 {
    (a + b) % P
}

fn pow_mod(mut base: u32, mut exponent: u32) -> u32 {
    let mut out = 1u32;
    while exponent > 0 {
        if exponent & 1 == 1 {
            out = mul_mod(out, base);
        }
        base = mul_mod(base, base);
        exponent >>= 1;
    }
    out
}

/// A ternary (or any small signed) coefficient as an element of `F_p`, without a branch on its sign.
fn lift(value: i64) -> u32 {
    let sign = (value >> 63) as u32; // all ones when negative
    ((value as u32).wrapping_add(P & sign)) % P
}

fn uniform<R: RngCore + CryptoRng>(rng: &mut R) -> u32 {
    loop {
        let v = rng.next_u32() & 0xFFFF; // rejected 15 times in 65,536: on public randomness only
        if v < P {
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
) -> Result<Vec<Vec<u16>>, LatticeError> {
    if threshold < 1 || threshold > parties || parties > MAX_PARTIES {
        return Err(LatticeError::Threshold { threshold, parties });
    }
    let n = key.coefficients().len();
    let mut shares = vec![vec![0u16; n]; parties];
    let mut polynomial = vec![0u32; threshold];
    for (c, &coefficient) in key.coefficients().iter().enumerate() {
        polynomial[0] = lift(coefficient);
        for r in polynomial.iter_mut().skip(1) {
            *r = uniform(rng);
        }
        for (j, share) in shares.iter_mut().enumerate() {
            let x = (j + 1) as u32;
            // Horner: f(x) = p0 + x (p1 + x (p2 + ...))
            let mut value = 0u32;
            for &p in polynomial.iter().rev() {
                value = add_mod(mul_mod(value, x), p);
            }
            share[c] = value as u16;
        }
    }
    polynomial.zeroize();
    Ok(shares)
}

/// ``total += share`` in `F_p`, coefficient by coefficient (a party's share of a key sum).
pub fn add_shares(total: &mut [u16], share: &[u16]) -> Result<(), LatticeError> {
    if total.len() != share.len() {
        return Err(LatticeError::Length { what: "a share", got: share.len(), expected: total.len() });
    }
    if let Some(&bad) = share.iter().chain(total.iter()).find(|&&v| v as u32 >= P) {
        return Err(LatticeError::Points(format!("share coefficient {bad} is not below {P}")));
    }
    for (t, &s) in total.iter_mut().zip(share) {
        *t = add_mod(*t as u32, s as u32) as u16;
    }
    Ok(())
}

/// The key sum of ``parties`` keys from the summed shares of the points ``points`` (1-based).
///
/// Lagrange interpolation at 0 over the given points (at least the threshold, distinct); the
/// result's coefficients are centred (a sum of `parties` ternary keys lies in `[-parties, parties]`).
pub fn reconstruct_key_sum(points: &[u64], shares: &[&[u16]], parties: usize) -> Result<KeySum, LatticeError> {
    if points.is_empty() || points.len() != shares.len() {
        return Err(LatticeError::Points(format!("{} points for {} shares", points.len(), shares.len())));
    }
    if parties > MAX_PARTIES {
        return Err(LatticeError::Threshold { threshold: points.len(), parties });
    }
    for (i, &p) in points.iter().enumerate() {
        if p == 0 || p >= P as u64 || points[..i].contains(&p) {
            return Err(LatticeError::Points(format!("point {p} is zero, not below {P} or repeated")));
        }
    }
    let n = shares[0].len();
    if let Some(bad) = shares.iter().find(|s| s.len() != n) {
        return Err(LatticeError::Length { what: "a share", got: bad.len(), expected: n });
    }
    if let Some(&bad) = shares.iter().flat_map(|s| s.iter()).find(|&&v| v as u32 >= P) {
        return Err(LatticeError::Points(format!("share coefficient {bad} is not below {P}")));
    }
    let weights: Vec<u32> = points
        .iter()
        .map(|&xj| {
            let xj = xj as u32;
            let (mut num, mut den) = (1u32, 1u32);
            for xk in points.iter().map(|&x| x as u32).filter(|&xk| xk != xj) {
                num = mul_mod(num, xk);
                den = mul_mod(den, add_mod(xk, P - xj));
            }
            mul_mod(num, pow_mod(den, P - 2))
        })
        .collect();
    let half = P / 2;
    let coefficients = (0..n)
        .map(|c| {
            let v = shares.iter().zip(&weights).fold(0u32, |acc, (s, &w)| add_mod(acc, mul_mod(s[c] as u32, w)));
            // centred without a branch: v - p where v > p / 2
            let above = ((half.wrapping_sub(v) as i32) >> 31) as i64; // -1 when v > half
            v as i64 + (above & -(P as i64))
        })
        .collect();
    Ok(KeySum::from_coefficients(coefficients, parties))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_arithmetic_agrees_with_plain_integers() {
        let samples = [0u32, 1, 2, 3, P - 1, P - 2, P / 2, 40_000, 12_345];
        for &a in &samples {
            for &b in &samples {
                assert_eq!(mul_mod(a, b) as u64, (a as u64 * b as u64) % P as u64, "{a} * {b}");
                assert_eq!(add_mod(a, b) as u64, (a as u64 + b as u64) % P as u64, "{a} + {b}");
            }
        }
        assert_eq!(mul_mod(pow_mod(12_345, P - 2), 12_345), 1);
        assert_eq!(lift(-1), P - 1);
        assert_eq!(lift(1), 1);
        assert_eq!(lift(0), 0);
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(5);
        assert!((0..100_000).all(|_| uniform(&mut rng) < P));
    }

    #[test]
    fn shares_and_sums_out_of_the_field_are_refused() {
        let mut total = vec![0u16; 4];
        assert!(add_shares(&mut total, &[1, 2, 3]).is_err());
        assert!(add_shares(&mut total, &[1, 2, 3, P as u16]).is_err());
        add_shares(&mut total, &[P as u16 - 1, 2, 3, 4]).unwrap();
        add_shares(&mut total, &[5, 2, 3, 4]).unwrap();
        assert_eq!(total, vec![4, 4, 6, 8]);
        assert!(reconstruct_key_sum(&[1, 2], &[&[0u16, (P + 1) as u16], &[0, 0]], 2).is_err());
        assert!(reconstruct_key_sum(&[1], &[&[0u16]], MAX_PARTIES + 1).is_err());
        assert!(reconstruct_key_sum(&[P as u64], &[&[0u16]], 2).is_err());
    }
}
