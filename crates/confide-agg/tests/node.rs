//! DataPlane: concurrency, routing, checkpoints, shutdown; Paillier rounds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use common::*;
use confide_agg::{DataPlane, Kind};
use std::sync::Arc;

fn vectors(participants: usize, len: usize) -> Vec<Vec<f32>> {
    (0..participants).map(|p| (0..len).map(|j| (((j * 7919 + p * 104729) % 2003) as f32 - 1000.0) / 37.0).collect()).collect()
}

#[test]
fn concurrent_pushes_give_the_float64_mean() {
    let (participants, slice_length, len) = (24u32, 64u32, 64 * 37 + 5);
    let weights: Vec<f32> = (0..participants).map(|p| 1.0 + p as f32 / 3.0).collect();
    let data = vectors(participants as usize, len);
    let plane = Arc::new(DataPlane::new(3, 1 << 20, None, None).unwrap());
    let s = spec(7, Kind::F32Mean, participants, slice_length, len as u64, weights.clone());
    plane.open_round(s.clone()).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (plane, data, s) = (plane.clone(), data.clone(), s.clone());
            std::thread::spawn(move || {
                let mut done = Vec::new();
                // Each thread pushes every participant p with p % 4 == t (and re-sends some: duplicates).
                for p in (0..participants).filter(|p| p % 4 == t) {
                    for chunk in [(0..s.num_slices).rev().collect::<Vec<_>>(), (0..s.num_slices).step_by(5).collect()] {
                        let mut batch = Vec::new();
                        let mut slices = Vec::new();
                        for i in chunk {
                            let bytes = slice_bytes(&s, &data[p as usize], i);
                            slices.push((i, batch.len(), bytes.len()));
                            batch.extend_from_slice(&bytes);
                        }
                        let r = plane.push(7, p, Arc::from(batch), &slices).unwrap();
                        done.extend(r.completed);
                    }
                }
                done
            })
        })
        .collect();
    let mut out = vec![None; s.num_slices as usize];
    for t in threads {
        for (i, b) in t.join().unwrap() {
            assert!(out[i as usize].is_none());
            out[i as usize] = Some(b);
        }
    }
    let got: Vec<f32> = out.into_iter().flat_map(|b| f32s(&b.unwrap())).collect();
    let (want, scale) = reference(&data, &weights, true);
    assert_close(&got, &want, &scale);
    let st = plane.stats();
    assert_eq!(st.tracker.aggregated, u64::from(participants * s.num_slices));
    assert_eq!(st.tracker.completed, u64::from(s.num_slices));
    assert_eq!(st.tracker.staged_bytes, 0);
    assert!(st.tracker.peak_staged_bytes > 0);
    assert_eq!(st.per_worker_aggregated.len(), 3);
    assert!(st.per_worker_aggregated.iter().all(|&a| a > 0));
    plane.close_round(7).unwrap();
    drop(plane); // joins the workers
}

#[test]
fn checkpoint_restore_missing_and_errors() {
    let data = vectors(3, 100);
    let s = spec(8, Kind::F32Sum, 3, 16, 100, vec![1.0; 3]);
    let push_all = |plane: &DataPlane, p: u32| {
        let mut batch = Vec::new();
        let mut slices = Vec::new();
        for i in 0..s.num_slices {
            let b = slice_bytes(&s, &data[p as usize], i);
            slices.push((i, batch.len(), b.len()));
            batch.extend_from_slice(&b);
        }
        plane.push(8, p, Arc::from(batch), &slices).unwrap()
    };
    let dir = std::env::temp_dir().join(format!("confide-agg-node-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let a = DataPlane::new(2, 64, Some(dir.clone()), None).unwrap();
    a.open_round(s.clone()).unwrap();
    assert_eq!(push_all(&a, 0).accepted, 7);
    assert!(a.stats().tracker.spills > 0, "a 64-byte cap spills");
    assert_eq!(push_all(&a, 2).completed.len(), 0);
    let missing = a.missing(8).unwrap();
    assert_eq!(missing, (0..7).map(|i| (i, vec![1])).collect::<Vec<_>>());
    let blob = a.checkpoint_round(8).unwrap();
    assert_eq!(a.stats().tracker.staged_bytes, 0);
    drop(a);
    // Another node with another worker count finishes the round.
    let b = DataPlane::new(3, 1 << 20, None, None).unwrap();
    b.open_round(s.clone()).unwrap();
    b.restore_round(8, &blob).unwrap();
    assert_eq!(b.missing(8).unwrap(), missing);
    let r = push_all(&b, 1);
    assert_eq!(r.completed.len(), 7);
    let got: Vec<f32> = r.completed.iter().flat_map(|(_, b)| f32s(b)).collect();
    let want: Vec<f32> = (0..100).map(|j| data[0][j] + data[2][j] + data[1][j]).collect();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-4 * w.abs().max(1.0));
    }
    assert_eq!(push_all(&b, 1).late, 7);
    // Errors name the slice and the limit.
    let e = b.push(8, 0, Arc::from(vec![0u8; 10]), &[(2, 0, 10)]).unwrap_err().to_string();
    assert_eq!(e, "slice 2: payload holds 10 bytes; 16 float32 values need 64");
    let e = b.push(8, 5, Arc::from(vec![0u8; 64]), &[(2, 0, 64)]).unwrap_err().to_string();
    assert_eq!(e, "slice 2: participant 5 must be < participants = 3");
    let e = b.push(8, 0, Arc::from(vec![0u8; 64]), &[(9, 0, 64)]).unwrap_err().to_string();
    assert_eq!(e, "slice 9: index must be < num_slices = 7");
    assert!(b.push(99, 0, Arc::from(vec![0u8; 64]), &[(0, 0, 64)]).is_err());
    assert!(b.open_round(s.clone()).is_err(), "already open");
    b.close_round(8).unwrap();
    assert!(b.push(8, 0, Arc::from(vec![0u8; 64]), &[(0, 0, 64)]).is_err());
}

