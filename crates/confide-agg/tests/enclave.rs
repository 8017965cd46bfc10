//! The tee kinds: key wrapping, sealed slices, known answers, tee mean = plain mean.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use common::*;
use confide_agg::enclave::{open_with, seal_with, slice_aad, wrap_session_key, RESULT_PARTICIPANT};
use confide_agg::{DataPlane, Enclave, Kind, RobustRule, SimulatedEnclave};
use std::sync::Arc;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

const ENCLAVE_SECRET: [u8; 32] = [0x11; 32];
const EPH_SECRET: [u8; 32] = [0x22; 32];
const WRAP_NONCE: [u8; 12] = [0x33; 12];
const SESSION_KEY: [u8; 32] = [0x44; 32];
const SLICE_NONCE: [u8; 12] = [0x55; 12];

#[test]
fn known_answers() {
    let enclave = SimulatedEnclave::from_secret(ENCLAVE_SECRET, 1).unwrap();
    let public = enclave.public_key();
    let wrapped = wrap_session_key(&public, EPH_SECRET, WRAP_NONCE, "job-1", &SESSION_KEY).unwrap();
    let aad = slice_aad("job-1", 3, 0, 1, 7);
    let plain: Vec<u8> = [1.0f32, -2.5, 3.25].iter().flat_map(|v| v.to_le_bytes()).collect();
    let sealed = seal_with(&SESSION_KEY, SLICE_NONCE, &aad, &plain).unwrap();
    println!("enclave_secret = {}", hex(&ENCLAVE_SECRET));
    println!("enclave_pub    = {}", hex(&public));
    println!("eph_secret     = {}", hex(&EPH_SECRET));
    println!("wrap nonce     = {}", hex(&WRAP_NONCE));
    println!("session_key    = {}", hex(&SESSION_KEY));
    println!("wrapped(job-1) = {}", hex(&wrapped));
    println!("slice aad      = {}", hex(&aad));
    println!("sealed slice   = {}", hex(&sealed));
    assert_eq!(wrapped.len(), 92);
    assert_eq!(&wrapped[32..44], &WRAP_NONCE);
    assert_eq!(hex(&aad), format!("{}{}00{}", hex(b"confide/tee/slice/v1\x00"), hex(b"job-1"), "03000000000000000100000007000000"));
    assert_eq!(sealed.len(), 12 + 12 + 16);
    assert_eq!(open_with(&SESSION_KEY, &aad, &sealed).unwrap(), plain);
    enclave.provision("job-1", &wrapped).unwrap();
    enclave.provision("job-1", &wrapped).unwrap();
    // Pinned values; the same bytes come out of Python's `cryptography`
    // (X25519PrivateKey.from_private_bytes, HKDF(SHA256), AESGCM) for these inputs.
    assert_eq!(hex(&public), KAT_PUBLIC);
    assert_eq!(hex(&wrapped), KAT_WRAPPED);
    assert_eq!(hex(&sealed), KAT_SEALED);
}

const KAT_PUBLIC: &str = "7b4e909bbe7ffe44c465a220037d608ee35897d31ef972f07f74892cb0f73f13";
const KAT_WRAPPED: &str = "0faa684ed28867b97f4a6a2dee5df8ce974e76b7018e3f22a1c4cf2678570f2033333333333333333333333375113abcf6f5783fe00ee1e7cb8a2312955018a07f8789f7ca7187fdfc794c689a3e25b715bcd2811a4e366880c46b40";
const KAT_SEALED: &str = "555555555555555555555555281d47376bb9ab8d9dd000c88a3e53dbce747c5f3ee437c364ca21a4";

#[test]
fn wrap_unwrap_and_refusals() {
    let enclave = SimulatedEnclave::new(2).unwrap();
    let public = enclave.public_key();
    let wrapped = wrap_session_key(&public, [7; 32], [1; 12], "job-a", &[9; 32]).unwrap();
    assert!(enclave.provision("job-b", &wrapped).is_err(), "session is bound into the AAD and HKDF info");
    let mut tampered = wrapped.clone();
    tampered[60] ^= 1;
    assert!(enclave.provision("job-a", &tampered).is_err());
    assert!(enclave.provision("job-a", &wrapped[..91]).unwrap_err().to_string().contains("92"));
    let mut zero = wrapped.clone();
    zero[..32].fill(0);
    assert!(enclave.provision("job-a", &zero).unwrap_err().to_string().contains("all-zero"));
    enclave.provision("job-a", &wrapped).unwrap();
    let other = wrap_session_key(&public, [8; 32], [1; 12], "job-a", &[10; 32]).unwrap();
    assert!(enclave.provision("job-a", &other).unwrap_err().to_string().contains("different key"));
    let report = enclave.report();
    assert_eq!(report.mode, "simulation");
    assert!(!report.hardware_isolation);
    assert_eq!(report.measurement.len(), 64);
}

