//! Public behaviour of confide-codec: exact packed sums for m = 1..64 parties,
//! overflow flags, dACIQ table, FLBooster round trips.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use confide_codec::daciq::{alpha_factor, clipping_threshold, solve_alpha_factor, ALPHA_FACTORS};
use confide_codec::{BatchCryptCodec, Error, FlBoosterCodec, Quantizer};
use proptest::prelude::*;
use proptest::strategy::ValueTree;

/// Limb-wise big-integer sum of packed vectors (what decryption of the ciphertext product yields).
fn add_packed(total: &mut [u64], other: &[u64]) {
    let mut carry = 0u128;
    for (a, b) in total.iter_mut().zip(other) {
        let s = u128::from(*a) + u128::from(*b) + carry;
        *a = s as u64;
        carry = s >> 64;
    }
    assert_eq!(carry, 0, "packed sum overflowed the plaintext");
}

fn extreme_values(alpha: f64) -> impl Strategy<Value = f64> {
    prop_oneof![Just(alpha), Just(-alpha), Just(0.0), Just(2.0 * alpha), Just(-3.0 * alpha), -alpha..alpha]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn packed_sums_decode_exactly(parties in 1u32..=64, length in 1usize..260, seed in any::<u64>(), quantizer in prop_oneof![Just(Quantizer::ExactBound), Just(Quantizer::Paper)]) {
        let alpha = 0.75;
        let codec = BatchCryptCodec::new(16, parties, alpha, 2048, quantizer).unwrap();
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let mut total = vec![0u64; codec.layout().plaintexts_for(length) * codec.layout().limbs];
        let mut expected_codes = vec![0i64; length];
        for party in 0..parties {
            let values: Vec<f64> = (0..length).map(|_| extreme_values(alpha).new_tree(&mut runner).unwrap().current()).collect();
            let packed = codec.encode(&values, Some(seed ^ u64::from(party))).unwrap();
            // A single vector decodes to its own codes.
            let alone = codec.decode(&packed.limbs, length, 1).unwrap();
            for (e, c) in expected_codes.iter_mut().zip(&alone.codes) { *e += c; }
            add_packed(&mut total, &packed.limbs);
        }
        let decoded = codec.decode(&total, length, u64::from(parties)).unwrap();
        prop_assert_eq!(&decoded.codes, &expected_codes);
        let q = codec.code_max();
        let should_flag: Vec<usize> = expected_codes.iter().enumerate().filter(|(_, c)| c.abs() > q).map(|(i, _)| i).collect();
        prop_assert_eq!(&decoded.overflow, &should_flag);
        if quantizer == Quantizer::ExactBound {
            prop_assert!(decoded.overflow.is_empty());
        }
    }

    #[test]
    fn stochastic_rounding_is_reproducible_and_bounded(values in proptest::collection::vec(-2.0f64..2.0, 1..200), seed in any::<u64>()) {
        let codec = BatchCryptCodec::new(16, 8, 1.0, 2048, Quantizer::ExactBound).unwrap();
        let a = codec.encode(&values, Some(seed)).unwrap();
        prop_assert_eq!(&a, &codec.encode(&values, Some(seed)).unwrap());
        let decoded = codec.decode(&a.limbs, values.len(), 1).unwrap();
        let step = 1.0 / ((codec.code_max() / 8) as f64);
        for (got, want) in decoded.values.iter().zip(&values) {
            prop_assert!((got - want.clamp(-1.0, 1.0)).abs() <= step + 1e-12);
        }
    }

    #[test]
    fn codes_are_what_encode_packs_under_the_same_seed(values in proptest::collection::vec(-3.0f64..3.0, 1..300), seed in any::<u64>()) {
        let codec = BatchCryptCodec::new(16, 5, 2.0, 2048, Quantizer::ExactBound).unwrap();
        let packed = codec.encode(&values, Some(seed)).unwrap();
        let decoded = codec.decode(&packed.limbs, values.len(), 1).unwrap();
        prop_assert_eq!(codec.codes(&values, Some(seed)).unwrap(), decoded.codes);
    }
}

#[test]
fn overflow_fires_when_more_parties_than_declared_are_summed() {
    // m = 3 declares p = 2 carry bits (capacity 4); four parties at +alpha exceed Q.
    let codec = BatchCryptCodec::new(16, 3, 1.0, 2048, Quantizer::ExactBound).unwrap();
    let values = vec![1.0, -1.0, 0.0];
    let packed = codec.encode(&values, Some(1)).unwrap();
    let mut total = packed.limbs.clone();
    for _ in 0..3 {
        add_packed(&mut total, &packed.limbs);
    }
    let decoded = codec.decode(&total, 3, 4).unwrap();
    assert_eq!(decoded.codes, vec![4 * 10922, -4 * 10922, 0]);
    assert_eq!(decoded.overflow, vec![0, 1]);
    assert_eq!(codec.decode(&total, 3, 5).unwrap_err(), Error::TooManySummands { summands: 5, capacity: 4 });
}

