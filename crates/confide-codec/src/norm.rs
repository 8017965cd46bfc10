//! A proof that a party's bounded update also lies within an L2 ball, under the commitments of
//! [`crate::bound`].
//!
//! The statement: the values `q_k = v_k − P` committed in the bound proof's `V_k` (see
//! [`crate::bound`]) have `Σ q_k² ≤ β²` for the job's L2 bound `β` in the round's fixed point. The
//! verifier derives a commitment to each `q_k` from `V_k` alone:
//! `Q_k = 2^−(32 − bits)·V_k − P·B = q_k·B + ρ_k·B̃` with `ρ_k = 2^−(32 − bits)·γ_k`. The prover adds:
//!
//! 1. a commitment to each square, `C_k = q_k²·B + s_k·B̃` (fresh `s_k`), and a proof that it is
//!    one (a Σ-protocol for a committed product: `C_k = q_k·Q_k + t_k·B̃` with `t_k = s_k − q_k·ρ_k`,
//!    nonces `A1_k = a·B + b·B̃`, `A2_k = a·Q_k + c·B̃`, one Fiat-Shamir challenge `e` over every
//!    value, responses `z1 = a + e·q`, `z2 = b + e·ρ`, `z3 = c + e·t`);
//! 2. a range proof that `D = β² − Σ_k q_k²`, committed as `β²·B − Σ_k C_k` (blinding `−Σ s_k`),
//!    lies in `[0, 2^128)`: two 64-bit limbs `D = lo + 2^64·hi`, an aggregated Bulletproof over
//!    `hi`'s commitment (sent) and `lo`'s (derived).
//!
//! The bound proof already proves each `q_k ∈ [−P, P)`, so `Σ q_k² < n·2^62` never wraps the group
//! order and `D ≥ 0` is `‖q‖² ≤ β²`. Nothing else is revealed: the Σ-protocol is zero knowledge
//! (honest verifier, made non-interactive), the commitments hide, Bulletproofs are zero knowledge.
//! The verifier checks every product at once (random weights from the transcript, one
//! multi-scalar multiplication per core), at a fraction of the range proofs' cost.

use std::sync::OnceLock;

use bulletproofs::{BulletproofGens, PedersenGens, RangeProof};
use curve25519_dalek::constants::RISTRETTO_BASEPOINT_TABLE;
use curve25519_dalek::ristretto::{CompressedRistretto, RistrettoBasepointTable, RistrettoPoint};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::{Identity, VartimeMultiscalarMul};
use merlin::Transcript;
use rand_core::RngCore;
use rayon::prelude::*;

use crate::bound::{blinding_table, Refusal, MAX_BITS, PROOF_BITS};
use crate::error::{invalid, Error, Result};
use crate::rng::{chunk_rng, root_seed};

const LABEL: &[u8] = b"confide-bound-norm-v1";
/// The first bytes of a norm proof message.
pub const MAGIC: &[u8; 4] = b"CBN1";
const POINT: usize = 32;
/// Bytes per value: `C_k`, `A1_k`, `A2_k` and three responses.
const PER_VALUE: usize = 6 * POINT;
/// Values a thread proves or checks at once.
const BATCH: usize = 256;
const LIMB_BITS: usize = 64;

fn generators() -> (&'static PedersenGens, &'static RistrettoBasepointTable, &'static BulletproofGens) {
    static GENS: OnceLock<(PedersenGens, BulletproofGens)> = OnceLock::new();
    let (pc, bp) = GENS.get_or_init(|| (PedersenGens::default(), BulletproofGens::new(LIMB_BITS, 2)));
    (pc, blinding_table(), bp)
}

fn signed(x: i64) -> Scalar {
    let magnitude = Scalar::from(x.unsigned_abs());
    if x < 0 {
        -magnitude
    } else {
        magnitude
    }
}

fn random_scalar(rng: &mut impl RngCore) -> Scalar {
    let mut wide = [0u8; 64];
    rng.fill_bytes(&mut wide);
    Scalar::from_bytes_mod_order_wide(&wide)
}