#[test]
fn tee_mean_equals_plain_mean() {
    let (participants, slice_length, len) = (5u32, 32u32, 200usize);
    let weights: Vec<f32> = (0..participants).map(|p| 0.5 + p as f32).collect();
    let data: Vec<Vec<f32>> =
        (0..participants as usize).map(|p| (0..len).map(|j| ((j * 13 + p * 7) % 101) as f32 - 50.0).collect()).collect();
    let enclave = Arc::new(SimulatedEnclave::new(2).unwrap());
    let key = [0x42u8; 32];
    enclave.provision("job-1", &wrap_session_key(&enclave.public_key(), [3; 32], [4; 12], "job-1", &key).unwrap()).unwrap();
    let tee = DataPlane::new(0, 1 << 20, None, Some(enclave.clone() as Arc<dyn Enclave>)).unwrap();
    assert_eq!(tee.workers(), 2);
    let plain = DataPlane::new(2, 1 << 20, None, None).unwrap();
    let ts = spec(1, Kind::TeeF32Mean, participants, slice_length, len as u64, weights.clone());
    let ps = spec(1, Kind::F32Mean, participants, slice_length, len as u64, weights.clone());
    assert!(plain.open_round(ts.clone()).is_err(), "tee kinds need an enclave");
    tee.open_round(ts.clone()).unwrap();
    plain.open_round(ps.clone()).unwrap();
    let tee_info = ts.tee.clone().unwrap();
    let mut tee_out = vec![None; ts.num_slices as usize];
    let mut plain_out = vec![None; ts.num_slices as usize];
    for p in 0..participants {
        let (mut batch, mut slices, mut pbatch, mut pslices) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i in (0..ts.num_slices).rev() {
            let x = slice_bytes(&ts, &data[p as usize], i);
            let aad = slice_aad(&tee_info.session, tee_info.round, tee_info.attempt, p, i);
            let mut nonce = [0u8; 12];
            nonce[..4].copy_from_slice(&p.to_le_bytes());
            nonce[4..8].copy_from_slice(&i.to_le_bytes());
            let sealed = seal_with(&key, nonce, &aad, &x).unwrap();
            slices.push((i, batch.len(), sealed.len()));
            batch.extend_from_slice(&sealed);
            pslices.push((i, pbatch.len(), x.len()));
            pbatch.extend_from_slice(&x);
        }
        if p == 1 {
            // A tampered slice is refused with its index and never aggregated.
            let mut bad = batch.clone();
            let (i, off, _) = slices[2];
            bad[off + 20] ^= 1;
            let e = tee.push(1, p, Arc::from(bad), &slices[2..3]).unwrap_err().to_string();
            assert_eq!(e, format!("slice {i}: AES-GCM authentication failed"));
            // Sealed for participant 1 but sent as participant 2: refused too.
            assert!(tee.push(1, 2, Arc::from(batch.clone()), &slices[..1]).is_err());
        }
        for (i, b) in tee.push(1, p, Arc::from(batch), &slices).unwrap().completed {
            let aad = slice_aad(&tee_info.session, tee_info.round, tee_info.attempt, RESULT_PARTICIPANT, i);
            tee_out[i as usize] = Some(open_with(&key, &aad, &b).unwrap());
        }
        for (i, b) in plain.push(1, p, Arc::from(pbatch), &pslices).unwrap().completed {
            plain_out[i as usize] = Some(b);
        }
        if p == 2 {
            // Sealed checkpoint round trip through the enclave.
            let missing = tee.missing(1).unwrap();
            assert_eq!(missing.len(), ts.num_slices as usize);
            let blob = tee.checkpoint_round(1).unwrap();
            assert!(tee.missing(1).unwrap().is_empty());
            let mut bad = blob.clone();
            bad[30] ^= 1;
            assert!(tee.restore_round(1, &bad).is_err());
            tee.restore_round(1, &blob).unwrap();
            assert_eq!(tee.missing(1).unwrap(), missing);
        }
    }
    assert!(tee_out.iter().all(Option::is_some));
    assert_eq!(tee_out, plain_out, "identical to the plain f32 mean");
    let st = tee.stats();
    assert_eq!(st.tracker.completed, u64::from(ts.num_slices));
    assert_eq!(st.tracker.staged_bytes, 0);
}