#[test]
fn stochastic_rounding_is_unbiased() {
    let codec = BatchCryptCodec::new(8, 1, 1.0, 2048, Quantizer::ExactBound).unwrap();
    let value = 0.3 / 127.0 + 5.0 / 127.0; // 5.3 code units
    let values = vec![value; 20_000];
    let decoded = codec.decode(&codec.encode(&values, Some(7)).unwrap().limbs, values.len(), 1).unwrap();
    let mean: f64 = decoded.codes.iter().map(|&c| c as f64).sum::<f64>() / values.len() as f64;
    assert!((mean - 5.3).abs() < 0.02, "mean code {mean}");
    assert!(decoded.codes.iter().all(|&c| c == 5 || c == 6));
}

#[test]
fn bad_parameters_name_the_field() {
    let err = BatchCryptCodec::new(40, 4, 1.0, 2048, Quantizer::ExactBound).unwrap_err();
    assert!(err.to_string().contains("bits") && err.to_string().contains("2..=32"), "{err}");
    let err = BatchCryptCodec::new(16, 4, f64::NAN, 2048, Quantizer::ExactBound).unwrap_err();
    assert!(err.to_string().contains("alpha"), "{err}");
    let err = BatchCryptCodec::new(16, 0, 1.0, 2048, Quantizer::ExactBound).unwrap_err();
    assert!(err.to_string().contains("max_summands"), "{err}");
    let codec = BatchCryptCodec::new(16, 4, 1.0, 2048, Quantizer::ExactBound).unwrap();
    assert_eq!(codec.encode(&[0.0, f64::NAN], None).unwrap_err(), Error::NotFinite { index: 1 });
}

#[test]
fn layout_matches_the_specification() {
    // k = 2048, r = 16, m = 10 -> p = 4, w = 21, s = 97 (algorithms.md §2.4).
    let codec = BatchCryptCodec::new(16, 10, 1.0, 2048, Quantizer::ExactBound).unwrap();
    assert_eq!((codec.padding_bits(), codec.layout().slot_bits, codec.layout().slots), (4, 21, 97));
    let codec = BatchCryptCodec::new(16, 1, 1.0, 2048, Quantizer::ExactBound).unwrap();
    assert_eq!(codec.padding_bits(), 0);
}

#[test]
fn daciq_table_matches_bisection_and_is_monotonic() {
    for bits in 2..=32 {
        let solved = solve_alpha_factor(bits);
        assert!((solved - alpha_factor(bits).unwrap()).abs() < 1e-3, "b={bits}: {solved}");
    }
    assert!(ALPHA_FACTORS.windows(2).all(|w| w[0] < w[1]));
    // r = 16, m = 10 -> b_eff = 12 -> A = 4.8877 (not BatchCrypt's A(16) = 5.8294).
    let alpha = clipping_threshold(&[1.0, 0.5], &[-1.0, -0.8], 1000, 16, 10, true).unwrap();
    let sigma = 0.540208 * 2.0 / (2.0 * (2000f64).ln()).sqrt();
    assert!((alpha - 4.8877 * sigma).abs() < 1e-9);
    assert!(clipping_threshold(&[1.0], &[], 10, 16, 2, true).is_err());
    assert_eq!(clipping_threshold(&[0.0], &[0.0], 10, 16, 2, true).unwrap(), 1.0);
}

#[test]
fn flbooster_sums_are_close_and_need_the_count() {
    let codec = FlBoosterCodec::new(30, 4, 1.0, 2048).unwrap();
    assert_eq!(codec.layout().slots, (2048 - 2) / 32);
    let a = vec![0.5, -0.25, 1.0, -1.0, 0.0];
    let b = vec![-0.5, 0.75, 1.0, -1.0, 0.1];
    let mut total = codec.encode(&a).unwrap().limbs;
    add_packed(&mut total, &codec.encode(&b).unwrap().limbs);
    let sum = codec.decode(&total, 5, 2).unwrap();
    for ((s, x), y) in sum.iter().zip(&a).zip(&b) {
        assert!((s - (x + y)).abs() < 1e-8, "{s} vs {}", x + y);
    }
    assert!(matches!(codec.decode(&total, 5, 5), Err(Error::TooManySummands { .. })));
}