#[test]
fn same_index_same_worker_across_rounds() {
    let plane = DataPlane::new(4, 1 << 20, None, None).unwrap();
    for round in [1u64, 2] {
        let mut s = spec(round, Kind::U32Sum, 1, 1, 64, vec![1.0]);
        s.session_hash = 12345;
        plane.open_round(s).unwrap();
        for i in 0..64u32 {
            plane.push(round, 0, Arc::from(vec![1u8; 4]), &[(i, 0, 4)]).unwrap();
        }
    }
    let per = plane.stats().per_worker_aggregated;
    let expected: Vec<u64> = (0..4).map(|w| 2 * (0..64).filter(|&i| confide_agg::worker_for(12345, i, 4) == w).count() as u64).collect();
    assert_eq!(per, expected);
}

mod paillier {
    use super::*;
    use confide_codec::params::{to_params, Codec};
    use confide_codec::FlBoosterCodec;
    use confide_paillier::{CiphertextBlock, DecryptionKey, Encoding, Integer, Randomizer};
    use rug::integer::Order;

    #[test]
    fn product_decrypts_to_the_sum() {
        let key = DecryptionKey::generate(2048).unwrap();
        let public = key.encryption_key().with_window(4).unwrap();
        let codec = FlBoosterCodec::new(16, 8, 1.0, public.bits()).unwrap();
        let (participants, slice_length, len) = (3u32, 150u32, 260usize);
        let data: Vec<Vec<f32>> =
            (0..participants as usize).map(|p| (0..len).map(|j| (((j * 31 + p * 17) % 200) as f32 - 100.0) / 101.0).collect()).collect();
        let mut s = spec(11, Kind::PaillierProduct, participants, slice_length, len as u64, vec![1.0; 3]);
        s.paillier = Some(Arc::new(public.clone()));
        let encrypt = |values: &[f32]| -> Vec<u8> {
            let packed = codec.encode(values).unwrap();
            let layout = codec.layout();
            let plaintexts: Vec<Integer> = packed.limbs.chunks(layout.limbs).map(|l| Integer::from_digits(l, Order::Lsf)).collect();
            let block = CiphertextBlock {
                key_id: public.key_id(),
                encoding: Encoding::FlBooster,
                params: to_params(&Codec::FlBooster(codec.clone()), public.bits(), values.len() as u64, 1),
                flags: 0,
                ciphertexts: public.encrypt_many(&plaintexts, Randomizer::FixedBase).unwrap(),
            };
            block.to_bytes(&public).unwrap()
        };
        let plane = DataPlane::new(2, 1 << 20, None, None).unwrap();
        plane.open_round(s.clone()).unwrap();
        let mut results = vec![None; 2];
        for p in [2u32, 0, 1] {
            for i in [1u32, 0] {
                let start = (i * slice_length) as usize;
                let payload = encrypt(&data[p as usize][start..start + s.n_valid(i).unwrap()]);
                let r = plane.push(11, p, Arc::from(payload.clone()), &[(i, 0, payload.len())]).unwrap();
                let again = plane.push(11, p, Arc::from(payload.clone()), &[(i, 0, payload.len())]).unwrap();
                assert_eq!(again.duplicates + again.late, 1);
                for (index, bytes) in r.completed {
                    results[index as usize] = Some(bytes);
                }
            }
        }
        let wrong = encrypt(&data[0][..10]);
        let mut s2 = s.clone();
        s2.round_id = 12;
        plane.open_round(s2).unwrap();
        let e = plane.push(12, 0, Arc::from(wrong.clone()), &[(0, 0, wrong.len())]).unwrap_err().to_string();
        assert!(e.contains("packs 10 values; slice holds 150"), "{e}");
        let step = 2.0 / f64::from((1u32 << 16) - 1);
        for (i, bytes) in results.into_iter().enumerate() {
            let block = CiphertextBlock::from_bytes(&bytes.unwrap(), &public).unwrap();
            let (codec_back, _, length, summed) = confide_codec::params::from_params(&block.params, false).unwrap();
            assert_eq!(summed, 3);
            let plain = key.decrypt_many(&block.ciphertexts).unwrap();
            let mut limbs = Vec::new();
            for m in &plain {
                let mut d = m.to_digits::<u64>(Order::Lsf);
                d.resize(codec.layout().limbs, 0);
                limbs.extend(d);
            }
            let Codec::FlBooster(c) = codec_back else { panic!("codec") };
            let sums = c.decode(&limbs, length as usize, summed).unwrap();
            let start = i * slice_length as usize;
            for (j, v) in sums.iter().enumerate() {
                let want: f64 = data.iter().map(|d| f64::from(d[start + j])).sum();
                assert!((v - want).abs() <= 3.0 * step, "slice {i} value {j}: {v} vs {want}");
            }
        }
    }
}