/// One participant's narrow slice `index` (float16, bfloat16 or int8 with its scale in front).
fn narrow_slice(kind: Kind, values: &[f32]) -> Vec<u8> {
    match kind {
        Kind::F16Sum => values.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect(),
        Kind::Bf16Sum => values.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
        Kind::Q8Sum => {
            let scale = values.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            scale.to_le_bytes().into_iter().chain(values.iter().map(|v| (v / scale).round() as i8 as u8)).collect()
        }
        other => panic!("{other:?} is not narrow"),
    }
}

#[test]
fn tee_narrow_sums_equal_the_plain_narrow_sums_and_a_wrong_size_names_the_rule() {
    let (participants, slice_length, len) = (3u32, 16u32, 40usize);
    let data: Vec<Vec<f32>> =
        (0..participants as usize).map(|p| (0..len).map(|j| ((j * 7 + p * 5) % 23) as f32 * 0.125 - 1.0).collect()).collect();
    let enclave = Arc::new(SimulatedEnclave::new(1).unwrap());
    let key = [0x24u8; 32];
    enclave.provision("job-1", &wrap_session_key(&enclave.public_key(), [5; 32], [6; 12], "job-1", &key).unwrap()).unwrap();
    let tee = DataPlane::new(0, 1 << 20, None, Some(enclave.clone() as Arc<dyn Enclave>)).unwrap();
    let plain = DataPlane::new(1, 1 << 20, None, None).unwrap();
    let kinds = [(Kind::TeeF16Sum, Kind::F16Sum, 2usize), (Kind::TeeBf16Sum, Kind::Bf16Sum, 2), (Kind::TeeQ8Sum, Kind::Q8Sum, 1)];
    for (round, (tee_kind, plain_kind, width)) in (10u64..).zip(kinds) {
        assert_eq!(tee_kind.opened(), plain_kind);
        assert_eq!(Kind::parse(tee_kind.name()).unwrap(), tee_kind);
        let ts = spec(round, tee_kind, participants, slice_length, len as u64, vec![1.0; participants as usize]);
        let ps = spec(round, plain_kind, participants, slice_length, len as u64, vec![1.0; participants as usize]);
        tee.open_round(ts.clone()).unwrap();
        plain.open_round(ps.clone()).unwrap();
        let info = ts.tee.clone().unwrap();
        let (mut tee_out, mut plain_out) = (vec![None; ts.num_slices as usize], vec![None; ts.num_slices as usize]);
        for p in 0..participants {
            let (mut batch, mut slices, mut pbatch, mut pslices) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for i in 0..ts.num_slices {
                let start = (i * slice_length) as usize;
                let n = ts.n_valid(i).unwrap();
                let x = narrow_slice(plain_kind, &data[p as usize][start..start + n]);
                assert_eq!(x.len(), if plain_kind == Kind::Q8Sum { 4 + n } else { width * n });
                let aad = slice_aad(&info.session, info.round, info.attempt, p, i);
                let sealed = seal_with(&key, [p as u8, i as u8, round as u8, 0, 0, 0, 0, 0, 0, 0, 0, 0], &aad, &x).unwrap();
                assert_eq!(Some(sealed.len()), ts.payload_bytes(i).unwrap());
                slices.push((i, batch.len(), sealed.len()));
                batch.extend_from_slice(&sealed);
                pslices.push((i, pbatch.len(), x.len()));
                pbatch.extend_from_slice(&x);
            }
            if p == 0 {
                // A slice sealed as float32 words is refused before it is opened, naming the rule.
                let wide = seal_with(&key, [9; 12], &slice_aad(&info.session, info.round, info.attempt, 0, 0), &[0u8; 4 * 16]).unwrap();
                let e = tee.push(round, 0, Arc::from(wide.clone()), &[(0, 0, wide.len())]).unwrap_err().to_string();
                let values = match plain_kind {
                    Kind::F16Sum => "float16 values",
                    Kind::Bf16Sum => "bfloat16 values",
                    _ => "int8 values and their float32 scale",
                };
                let inner = if plain_kind == Kind::Q8Sum { 4 + 16 } else { 32 };
                assert_eq!(
                    e,
                    format!("slice 0: payload holds 92 bytes; 16 sealed {values} need {} (12 nonce + {inner} + 16 tag)", 28 + inner)
                );
            }
            for (i, b) in tee.push(round, p, Arc::from(batch), &slices).unwrap().completed {
                let aad = slice_aad(&info.session, info.round, info.attempt, RESULT_PARTICIPANT, i);
                tee_out[i as usize] = Some(open_with(&key, &aad, &b).unwrap());
            }
            for (i, b) in plain.push(round, p, Arc::from(pbatch), &pslices).unwrap().completed {
                plain_out[i as usize] = Some(b);
            }
        }
        assert!(tee_out.iter().all(Option::is_some), "{tee_kind:?}");
        // The enclave's sum is float32, bit for bit the plain narrow kind's.
        assert_eq!(tee_out, plain_out, "{tee_kind:?}");
        let sum: Vec<f32> = tee_out.iter().flat_map(|b| f32s(b.as_ref().unwrap())).collect();
        let want: Vec<f32> = (0..len).map(|j| data.iter().map(|d| d[j]).sum()).collect();
        let tolerance = if plain_kind == Kind::Q8Sum { 0.05 } else { 0.02 };
        assert!(sum.iter().zip(&want).all(|(a, b)| (a - b).abs() <= tolerance), "{tee_kind:?}: {sum:?} vs {want:?}");
        tee.close_round(round).unwrap();
        plain.close_round(round).unwrap();
    }
}

