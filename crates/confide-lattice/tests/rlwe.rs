//! The key-homomorphic RLWE primitives: sums of ciphertexts decrypt with the sum of the keys only.

use confide_lattice::{add_assign, KeySum, LatticeError, Params, Ring, Q};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

fn message(rng: &mut ChaCha20Rng, n: usize, bits: u32) -> Vec<u64> {
    (0..n).map(|_| rng.next_u64() & ((1u64 << bits) - 1)).collect()
}

#[test]
fn one_party_decrypts_its_own_message() {
    let ring = Ring::new(Params::new(4096, 16).unwrap());
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let a = ring.public_poly(&[7; 32], 0);
    let key = ring.secret_key(&mut rng);
    let m = message(&mut rng, 4096, 16);
    let b = ring.encrypt(&a, &key, &m, &mut rng).unwrap();
    assert_eq!(ring.decrypt(&a, &KeySum::of([&key]), &b).unwrap(), m);
    assert_ne!(b[..16], m[..16]);
}

#[test]
fn the_sum_of_ten_ciphertexts_decrypts_with_the_sum_of_ten_keys_only() {
    for bits in [16, 24] {
        let ring = Ring::new(Params::new(4096, bits).unwrap());
        let mut rng = ChaCha20Rng::seed_from_u64(bits as u64);
        let a = ring.public_poly(&[3; 32], 5);
        let t = 1u64 << bits;
        let mut keys = Vec::new();
        let mut sum = vec![0u64; 4096];
        let mut expected = vec![0u64; 4096];
        for _ in 0..10 {
            let key = ring.secret_key(&mut rng);
            let m = message(&mut rng, 4096, bits);
            add_assign(&mut sum, &ring.encrypt(&a, &key, &m, &mut rng).unwrap());
            for (e, v) in expected.iter_mut().zip(&m) {
                *e = (*e + v) % t; // the sum wraps mod t: the decryption still holds
            }
            keys.push(key);
        }
        assert_eq!(ring.decrypt(&a, &KeySum::of(&keys), &sum).unwrap(), expected, "t = 2^{bits}");
        // nine of the ten keys decrypt nothing: about 1 coefficient in t matches by chance
        let partial = ring.decrypt(&a, &KeySum::of(&keys[..9]), &sum).unwrap();
        let agree = partial.iter().zip(&expected).filter(|(x, y)| x == y).count();
        assert!(agree < 8, "{agree} coefficients of 4096 agree without one key");
    }
}

#[test]
fn public_polynomials_are_uniform_and_differ_by_seed_and_index() {
    let ring = Ring::new(Params::new(1024, 16).unwrap());
    let a = ring.public_poly(&[1; 32], 0);
    assert_eq!(a, ring.public_poly(&[1; 32], 0));
    assert_ne!(a, ring.public_poly(&[1; 32], 1));
    assert_ne!(a, ring.public_poly(&[2; 32], 0));
    assert!(a.iter().all(|&v| v < Q));
    let mean = a.iter().map(|&v| v as f64 / Q as f64).sum::<f64>() / a.len() as f64;
    assert!((mean - 0.5).abs() < 0.05, "mean {mean}");
}

#[test]
fn bad_input_names_the_field_and_the_limit() {
    assert_eq!(Params::new(1000, 16), Err(LatticeError::Dimension(1000)));
    assert_eq!(Params::new(4096, 49), Err(LatticeError::PlaintextBits(49)));
    let ring = Ring::new(Params::new(1024, 8).unwrap());
    let mut rng = ChaCha20Rng::seed_from_u64(9);
    let a = ring.public_poly(&[0; 32], 0);
    let key = ring.secret_key(&mut rng);
    let mut m = vec![0u64; 1024];
    m[17] = 256;
    assert_eq!(ring.encrypt(&a, &key, &m, &mut rng).unwrap_err(), LatticeError::Message { index: 17, value: 256, bits: 8 });
    let error = ring.encrypt(&a, &key, &[0; 10], &mut rng).unwrap_err();
    assert_eq!(error.to_string(), "the message has 10 coefficients, the ring 1024");
    // no margin at all: a 44-bit t leaves Delta / 2 = 2^17 against wraps of 2^44 - 2^16 + 1
    let wide = Params::new(1024, 44).unwrap();
    assert_eq!(wide.max_parties(), 0);
    let wide_ring = Ring::new(wide);
    let key = wide_ring.secret_key(&mut rng);
    let b = wide_ring.encrypt(&a, &key, &vec![1; 1024], &mut rng).unwrap();
    assert!(matches!(wide_ring.decrypt(&a, &KeySum::of([&key]), &b), Err(LatticeError::Noise { parties: 1, .. })));
}

#[test]
fn secrets_are_ternary_and_errors_small() {
    let ring = Ring::new(Params::new(4096, 16).unwrap());
    let mut rng = ChaCha20Rng::seed_from_u64(4);
    let key = ring.secret_key(&mut rng);
    let counts = [-1i64, 0, 1].map(|v| key.coefficients().iter().filter(|&&c| c == v).count());
    assert_eq!(counts.iter().sum::<usize>(), 4096);
    assert!(counts.iter().all(|&c| (1200..1550).contains(&c)), "{counts:?}");
    // the error of one encryption: decrypting a zero message leaves b - a*s = e, within [-eta, eta]
    let a = ring.public_poly(&[8; 32], 0);
    let b = ring.encrypt(&a, &key, &[0; 4096], &mut rng).unwrap();
    let zero_key = KeySum::of([&key]);
    assert_eq!(ring.decrypt(&a, &zero_key, &b).unwrap(), vec![0; 4096]);
}
