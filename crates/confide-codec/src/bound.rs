//! Range proofs that each value of a party's protected update lies within the job's bound.
//!
//! The protocol is in `python/confide/protect/bound.py` (and docs/crypto.md, "Bounded updates");
//! this module is its arithmetic. A party's fixed-point values `q_k` (the integers its protected
//! words carry) are offset to `v_k = q_k + P` with `P = 2^(bits − 1)`, so `|q_k| ≤ P` with
//! `q_k < P` becomes `v_k ∈ [0, 2^bits)`. Bulletproofs prove ranges of 8, 16, 32 or 64 bits, so the
//! party commits to `w_k = v_k · 2^(32 − bits)`: `V_k = w_k·B + γ_k·B̃` (Pedersen, ristretto255)
//! and proves `w_k ∈ [0, 2^32)` in aggregated proofs of [`CHUNK`] values (the dalek `bulletproofs`
//! crate, each transcript bound to the job, round, attempt, party and chunk).
//!
//! The blindings cancel over the parties: `γ_k = Σ_j ±PRF(k_ij, k)` with the pair keys of the
//! parties (the sign by the order of their names), so once the protected sum `S_k` is decoded,
//! `Σ_i V_ik = 2^(32 − bits) · (S_k + m·P) · B` ([`check_sum`]). Together the two checks bound
//! every update: a `w_k` in range whose `v_k` is not below `2^bits` is `w_k · 2^−(32 − bits)` in the
//! scalar field, far from any small integer, and the sum check fails; a party whose protected
//! words differ from what it committed to fails the sum check too. A failed proof names its party;
//! a failed sum check names none (it only says the sum is not of the proven values).

use std::sync::OnceLock;

use aes::cipher::{KeyIvInit, StreamCipher};
use bulletproofs::{BulletproofGens, PedersenGens, RangeProof};
use curve25519_dalek::constants::RISTRETTO_BASEPOINT_TABLE;
use curve25519_dalek::ristretto::{CompressedRistretto, RistrettoBasepointTable, RistrettoPoint};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::Identity;
use merlin::Transcript;
use rayon::prelude::*;

use crate::error::{invalid, Error, Result};

type Aes128Ctr = ctr::Ctr128BE<aes::Aes128>;

/// Bits of each range proof (what Bulletproofs proves: `w ∈ [0, 2^32)`).
pub const PROOF_BITS: usize = 32;
/// Values in one aggregated proof.
pub const CHUNK: usize = 64;
/// The widest offset values a party can prove (`bits`).
pub const MAX_BITS: u32 = 32;
const LABEL: &[u8] = b"confide-bound-v1";
const MAGIC: &[u8; 4] = b"CBP1";
const POINT: usize = 32;

fn generators() -> &'static (PedersenGens, BulletproofGens) {
    static GENS: OnceLock<(PedersenGens, BulletproofGens)> = OnceLock::new();
    GENS.get_or_init(|| (PedersenGens::default(), BulletproofGens::new(PROOF_BITS, CHUNK)))
}

/// The blindings of `count` values: `γ_k = Σ_j s_j · R_j(k)`, with `R_j(k)` the 64 bytes of
/// AES-128-CTR keystream under `keys[j]` from block `4k`, reduced mod the group order, and `s_j`
/// `+1` where `adds[j]`, else `−1`. Over parties whose pair keys agree and whose signs are
/// opposite, the blindings of each value sum to zero.
///
/// # Errors
/// `InvalidParameter` if `keys` and `adds` differ in length.
pub fn blindings(keys: &[[u8; 16]], adds: &[bool], count: usize) -> Result<Vec<Scalar>> {
    if keys.len() != adds.len() {
        return Err(invalid("adds", format!("holds {} signs for {} keys", adds.len(), keys.len())));
    }
    let mut out = vec![Scalar::ZERO; count];
    let mut wide = vec![0u8; 64 * count];
    for (key, &add) in keys.iter().zip(adds) {
        wide.fill(0);
        Aes128Ctr::new(key.into(), &[0u8; 16].into()).apply_keystream(&mut wide);
        for (gamma, bytes) in out.iter_mut().zip(wide.chunks_exact(64)) {
            let mut block = [0u8; 64];
            block.copy_from_slice(bytes);
            let r = Scalar::from_bytes_mod_order_wide(&block);
            if add {
                *gamma += r;
            } else {
                *gamma -= r;
            }
        }
    }
    Ok(out)
}