#[test]
fn tee_stack_seals_the_coordinate_wise_estimate_of_the_plain_stack_and_nothing_else() {
    let (participants, slice_length, len) = (5u32, 16u32, 40usize);
    let ones = vec![1.0; participants as usize];
    // participant 4 scales its update by 100: the median and the trimmed mean ignore it
    let data: Vec<Vec<f32>> = (0..participants as usize)
        .map(|p| (0..len).map(|j| (((j * 7 + p * 3) % 11) as f32 - 5.0) * if p == 4 { 100.0 } else { 1.0 }).collect())
        .collect();
    for (round, rule) in [(1u64, RobustRule::Median), (2, RobustRule::TrimmedMean { cut: 1 })] {
        let enclave = Arc::new(SimulatedEnclave::new(2).unwrap());
        let key = [0x17u8; 32];
        enclave.provision("job-1", &wrap_session_key(&enclave.public_key(), [5; 32], [6; 12], "job-1", &key).unwrap()).unwrap();
        let tee = DataPlane::new(0, 1 << 20, None, Some(enclave.clone() as Arc<dyn Enclave>)).unwrap();
        let plain = DataPlane::new(2, 1 << 20, None, None).unwrap();
        let mut ts = spec(round, Kind::TeeF32Stack, participants, slice_length, len as u64, ones.clone());
        assert!(tee.open_round(ts.clone()).is_err(), "a tee stack round without a rule is refused");
        ts.tee.as_mut().unwrap().rule = Some(rule);
        let ps = spec(round, Kind::F32Stack, participants, slice_length, len as u64, ones.clone());
        tee.open_round(ts.clone()).unwrap();
        plain.open_round(ps.clone()).unwrap();
        let info = ts.tee.clone().unwrap();
        let (mut tee_out, mut blocks) = (vec![None; ts.num_slices as usize], vec![None; ts.num_slices as usize]);
        for p in 0..participants {
            let (mut batch, mut slices, mut pbatch, mut pslices) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for i in 0..ts.num_slices {
                let x = slice_bytes(&ts, &data[p as usize], i);
                let aad = slice_aad(&info.session, info.round, info.attempt, p, i);
                let sealed = seal_with(&key, [p as u8, i as u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, round as u8], &aad, &x).unwrap();
                slices.push((i, batch.len(), sealed.len()));
                batch.extend_from_slice(&sealed);
                pslices.push((i, pbatch.len(), x.len()));
                pbatch.extend_from_slice(&x);
            }
            for (i, b) in tee.push(round, p, Arc::from(batch), &slices).unwrap().completed {
                let aad = slice_aad(&info.session, info.round, info.attempt, RESULT_PARTICIPANT, i);
                tee_out[i as usize] = Some(f32s(&open_with(&key, &aad, &b).unwrap()));
            }
            for (i, b) in plain.push(round, p, Arc::from(pbatch), &pslices).unwrap().completed {
                blocks[i as usize] = Some(f32s(&b));
            }
            if p == 2 {
                let blob = tee.checkpoint_round(round).unwrap();
                tee.restore_round(round, &blob).unwrap();
            }
        }
        for (i, (sealed, block)) in tee_out.iter().zip(&blocks).enumerate() {
            let (sealed, block) = (sealed.as_ref().unwrap(), block.as_ref().unwrap());
            assert_eq!(block.len(), sealed.len() * participants as usize, "slice {i}: the enclave seals n values, not the block");
            assert_eq!(sealed, &rule.combine(block, participants as usize), "slice {i}");
            assert!(sealed.iter().all(|v| v.abs() <= 5.0), "slice {i}: the scaled update does not reach the estimate");
        }
    }
}

