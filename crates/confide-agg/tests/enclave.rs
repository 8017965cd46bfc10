//! The tee kinds: key wrapping, sealed slices, known answers, tee mean = plain mean.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use common::*;
use confide_agg::enclave::{open_with, seal_with, slice_aad, wrap_session_key, RESULT_PARTICIPANT};
use confide_agg::{DataPlane, Enclave, Kind, SimulatedEnclave};
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