fn check_bits(bits: u32) -> Result<u32> {
    if !(1..=MAX_BITS).contains(&bits) {
        return Err(invalid("bits", format!("must be in 1..={MAX_BITS}, got {bits}")));
    }
    Ok(PROOF_BITS as u32 - bits)
}

fn transcript(context: &[u8], chunk: usize) -> Transcript {
    let mut t = Transcript::new(LABEL);
    t.append_message(b"context", context);
    t.append_u64(b"chunk", chunk as u64);
    t
}

/// The party's proof message for `values` (each below `2^bits`) under `blindings` (one each).
///
/// Layout: `"CBP1"`, u32 count, u32 bits, then per chunk of [`CHUNK`] values (the last one padded
/// with zeros to a power of two): u32 proof bytes, the proof, its commitments (32 bytes each).
///
/// # Errors
/// `InvalidParameter` naming the first value out of range, a length mismatch or bad `bits`.
pub fn prove(context: &[u8], values: &[u64], bits: u32, blindings: &[Scalar]) -> Result<Vec<u8>> {
    let shift = check_bits(bits)?;
    if blindings.len() != values.len() {
        return Err(invalid("blindings", format!("holds {} for {} values", blindings.len(), values.len())));
    }
    if let Some(at) = values.iter().position(|&v| v >> bits != 0) {
        return Err(invalid("values", format!("value {at} is {}, not below 2^{bits}: it cannot be proven", values[at])));
    }
    let (pc, bp) = generators();
    let chunks: Vec<Result<Vec<u8>>> = values
        .par_chunks(CHUNK)
        .zip(blindings.par_chunks(CHUNK))
        .enumerate()
        .map(|(c, (v, g))| {
            let width = v.len().next_power_of_two();
            let mut w: Vec<u64> = v.iter().map(|&x| x << shift).collect();
            let mut gamma = g.to_vec();
            w.resize(width, 0);
            gamma.resize(width, Scalar::ZERO);
            let (proof, commitments) = RangeProof::prove_multiple(bp, pc, &mut transcript(context, c), &w, &gamma, PROOF_BITS)
                .map_err(|e| Error::Malformed(format!("chunk {c}: the range proof failed: {e}")))?;
            let proof = proof.to_bytes();
            let mut out = Vec::with_capacity(4 + proof.len() + POINT * width);
            out.extend_from_slice(&(proof.len() as u32).to_le_bytes());
            out.extend_from_slice(&proof);
            commitments.iter().for_each(|p| out.extend_from_slice(p.as_bytes()));
            Ok(out)
        })
        .collect();
    let mut out = Vec::with_capacity(8 + values.len() * (POINT + 16));
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(values.len() as u32).to_le_bytes());
    out.extend_from_slice(&bits.to_le_bytes());
    for chunk in chunks {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

/// Why a proof message is refused: it is malformed, or chunk `chunk`'s proof does not verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not a proof message of `count` values of `bits` (the reason).
    Malformed(String),
    /// The proof of values `[CHUNK·chunk, …)` does not verify: some value is out of range.
    Proof {
        /// The chunk whose proof failed.
        chunk: usize,
    },
    /// The L2 norm proof ([`crate::norm`]) does not verify: a square is not one, or the norm is
    /// past the bound.
    Norm,
}

fn le_u32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

fn compressed(bytes: &[u8]) -> CompressedRistretto {
    let mut point = [0u8; POINT];
    point.copy_from_slice(bytes);
    CompressedRistretto(point)
}

fn take<'a>(data: &mut &'a [u8], n: usize, what: &str) -> std::result::Result<&'a [u8], Refusal> {
    if data.len() < n {
        return Err(Refusal::Malformed(format!("ends inside {what}")));
    }
    let (head, tail) = data.split_at(n);
    *data = tail;
    Ok(head)
}

/// The commitments (32 bytes each, `count` of them) of a proof message, every proof checked when
/// `check` (a party's own message need not be).
///
/// # Errors
/// [`Refusal`].
pub fn verify(context: &[u8], message: &[u8], count: usize, bits: u32, check: bool) -> std::result::Result<Vec<u8>, Refusal> {
    let (commitments, used) = verify_prefix(context, message, count, bits, check)?;
    if used != message.len() {
        return Err(Refusal::Malformed(format!("{} bytes follow the last proof", message.len() - used)));
    }
    Ok(commitments)
}