fn shape(bits: u32) -> Result<(Scalar, i64)> {
    if !(1..=MAX_BITS).contains(&bits) {
        return Err(invalid("bits", format!("must be in 1..={MAX_BITS}, got {bits}")));
    }
    let shift = PROOF_BITS as u32 - bits;
    Ok((Scalar::from(1u64 << shift).invert(), 1i64 << (bits - 1)))
}

/// The transcript up to the challenge `e`: the statement (context, count, bits, bound, the bound
/// proof's commitments) and the prover's first message (`C`, `A1`, `A2`).
fn transcript(context: &[u8], count: usize, bits: u32, bound: u64, commitments: &[u8], first: &[u8]) -> Transcript {
    let mut t = Transcript::new(LABEL);
    t.append_message(b"context", context);
    t.append_u64(b"count", count as u64);
    t.append_u64(b"bits", u64::from(bits));
    t.append_u64(b"bound", bound);
    t.append_message(b"value-commitments", commitments);
    t.append_message(b"first", first);
    t
}

fn challenge(t: &mut Transcript, label: &'static [u8]) -> Scalar {
    let mut wide = [0u8; 64];
    t.challenge_bytes(label, &mut wide);
    Scalar::from_bytes_mod_order_wide(&wide)
}

/// The squared L2 norm of the values `v_k − 2^(bits − 1)`.
///
/// # Errors
/// `InvalidParameter` for bad `bits`.
pub fn squared_norm(values: &[u64], bits: u32) -> Result<u128> {
    let (_, offset) = shape(bits)?;
    Ok(values.iter().map(|&v| (v as i64 - offset).unsigned_abs() as u128).map(|q| q * q).sum())
}

/// The norm proof of `values` (each `v_k = q_k + 2^(bits − 1)`, the bound proof's values) whose
/// bound-proof blindings are `blindings` and commitments `commitments` (32 bytes each, as
/// [`crate::bound::verify`] returns them), for the bound `bound` (`‖q‖ ≤ bound`).
///
/// Layout: `"CBN1"`, u32 count, u64 bound, `count` × (`C`, `A1`, `A2`, `z1`, `z2`, `z3`), `hi`'s
/// commitment, u32 proof bytes, the range proof.
///
/// # Errors
/// `InvalidParameter` when the values' norm exceeds `bound` (an honest party scales its update
/// first), on length mismatches or bad `bits`; `Randomness` when the OS has none.
pub fn prove(context: &[u8], values: &[u64], bits: u32, blindings: &[Scalar], commitments: &[u8], bound: u64) -> Result<Vec<u8>> {
    let (inverse, offset) = shape(bits)?;
    let count = values.len();
    if blindings.len() != count || commitments.len() != POINT * count {
        return Err(invalid(
            "blindings",
            format!("{} blindings and {} commitment bytes for {count} values", blindings.len(), commitments.len()),
        ));
    }
    let norm = squared_norm(values, bits)?;
    let square = u128::from(bound) * u128::from(bound);
    if norm > square {
        return Err(invalid("values", format!("their squared norm {norm} exceeds the bound's square {square}: scale the update first")));
    }
    let (pc, blinding_table, bp) = generators();
    let root = root_seed(None)?;
    // per value: C, A1, A2 and the secrets (q, rho, t, s, a, b, c) behind them
    struct Secret {
        q: Scalar,
        rho: Scalar,
        t: Scalar,
        s: Scalar,
        nonces: [Scalar; 3],
    }
    let batches: Vec<(Vec<u8>, Vec<Secret>)> = values
        .par_chunks(BATCH)
        .zip(blindings.par_chunks(BATCH))
        .enumerate()
        .map(|(i, (v, g))| {
            let mut rng = chunk_rng(&root, i);
            let mut first = Vec::with_capacity(3 * POINT * v.len());
            let mut secrets = Vec::with_capacity(v.len());
            for (&v, gamma) in v.iter().zip(g) {
                let q = signed(v as i64 - offset);
                let rho = gamma * inverse;
                let s = random_scalar(&mut rng);
                let nonces = [random_scalar(&mut rng), random_scalar(&mut rng), random_scalar(&mut rng)];
                let [a, b, c] = nonces;
                let square = &(q * q) * RISTRETTO_BASEPOINT_TABLE + &s * blinding_table;
                let a1 = &a * RISTRETTO_BASEPOINT_TABLE + &b * blinding_table;
                // a·Q_k + c·B̃ with Q_k = q·B + rho·B̃, from the fixed bases alone
                let a2 = &(a * q) * RISTRETTO_BASEPOINT_TABLE + &(a * rho + c) * blinding_table;
                for point in [square, a1, a2] {
                    first.extend_from_slice(point.compress().as_bytes());
                }
                secrets.push(Secret { q, rho, t: s - q * rho, s, nonces });
            }
            (first, secrets)
        })
        .collect();
    let first: Vec<u8> = batches.iter().flat_map(|(f, _)| f.iter().copied()).collect();
    let mut t = transcript(context, count, bits, bound, commitments, &first);
    let e = challenge(&mut t, b"e");
    let mut out = Vec::with_capacity(16 + PER_VALUE * count + POINT + 4 + 700);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(count as u32).to_le_bytes());
    out.extend_from_slice(&bound.to_le_bytes());
    let mut total_s = Scalar::ZERO;
    for (first, secrets) in &batches {
        for (points, secret) in first.chunks_exact(3 * POINT).zip(secrets) {
            out.extend_from_slice(points);
            let [a, b, c] = secret.nonces;
            for z in [a + e * secret.q, b + e * secret.rho, c + e * secret.t] {
                out.extend_from_slice(z.as_bytes());
            }
            total_s += secret.s;
        }
    }
    let rest = square - norm;
    let (lo, hi) = (rest as u64, (rest >> LIMB_BITS) as u64);
    let mut rng = chunk_rng(&root, usize::MAX);
    let beta = random_scalar(&mut rng);
    let limb = Scalar::from(1u128 << LIMB_BITS);
    let gammas = [-total_s - limb * beta, beta];
    let (proof, limbs) = RangeProof::prove_multiple(bp, pc, &mut t, &[lo, hi], &gammas, LIMB_BITS)
        .map_err(|e| Error::Malformed(format!("the norm's range proof failed: {e}")))?;
    out.extend_from_slice(limbs[1].as_bytes());
    let proof = proof.to_bytes();
    out.extend_from_slice(&(proof.len() as u32).to_le_bytes());
    out.extend_from_slice(&proof);
    Ok(out)
}