fn view(indices: &[u32], n_valid: &[u32], lengths: &[u32]) -> confide_agg::BatchView {
    confide_agg::BatchView {
        indices: indices.to_vec(),
        n_valid: n_valid.to_vec(),
        lengths: lengths.to_vec(),
        payload_start: 0,
        payload_len: lengths.iter().map(|&l| l as usize).sum(),
    }
}

#[test]
fn push_batch_checks_range_values_and_share_and_counts_contributions() {
    // 3 slices of 4 values, the last holding 2; this node's share owns slices 0 and 2.
    let plane = DataPlane::new(2, 1 << 20, None, None).unwrap();
    let s = spec(9, Kind::F32Sum, 2, 4, 10, vec![1.0; 2]);
    plane.open_round_share(s, Some((1, 3, &[0, 2]))).unwrap();
    let message = |lens: &[u32]| -> confide_agg::node::SharedBytes {
        let total: u32 = lens.iter().sum();
        Arc::new(Arc::<[u8]>::from(vec![0u8; total as usize]))
    };
    let err = plane.push_batch(9, 0, message(&[16]), &view(&[3], &[4], &[16])).unwrap_err();
    assert_eq!(err.to_string(), "slice.index 3 is out of range (num_slices 3)");
    let err = plane.push_batch(9, 0, message(&[16]), &view(&[2], &[4], &[16])).unwrap_err();
    assert_eq!(err.to_string(), "slice.n_valid of slice 2 is 4; it must be 2");
    let err = plane.push_batch(9, 0, message(&[16]), &view(&[1], &[4], &[16])).unwrap_err();
    assert_eq!(err.to_string(), "slice 1 belongs to another share than 1 of this 3-node cluster");
    assert_eq!(plane.contributions(9).unwrap(), vec![0, 0]); // nothing of a refused batch folded
    let r = plane.push_batch(9, 0, message(&[16, 8]), &view(&[0, 2], &[4, 2], &[16, 8])).unwrap();
    assert_eq!((r.accepted, r.duplicates), (2, 0));
    let r = plane.push_batch(9, 0, message(&[16]), &view(&[0], &[4], &[16])).unwrap();
    assert_eq!((r.accepted, r.duplicates), (0, 1));
    let r = plane.push_batch(9, 1, message(&[8]), &view(&[2], &[2], &[8])).unwrap();
    assert_eq!(r.completed.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![2]);
    assert_eq!(plane.contributions(9).unwrap(), vec![2, 1]);
    // a batch whose second slice holds NaN: the first stays folded and counted
    plane.open_round(spec(11, Kind::F32Sum, 2, 4, 10, vec![1.0; 2])).unwrap();
    let mut bytes = vec![0u8; 16];
    bytes.extend(f32::NAN.to_le_bytes().repeat(4));
    let shared: confide_agg::node::SharedBytes = Arc::new(Arc::<[u8]>::from(bytes));
    let err = plane.push_batch(11, 0, shared, &view(&[0, 1], &[4, 4], &[16, 16])).unwrap_err();
    assert!(err.to_string().contains("non-finite"), "{err}");
    assert_eq!(plane.contributions(11).unwrap(), vec![1, 0]);
    assert!(plane.open_round_share(spec(10, Kind::F32Sum, 2, 4, 10, vec![1.0; 2]), Some((0, 2, &[5]))).is_err());
    plane.close_round(9).unwrap();
    assert!(plane.contributions(9).is_err());
}
