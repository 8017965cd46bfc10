//! Public behaviour of confide-paillier: homomorphic identities, CRT vs public
//! paths, wire round-trips and rejection of malformed input.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use confide_paillier::{with_threads, Ciphertext, CiphertextBlock, DecryptionKey, Encoding, EncryptionKey, Error, Integer, Randomizer};
use proptest::prelude::*;
use std::sync::OnceLock;

fn key() -> &'static DecryptionKey {
    static KEY: OnceLock<DecryptionKey> = OnceLock::new();
    KEY.get_or_init(|| {
        let key = DecryptionKey::generate(2048).unwrap();
        // Small windows keep the test tables tiny; the arithmetic is the same.
        let public = key.encryption_key().with_window(4).unwrap();
        DecryptionKey::from_primes(key.primes().0.clone(), key.primes().1.clone(), Some(public)).unwrap()
    })
}

fn below_n() -> impl Strategy<Value = Integer> {
    proptest::collection::vec(any::<u8>(), 1..256).prop_map(|bytes| {
        let value = Integer::from_digits(&bytes, rug::integer::Order::Msf);
        value % key().encryption_key().n()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn addition_is_homomorphic(a in below_n(), b in below_n()) {
        let public = key().encryption_key();
        let sum = public.add(&public.encrypt(&a).unwrap(), &key().encrypt(&b).unwrap());
        prop_assert_eq!(key().decrypt(&sum).unwrap(), (a + b) % public.n());
    }

    #[test]
    fn every_encryption_path_decrypts(m in below_n()) {
        let public = key().encryption_key();
        for c in [
            public.encrypt_with(&m, Randomizer::FixedBase).unwrap(),
            public.encrypt_with(&m, Randomizer::Classical).unwrap(),
            key().encrypt_with(&m, Randomizer::FixedBase).unwrap(),
            key().encrypt_with(&m, Randomizer::Classical).unwrap(),
        ] {
            prop_assert_eq!(&key().decrypt(&c).unwrap(), &m);
        }
    }

    #[test]
    fn scalar_plain_and_negation_identities(a in below_n(), b in below_n(), s in any::<i64>()) {
        let public = key().encryption_key();
        let n = public.n();
        let c = key().encrypt(&a).unwrap();
        let scaled = public.mul_scalar(&c, &Integer::from(s)).unwrap();
        let want = (Integer::from(&a * s) % n + n) % n;
        prop_assert_eq!(key().decrypt(&scaled).unwrap(), want);
        let plus = public.add_plain(&c, &b).unwrap();
        prop_assert_eq!(key().decrypt(&plus).unwrap(), Integer::from(&a + &b) % n);
        let negated = public.negate(&c).unwrap();
        prop_assert_eq!(key().decrypt(&public.add(&c, &negated)).unwrap(), 0);
        let fresh = public.rerandomize(&c).unwrap();
        prop_assert_ne!(&fresh, &c);
        prop_assert_eq!(key().decrypt(&fresh).unwrap(), a);
    }

    #[test]
    fn signed_window_round_trips(v in any::<i64>()) {
        let public = key().encryption_key();
        let encoded = public.encode_signed(&Integer::from(v)).unwrap();
        let c = public.encrypt(&encoded).unwrap();
        prop_assert_eq!(key().decrypt_signed(&c).unwrap(), v);
    }
}

#[test]
fn vector_forms_match_scalar_forms_on_any_thread_count() {
    let public = key().encryption_key();
    let plaintexts: Vec<Integer> = (0..40u32).map(|i| Integer::from(i) * 7919u32).collect();
    for threads in [1, 2, 3] {
        with_threads(threads, || {
            let a = key().encrypt_many(&plaintexts, Randomizer::FixedBase).unwrap();
            let b = public.encrypt_many(&plaintexts, Randomizer::FixedBase).unwrap();
            let c = public.encrypt_many(&plaintexts, Randomizer::FixedBase).unwrap();
            let summed = public.sum_many(&[&a, &b, &c]).unwrap();
            let folded: Vec<Ciphertext> = a.iter().zip(&b).zip(&c).map(|((x, y), z)| public.add(&public.add(x, y), z)).collect();
            assert_eq!(summed, folded);
            let decrypted = key().decrypt_many(&summed).unwrap();
            for (got, m) in decrypted.iter().zip(&plaintexts) {
                assert_eq!(*got, Integer::from(m * 3u32));
            }
            let negated = public.negate_many(&a).unwrap();
            assert!(key().decrypt_many(&public.add_many(&a, &negated).unwrap()).unwrap().iter().all(|m| *m == 0));
        })
        .unwrap();
    }
}

#[test]
fn key_sizes_outside_the_supported_set_are_refused() {
    assert_eq!(DecryptionKey::generate(1024).unwrap_err(), Error::UnsupportedKeySize { bits: 1024 });
    let small = Integer::from(3233u32); // 61 · 53
    let err = EncryptionKey::from_parts(small, Integer::from(2u32), 512).unwrap_err();
    assert!(matches!(err, Error::InvalidParameter { field: "n", .. }), "{err}");
}

#[test]
fn public_and_secret_keys_round_trip_byte_exact() {
    let public = key().encryption_key();
    let bytes = public.to_bytes();
    let back = EncryptionKey::from_bytes(&bytes).unwrap();
    assert_eq!(&back, public);
    assert_eq!(back.to_bytes(), bytes);
    let secret = key().to_secret_bytes();
    let restored = DecryptionKey::from_secret_bytes(&secret).unwrap();
    assert_eq!(restored.to_secret_bytes(), secret);
    assert!(!format!("{restored:?}").contains(&key().primes().0.to_string()));
    let mut tampered = bytes.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    assert!(matches!(EncryptionKey::from_bytes(&tampered), Err(Error::Malformed { .. })));
}

#[test]
fn ciphertext_blocks_round_trip_and_reject_bad_input() {
    let public = key().encryption_key();
    let plaintexts: Vec<Integer> = (1..6u32).map(Integer::from).collect();
    let block = CiphertextBlock {
        key_id: public.key_id(),
        encoding: Encoding::BatchCrypt,
        params: vec![1, 1, 16],
        flags: 0,
        ciphertexts: public.encrypt_many(&plaintexts, Randomizer::FixedBase).unwrap(),
    };
    let bytes = block.to_bytes(public).unwrap();
    let parsed = CiphertextBlock::from_bytes(&bytes, public).unwrap();
    assert_eq!(parsed, block);
    assert_eq!(parsed.to_bytes(public).unwrap(), bytes);

    let body = bytes.len() - 5 * public.ciphertext_bytes();
    let elem = public.ciphertext_bytes();
    // c = 0 in element 2
    let mut zero = bytes.clone();
    zero[body + 2 * elem..body + 3 * elem].fill(0);
    assert_eq!(CiphertextBlock::from_bytes(&zero, public).unwrap_err(), Error::CiphertextOutOfRange { index: 2 });
    // c >= n^2 in element 4
    let mut big = bytes.clone();
    big[body + 4 * elem..body + 5 * elem].fill(0xff);
    assert_eq!(CiphertextBlock::from_bytes(&big, public).unwrap_err(), Error::CiphertextOutOfRange { index: 4 });
    // wrong length
    assert!(matches!(CiphertextBlock::from_bytes(&bytes[..bytes.len() - 1], public), Err(Error::Malformed { .. })));
    // wrong key
    let other = DecryptionKey::generate(2048).unwrap();
    assert!(matches!(CiphertextBlock::from_bytes(&bytes, other.encryption_key()), Err(Error::KeyMismatch { .. })));
    assert!(matches!(block.to_bytes(other.encryption_key()), Err(Error::KeyMismatch { .. })));
    // out-of-range inputs to single operations
    assert!(matches!(public.encrypt(public.n()), Err(Error::PlaintextOutOfRange { .. })));
    assert_eq!(key().decrypt(&Ciphertext::new(public, Integer::from(1)).unwrap()).unwrap(), 0);
    assert!(matches!(Ciphertext::new(public, Integer::new()), Err(Error::CiphertextOutOfRange { index: 0 })));
    assert!(matches!(Ciphertext::new(public, public.n_squared().clone()), Err(Error::CiphertextOutOfRange { index: 0 })));
}

#[test]
fn larger_keys_work_on_every_path() {
    // 3072- and 4096-bit n² need 119 and 158 radix-2^52 digits: the IFMA engine's
    // largest sizes (a regression test for an accumulator sized for 80 digits).
    for bits in [3072u32, 4096] {
        let key = DecryptionKey::generate(bits).unwrap();
        let public = key.encryption_key();
        let plaintexts: Vec<Integer> = (0..11u32).map(|i| Integer::from(i) << (bits - 20)).collect();
        let a = public.encrypt_many(&plaintexts, Randomizer::FixedBase).unwrap();
        let b = key.encrypt_many(&plaintexts, Randomizer::FixedBase).unwrap();
        let sum = public.add_many(&a, &b).unwrap();
        let want: Vec<Integer> = plaintexts.iter().map(|m| Integer::from(m * 2u32) % public.n()).collect();
        assert_eq!(key.decrypt_many(&sum).unwrap(), want, "{bits} bits");
        assert_eq!(key.decrypt(&a[3]).unwrap(), plaintexts[3]);
    }
}