/// [`verify`] of the proof message that begins `message` (a norm proof may follow it): its
/// commitments and its length in bytes.
///
/// # Errors
/// [`Refusal`].
pub fn verify_prefix(
    context: &[u8],
    message: &[u8],
    count: usize,
    bits: u32,
    check: bool,
) -> std::result::Result<(Vec<u8>, usize), Refusal> {
    let mut data = message;
    if take(&mut data, 4, "the magic")? != MAGIC {
        return Err(Refusal::Malformed("not a bound proof message".into()));
    }
    let header = take(&mut data, 8, "the header")?;
    let (got, got_bits) = (le_u32(&header[..4]) as usize, le_u32(&header[4..]));
    if got != count || got_bits != bits {
        return Err(Refusal::Malformed(format!("proves {got} values of {got_bits} bits, expected {count} of {bits}")));
    }
    let mut parts = Vec::new();
    for c in 0..count.div_ceil(CHUNK) {
        let width = (count - c * CHUNK).min(CHUNK).next_power_of_two();
        let len = le_u32(take(&mut data, 4, "a proof length")?) as usize;
        let proof = take(&mut data, len, "a proof")?;
        let points = take(&mut data, POINT * width, "the commitments")?;
        parts.push((c, proof, points));
    }
    let used = message.len() - data.len();
    if check {
        let (pc, bp) = generators();
        let failed = parts.par_iter().find_map_first(|&(c, proof, points)| {
            let commitments: Vec<CompressedRistretto> = points.chunks_exact(POINT).map(compressed).collect();
            let ok = RangeProof::from_bytes(proof)
                .is_ok_and(|p| p.verify_multiple(bp, pc, &mut transcript(context, c), &commitments, PROOF_BITS).is_ok());
            (!ok).then_some(c)
        });
        if let Some(chunk) = failed {
            return Err(Refusal::Proof { chunk });
        }
    }
    let mut out = Vec::with_capacity(POINT * count);
    for (c, _, points) in &parts {
        let kept = (count - c * CHUNK).min(CHUNK);
        out.extend_from_slice(&points[..POINT * kept]);
    }
    Ok((out, used))
}

/// Positions `k` where the parties' commitments do not sum to
/// `2^(32 − bits) · totals[k] · B + residual[k] · B̃` (`totals[k] = S_k + m·P`, the decoded sum
/// offset as the parties offset their values; `residual` the blindings that did not cancel, when a
/// recovered round left parties out: empty where every participant's commitments are summed).
///
/// # Errors
/// `InvalidParameter` if a party's commitments are not `32 · totals.len()` bytes, or `residual` is
/// neither empty nor one a value; a commitment that is not a valid point is reported as its position
/// (such a sum cannot hold).
pub fn check_sum(commitments: &[&[u8]], totals: &[i64], bits: u32, residual: &[Scalar]) -> Result<Vec<usize>> {
    let shift = check_bits(bits)?;
    if let Some(p) = commitments.iter().position(|c| c.len() != POINT * totals.len()) {
        return Err(invalid(
            "commitments",
            format!("party {p} holds {} bytes, {} values need {}", commitments[p].len(), totals.len(), POINT * totals.len()),
        ));
    }
    if !residual.is_empty() && residual.len() != totals.len() {
        return Err(invalid("residual", format!("holds {} blindings for {} values", residual.len(), totals.len())));
    }
    let scale = Scalar::from(1u64 << shift);
    let blinding = blinding_table();
    let bad = totals
        .par_iter()
        .enumerate()
        .filter_map(|(k, &total)| {
            let mut sum = RistrettoPoint::identity();
            for party in commitments {
                match compressed(&party[POINT * k..POINT * (k + 1)]).decompress() {
                    Some(point) => sum += point,
                    None => return Some(k),
                }
            }
            let magnitude = Scalar::from(total.unsigned_abs());
            let value = if total < 0 { -magnitude } else { magnitude };
            let mut expected = &(value * scale) * RISTRETTO_BASEPOINT_TABLE;
            if let Some(r) = residual.get(k) {
                expected += r * blinding;
            }
            (sum != expected).then_some(k)
        })
        .collect();
    Ok(bad)
}

