//! Property: an honest party's update proves and verifies at any L2 bound not below its norm, and
//! no proof of it can be made at a bound below its norm.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use confide_codec::{bound, norm};
use curve25519_dalek::scalar::Scalar;
use proptest::prelude::*;

fn offset(q: &[i64], bits: u32) -> Vec<u64> {
    q.iter().map(|&x| (x + (1i64 << (bits - 1))) as u64).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn the_norm_proof_holds_exactly_at_bounds_not_below_the_norm(
        bits in 4u32..=32,
        raw in prop::collection::vec(any::<i64>(), 1..12),
        slack in 0u64..1000,
        blinding in any::<u64>(),
    ) {
        let half = 1i64 << (bits - 1);
        let q: Vec<i64> = raw.iter().map(|x| x.rem_euclid(2 * half) - half).collect();
        let values = offset(&q, bits);
        let squared = norm::squared_norm(&values, bits).unwrap();
        prop_assert_eq!(squared, q.iter().map(|&x| (x as i128 * x as i128) as u128).sum::<u128>());
        let root = (squared as f64).sqrt() as u64;
        let tight = (root.saturating_sub(2)..=root + 2).find(|b| u128::from(*b) * u128::from(*b) >= squared).unwrap();
        let gammas: Vec<Scalar> = (0..q.len() as u64).map(|k| Scalar::from(blinding ^ k)).collect();
        let message = bound::prove(b"prop", &values, bits, &gammas).unwrap();
        let commitments = bound::verify(b"prop", &message, q.len(), bits, false).unwrap();
        for l2 in [tight, tight.saturating_add(slack)] {
            let proof = norm::prove(b"prop", &values, bits, &gammas, &commitments, l2).unwrap();
            prop_assert_eq!(norm::verify(b"prop", &proof, &commitments, q.len(), bits, l2), Ok(()));
        }
        if tight > 0 {
            prop_assert!(norm::prove(b"prop", &values, bits, &gammas, &commitments, tight - 1).is_err());
        }
    }
}