#[test]
fn a_whole_update_rule_holds_sealed_blocks_and_weighs_the_updates_over_every_slice() {
    let (participants, slice_length, len) = (5u32, 8u32, 20usize);
    let ones = vec![1.0; participants as usize];
    // participant 4 is far from the others in every slice: Multi-Krum (f = 1, k = 4) leaves it out
    let data: Vec<Vec<f32>> =
        (0..participants as usize).map(|p| (0..len).map(|j| if p == 4 { 50.0 } else { ((j + p) % 3) as f32 * 0.1 }).collect()).collect();
    let enclave = Arc::new(SimulatedEnclave::new(2).unwrap());
    let key = [0x29u8; 32];
    enclave.provision("job-1", &wrap_session_key(&enclave.public_key(), [7; 32], [8; 12], "job-1", &key).unwrap()).unwrap();
    let tee = DataPlane::new(0, 1 << 20, None, Some(enclave.clone() as Arc<dyn Enclave>)).unwrap();
    let mut ts = spec(9, Kind::TeeF32Stack, participants, slice_length, len as u64, ones);
    ts.tee.as_mut().unwrap().rule = Some(RobustRule::Krum { byzantine: 1, selected: 4 });
    tee.open_round(ts.clone()).unwrap();
    let info = ts.tee.clone().unwrap();
    let mut held = Vec::new();
    for p in 0..participants {
        for i in 0..ts.num_slices {
            let x = slice_bytes(&ts, &data[p as usize], i);
            let aad = slice_aad(&info.session, info.round, info.attempt, p, i);
            let sealed = seal_with(&key, [p as u8, i as u8, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0], &aad, &x).unwrap();
            held.extend(tee.push(9, p, Arc::from(sealed.clone()), &[(i, 0, sealed.len())]).unwrap().completed);
        }
    }
    assert_eq!(held.len(), ts.num_slices as usize);
    // the host cannot read what it holds: not the session's result, not the updates
    let aad = slice_aad(&info.session, info.round, info.attempt, RESULT_PARTICIPANT, held[0].0);
    assert!(open_with(&key, &aad, &held[0].1).is_err());
    assert!(tee.finish_robust(9, &held[1..]).is_err(), "every slice, once");
    let mut forged = held.clone();
    forged[0].1[20] ^= 1;
    assert!(tee.finish_robust(9, &forged).is_err(), "a block not sealed by the enclave");
    for (i, sealed) in tee.finish_robust(9, &held).unwrap() {
        let aad = slice_aad(&info.session, info.round, info.attempt, RESULT_PARTICIPANT, i);
        let estimate = f32s(&open_with(&key, &aad, &sealed).unwrap());
        let start = i as usize * slice_length as usize;
        for (k, v) in estimate.iter().enumerate() {
            let honest: f32 = (0..4).map(|p| data[p][start + k]).sum::<f32>() / 4.0;
            assert!((v - honest).abs() < 1e-6, "slice {i} value {k}: {v} vs {honest}");
        }
    }
}