fn point(bytes: &[u8]) -> Option<RistrettoPoint> {
    let mut p = [0u8; POINT];
    p.copy_from_slice(bytes);
    CompressedRistretto(p).decompress()
}

fn scalar(bytes: &[u8]) -> Option<Scalar> {
    let mut s = [0u8; 32];
    s.copy_from_slice(bytes);
    Scalar::from_canonical_bytes(s).into()
}

fn malformed(why: impl Into<String>) -> Refusal {
    Refusal::Malformed(why.into())
}

/// Check a norm proof message against the bound proof's `commitments` (32 bytes each, `count` of
/// them) for the bound `bound`.
///
/// # Errors
/// [`Refusal::Norm`] when the proof does not verify (a wrong square, or a norm past the bound);
/// [`Refusal::Malformed`] when it is not a norm proof of `count` values for `bound`.
pub fn verify(context: &[u8], message: &[u8], commitments: &[u8], count: usize, bits: u32, bound: u64) -> std::result::Result<(), Refusal> {
    let (inverse, offset) = shape(bits).map_err(|e| malformed(e.to_string()))?;
    if commitments.len() != POINT * count {
        return Err(malformed(format!("{} commitment bytes for {count} values", commitments.len())));
    }
    let head = 16;
    let body = PER_VALUE * count;
    if message.len() < head + body + POINT + 4 || &message[..4] != MAGIC {
        return Err(malformed("not a norm proof message, or one that ends early"));
    }
    let got = u32::from_le_bytes([message[4], message[5], message[6], message[7]]) as usize;
    let mut bound_bytes = [0u8; 8];
    bound_bytes.copy_from_slice(&message[8..16]);
    let got_bound = u64::from_le_bytes(bound_bytes);
    if got != count || got_bound != bound {
        return Err(malformed(format!("proves {got} values within {got_bound}, expected {count} within {bound}")));
    }
    let values = &message[head..head + body];
    let hi = &message[head + body..head + body + POINT];
    let tail = &message[head + body + POINT..];
    let len = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]) as usize;
    if tail.len() != 4 + len {
        return Err(malformed(format!("the range proof holds {} bytes, its length says {len}", tail.len() - 4)));
    }
    let first: Vec<u8> = values.chunks_exact(PER_VALUE).flat_map(|v| v[..3 * POINT].iter().copied()).collect();
    let mut t = transcript(context, count, bits, bound, commitments, &first);
    let e = challenge(&mut t, b"e");
    let mut weights = [0u8; 32];
    t.clone().challenge_bytes(b"batch-weights", &mut weights); // the verifier's own: the range proof goes on from t
                                                               // Σ_k α_k (z1·B + z2·B̃ − A1 − e·Q) + β_k (z1·Q + z3·B̃ − A2 − e·C) = 0, Q = inv·V − P·B
    let partial = values
        .par_chunks(PER_VALUE * BATCH)
        .zip(commitments.par_chunks(POINT * BATCH))
        .enumerate()
        .map(|(i, (batch, vs))| {
            let mut rng = chunk_rng(&weights, i);
            let n = vs.len() / POINT;
            let (mut scalars, mut points) = (Vec::with_capacity(4 * n), Vec::with_capacity(4 * n));
            let (mut base, mut blinding, mut sum) = (Scalar::ZERO, Scalar::ZERO, RistrettoPoint::identity());
            for (v, commitment) in batch.chunks_exact(PER_VALUE).zip(vs.chunks_exact(POINT)) {
                let square = point(&v[..POINT])?;
                let a1 = point(&v[POINT..2 * POINT])?;
                let a2 = point(&v[2 * POINT..3 * POINT])?;
                let [z1, z2, z3] = [3, 4, 5].map(|j| scalar(&v[j * POINT..(j + 1) * POINT]));
                let (z1, z2, z3) = (z1?, z2?, z3?);
                let committed = point(commitment)?;
                let mut wide = [0u8; 16];
                rng.fill_bytes(&mut wide);
                let alpha = Scalar::from(u128::from_le_bytes(wide));
                rng.fill_bytes(&mut wide);
                let beta = Scalar::from(u128::from_le_bytes(wide));
                let on_q = beta * z1 - alpha * e;
                base += alpha * z1 - on_q * signed(offset);
                blinding += alpha * z2 + beta * z3;
                scalars.extend([-alpha, -beta, -beta * e, on_q * inverse]);
                points.extend([a1, a2, square, committed]);
                sum += square;
            }
            let combined = RistrettoPoint::vartime_multiscalar_mul(&scalars, &points);
            Some((combined, base, blinding, sum))
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| malformed("a commitment, nonce or response is not a valid point or scalar"))?;
    let (pc, _, bp) = generators();
    let (mut combined, mut base, mut blinding, mut squares) =
        (RistrettoPoint::identity(), Scalar::ZERO, Scalar::ZERO, RistrettoPoint::identity());
    for (c, b, g, s) in partial {
        combined += c;
        base += b;
        blinding += g;
        squares += s;
    }
    combined += RistrettoPoint::vartime_multiscalar_mul([base, blinding], [pc.B, pc.B_blinding]);
    if combined != RistrettoPoint::identity() {
        return Err(Refusal::Norm);
    }
    let hi_point = point(hi).ok_or_else(|| malformed("the high limb's commitment is not a valid point"))?;
    let square = u128::from(bound) * u128::from(bound);
    let lo_point = Scalar::from(square) * pc.B - squares - Scalar::from(1u128 << LIMB_BITS) * hi_point;
    let proof = RangeProof::from_bytes(&tail[4..]).map_err(|_| Refusal::Norm)?;
    let limbs = [lo_point.compress(), CompressedRistretto(hi.try_into().map_err(|_| Refusal::Norm)?)];
    proof.verify_multiple(bp, pc, &mut t, &limbs, LIMB_BITS).map_err(|_| Refusal::Norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bound;

    fn proven(q: &[i64], bits: u32, bound: u64) -> (Vec<u8>, Vec<u8>) {
        let offset = 1i64 << (bits - 1);
        let v: Vec<u64> = q.iter().map(|&x| (x + offset) as u64).collect();
        let gammas: Vec<Scalar> = (0..q.len()).map(|k| Scalar::from(k as u64 * 31 + 7)).collect();
        let message = bound::prove(b"c", &v, bits, &gammas).expect("in range");
        let commitments = bound::verify(b"c", &message, q.len(), bits, false).expect("well formed");
        let norm = prove(b"c", &v, bits, &gammas, &commitments, bound).expect("within the bound");
        (commitments, norm)
    }

    #[test]
    fn an_update_within_the_bound_verifies_and_a_changed_statement_does_not() {
        let bits = 20;
        let q: Vec<i64> = (0..300).map(|k| ((k * 7919) % 2001) as i64 - 1000).collect();
        let norm = q.iter().map(|&x| (x * x) as u128).sum::<u128>();
        let bound = (norm as f64).sqrt().ceil() as u64; // tight: within one unit
        let (commitments, message) = proven(&q, bits, bound);
        assert_eq!(verify(b"c", &message, &commitments, q.len(), bits, bound), Ok(()));
        assert_eq!(verify(b"d", &message, &commitments, q.len(), bits, bound), Err(Refusal::Norm), "bound to its context");
        assert!(matches!(verify(b"c", &message, &commitments, q.len(), bits, bound - 1), Err(Refusal::Malformed(_))));
        // the statement's commitments are those of other values
        let (others, _) = proven(&q.iter().map(|x| -x).collect::<Vec<_>>(), bits, bound);
        assert_eq!(verify(b"c", &message, &others, q.len(), bits, bound), Err(Refusal::Norm));
        // any byte of a square commitment, a response or the range proof changed
        for at in [16 + 5, 16 + 3 * 32 + 9, 16 + 299 * PER_VALUE + 5 * 32 + 1, message.len() - 40] {
            let mut forged = message.clone();
            forged[at] ^= 0x04;
            assert!(verify(b"c", &forged, &commitments, q.len(), bits, bound).is_err(), "byte {at}");
        }
    }

    #[test]
    fn an_update_past_the_bound_has_no_proof_and_a_forged_square_does_not_verify() {
        let bits = 16;
        let q: Vec<i64> = vec![300, -400, 0, 0];
        let offset = 1i64 << (bits - 1);
        let zeros = [offset as u64; 4];
        assert!(prove(b"c", &zeros, bits, &[Scalar::ZERO; 4], &[0; 128], 0).is_ok(), "zeros are within any bound");
        let v: Vec<u64> = q.iter().map(|&x| (x + offset) as u64).collect();
        let gammas = vec![Scalar::from(3u64); 4];
        let message = bound::prove(b"c", &v, bits, &gammas).unwrap();
        let commitments = bound::verify(b"c", &message, 4, bits, false).unwrap();
        let refused = prove(b"c", &v, bits, &gammas, &commitments, 499).unwrap_err().to_string();
        assert!(refused.contains("250000 exceeds the bound's square 249001"), "{refused}");
        // a prover that proves the squares of smaller values against the true commitments
        let small: Vec<u64> = [3i64, -4, 0, 0].iter().map(|&x| (x + offset) as u64).collect();
        let forged = prove(b"c", &small, bits, &gammas, &commitments, 499).unwrap();
        assert_eq!(verify(b"c", &forged, &commitments, 4, bits, 499), Err(Refusal::Norm));
        // the honest proof at the exact bound
        let exact = prove(b"c", &v, bits, &gammas, &commitments, 500).unwrap();
        assert_eq!(verify(b"c", &exact, &commitments, 4, bits, 500), Ok(()));
    }

    #[test]
    fn the_largest_bound_and_values_prove() {
        let bits = 32;
        let q = vec![i64::from(i32::MIN), i64::from(i32::MAX), -1, 1];
        let (commitments, message) = proven(&q, bits, u64::MAX);
        assert_eq!(verify(b"c", &message, &commitments, 4, bits, u64::MAX), Ok(()));
    }
}
