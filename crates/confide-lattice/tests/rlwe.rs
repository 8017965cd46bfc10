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
    for bits in [16, 24, 32] {
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

#[test]
fn any_threshold_of_the_summed_shares_rebuild_the_key_sum_of_the_parties_that_sent() {
    use confide_lattice::shamir::{add_shares, reconstruct_key_sum, share_key};
    let ring = Ring::new(Params::new(1024, 16).unwrap());
    let mut rng = ChaCha20Rng::seed_from_u64(11);
    let (parties, threshold) = (5usize, 3usize);
    let a = ring.public_poly(&[4; 32], 0);
    let keys: Vec<_> = (0..parties).map(|_| ring.secret_key(&mut rng)).collect();
    let shares: Vec<_> = keys.iter().map(|k| share_key(k, threshold, parties, &mut rng).unwrap()).collect();
    // party 2 (index 1) drops before its ciphertext arrives: the sum and the summed shares leave it out
    let sent = [0usize, 2, 3, 4];
    let mut sum = vec![0u64; 1024];
    let mut expected = vec![0u64; 1024];
    for &i in &sent {
        let m = message(&mut rng, 1024, 12);
        add_assign(&mut sum, &ring.encrypt(&a, &keys[i], &m, &mut rng).unwrap());
        expected.iter_mut().zip(&m).for_each(|(e, v)| *e += v);
    }
    let summed: Vec<Vec<u16>> = (0..parties)
        .map(|j| {
            let mut s = vec![0u16; 1024];
            sent.iter().for_each(|&i| add_shares(&mut s, &shares[i][j]).unwrap());
            s
        })
        .collect();
    let direct = KeySum::of(sent.iter().map(|&i| &keys[i]));
    for chosen in [[1usize, 3, 4], [0, 2, 3], [2, 3, 4]] {
        let points: Vec<u64> = chosen.iter().map(|&j| j as u64 + 1).collect();
        let picked: Vec<&[u16]> = chosen.iter().map(|&j| summed[j].as_slice()).collect();
        let rebuilt = reconstruct_key_sum(&points, &picked, sent.len()).unwrap();
        assert_eq!(rebuilt.coefficients(), direct.coefficients(), "points {points:?}");
        assert_eq!(ring.decrypt(&a, &rebuilt, &sum).unwrap(), expected);
    }
    // fewer than the threshold rebuild something else
    let two = reconstruct_key_sum(&[1, 2], &[&summed[0], &summed[1]], sent.len()).unwrap();
    assert_ne!(two.coefficients(), direct.coefficients());
    assert_eq!(
        share_key(&keys[0], 6, 5, &mut rng).unwrap_err().to_string(),
        "threshold 6 of 5 parties: needs 1 <= threshold <= parties <= 32760"
    );
    assert!(reconstruct_key_sum(&[1, 1], &[&summed[0], &summed[1]], 4).is_err());
}

#[test]
fn vectors_of_any_length_encrypt_by_blocks_and_decrypt_to_their_sum() {
    let ring = Ring::new(Params::new(1024, 16).unwrap());
    let mut rng = ChaCha20Rng::seed_from_u64(21);
    let seed = [9u8; 32];
    let len = 2500; // three blocks, the last one partly padding
    let keys: Vec<_> = (0..3).map(|_| ring.secret_key(&mut rng)).collect();
    let mut sum = vec![0u64; ring.blocks(len) * 1024];
    let mut expected = vec![0u64; len];
    for key in &keys {
        let values = message(&mut rng, len, 14);
        add_assign(&mut sum, &ring.encrypt_vector(&seed, key, &values, &mut rng).unwrap());
        expected.iter_mut().zip(&values).for_each(|(e, v)| *e += v);
    }
    assert_eq!(sum.len(), 3072);
    assert_eq!(ring.decrypt_vector(&seed, &KeySum::of(&keys), &sum, len).unwrap(), expected);
    // another round's seed gives other public polynomials: the sum no longer decrypts
    assert_ne!(ring.decrypt_vector(&[8u8; 32], &KeySum::of(&keys), &sum, len).unwrap(), expected);
    let mut too_big = vec![0u64; len];
    too_big[2049] = 1 << 16;
    assert_eq!(
        ring.encrypt_vector(&seed, &keys[0], &too_big, &mut rng).unwrap_err(),
        LatticeError::Message { index: 2049, value: 1 << 16, bits: 16 }
    );
}

#[test]
fn packed_lanes_sum_mod_q_and_decrypt_with_the_key_sum() {
    use confide_lattice::packed::{fold_words, Packing};
    let ring = Ring::new(Params::new(1024, 16).unwrap());
    let mut rng = ChaCha20Rng::seed_from_u64(31);
    let seed = [5u8; 32];
    let bits = Packing::max_bits(7, 21); // 7 parties: lanes of bits + 3, the error a quarter of the scale
    let packing = Packing::new(bits, 7, 21).unwrap();
    let len = 2501; // blocks of 2048 values, the last one cut, and an odd value alone in its word
    let keys: Vec<_> = (0..7).map(|_| ring.secret_key(&mut rng)).collect();
    let mut total = vec![0u64; 1251];
    let mut expected = vec![0u32; len];
    for key in &keys {
        let values: Vec<u32> = (0..len).map(|_| (rng.next_u64() as u32) >> (32 - bits)).collect();
        let words = ring.encrypt_packed(&seed, 3, &ring.key_ntt(key), &values, &packing, &mut rng).unwrap();
        assert_eq!(words.len(), 1251); // eight bytes for two values: four a value, like float32
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        fold_words(&mut total, &bytes).unwrap(); // the data plane's fold
        expected.iter_mut().zip(&values).for_each(|(e, v)| *e = (*e + v) & ((1 << bits) - 1));
    }
    assert_eq!(ring.decrypt_packed(&seed, 3, &ring.key_sum_ntt(&KeySum::of(&keys)), &total, &packing, len).unwrap(), expected);
    assert_eq!(ring.residual_packed(&seed, 3, &ring.key_sum_ntt(&KeySum::of(&keys)), &total, &packing, len).unwrap(), 0);
    // another slice's public polynomials, or six of the seven keys: errors spread over the scale
    for (slice, keys) in [(4u32, &keys[..]), (3, &keys[..6])] {
        let wrong = ring.residual_packed(&seed, slice, &ring.key_sum_ntt(&KeySum::of(keys)), &total, &packing, len).unwrap();
        assert!(wrong > 1251 / 2, "{wrong} of 1251 words past the bound");
        assert!(matches!(
            ring.decrypt_packed(&seed, slice, &ring.key_sum_ntt(&KeySum::of(keys)), &total, &packing, len),
            Err(LatticeError::Residual { of: 1251, .. })
        ));
    }
    let narrow = Packing::new(bits, 6, 21).unwrap();
    assert!(matches!(
        ring.decrypt_packed(&seed, 3, &ring.key_sum_ntt(&KeySum::of(&keys)), &total, &narrow, len),
        Err(LatticeError::Noise { parties: 7, .. })
    ));
    assert!(matches!(
        ring.decrypt_packed(&seed, 3, &ring.key_sum_ntt(&KeySum::of(&keys)), &total, &packing, len + 2),
        Err(LatticeError::Length { got: 1251, expected: 1252, .. })
    ));
    assert_eq!(
        ring.encrypt_packed(&seed, 0, &ring.key_ntt(&keys[0]), &[0, 1 << bits], &packing, &mut rng).unwrap_err(),
        LatticeError::Message { index: 1, value: 1 << bits, bits }
    );
}