/// `B̃`, the Pedersen blinding base, as a precomputed table.
pub(crate) fn blinding_table() -> &'static RistrettoBasepointTable {
    static TABLE: OnceLock<RistrettoBasepointTable> = OnceLock::new();
    TABLE.get_or_init(|| RistrettoBasepointTable::create(&generators().0.B_blinding))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parties(m: usize) -> Vec<Vec<Scalar>> {
        // party i's pair key with j is the same on both sides; i adds it where i < j
        let key = |i: usize, j: usize| [(i.min(j) * 16 + i.max(j)) as u8; 16];
        (0..m)
            .map(|i| {
                let peers: Vec<usize> = (0..m).filter(|&j| j != i).collect();
                let keys: Vec<[u8; 16]> = peers.iter().map(|&j| key(i, j)).collect();
                let adds: Vec<bool> = peers.iter().map(|&j| i < j).collect();
                blindings(&keys, &adds, 70).expect("lengths agree")
            })
            .collect()
    }

    #[test]
    fn honest_values_prove_and_sum_and_a_changed_sum_or_value_is_refused() {
        let (m, bits, count) = (3usize, 20u32, 70usize);
        let offset = 1i64 << (bits - 1);
        let gammas = parties(m);
        let q: Vec<Vec<i64>> =
            (0..m).map(|i| (0..count).map(|k| ((k * 7919 + i * 104_729) % (1 << bits)) as i64 - offset).collect()).collect();
        let mut commitments = Vec::new();
        for i in 0..m {
            let v: Vec<u64> = q[i].iter().map(|&x| (x + offset) as u64).collect();
            let message = prove(b"job/1/0/i", &v, bits, &gammas[i]).expect("in range");
            commitments.push(verify(b"job/1/0/i", &message, count, bits, true).expect("verifies"));
            assert_eq!(verify(b"job/2/0/i", &message, count, bits, true), Err(Refusal::Proof { chunk: 0 }), "bound to its context");
        }
        let mut totals: Vec<i64> = (0..count).map(|k| q.iter().map(|p| p[k]).sum::<i64>() + m as i64 * offset).collect();
        let views: Vec<&[u8]> = commitments.iter().map(Vec::as_slice).collect();
        assert_eq!(check_sum(&views, &totals, bits, &[]).unwrap(), Vec::<usize>::new());
        // a prover that commits to a w in range which is not v << (32 - bits): its proof holds (w is
        // below 2^32) but w / 2^(32 - bits) is no integer, and the sum check refuses the position
        let mut w: Vec<u64> = q[0].iter().map(|&x| ((x + offset) as u64) << (32 - bits)).collect();
        w[3] += 1;
        let forged = verify(b"f", &prove(b"f", &w, 32, &gammas[0]).unwrap(), count, 32, true).expect("a valid proof");
        let cheating: Vec<&[u8]> = vec![&forged, &commitments[1], &commitments[2]];
        assert_eq!(check_sum(&cheating, &totals, bits, &[]).unwrap(), vec![3]);
        // a recovered round: party 2 left out, its pair blindings with the survivors are the residual
        let survivors: Vec<&[u8]> = vec![&commitments[0], &commitments[1]];
        let partial: Vec<i64> = (0..count).map(|k| q[0][k] + q[1][k] + 2 * offset).collect();
        let residual: Vec<Scalar> = (0..count).map(|k| gammas[0][k] + gammas[1][k]).collect();
        assert_eq!(check_sum(&survivors, &partial, bits, &residual).unwrap(), Vec::<usize>::new());
        assert_eq!(check_sum(&survivors, &partial, bits, &[]).unwrap().len(), count, "without it nothing holds");
        totals[65] += 1;
        assert_eq!(check_sum(&views, &totals, bits, &[]).unwrap(), vec![65]);
        // a value of 2^bits has no proof
        let mut v = vec![0u64; 3];
        v[1] = 1 << bits;
        assert!(prove(b"c", &v, bits, &[Scalar::ZERO; 3]).unwrap_err().to_string().contains("value 1"));
    }

    #[test]
    fn a_proof_of_a_value_past_the_range_does_not_verify() {
        // what a cheating prover can do: prove w = v << shift for v >= 2^bits (w past 2^32 wraps)
        let (pc, bp) = generators();
        let bits = 20u32;
        let v = (1u64 << bits) + 5;
        let w = v << (32 - bits);
        let gamma = [Scalar::from(7u64)];
        let mut t = transcript(b"c", 0);
        let refused = RangeProof::prove_multiple(bp, pc, &mut t, &[w], &gamma, PROOF_BITS);
        let forged = match refused {
            Err(_) => return, // the library refuses to prove it at all
            Ok((proof, commitments)) => (proof, commitments),
        };
        let mut t = transcript(b"c", 0);
        assert!(forged.0.verify_multiple(bp, pc, &mut t, &forged.1, PROOF_BITS).is_err());
    }
}
