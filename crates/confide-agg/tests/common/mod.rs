//! Shared helpers of the integration tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use confide_agg::{Kind, Outcome, RoundSpec, TeeRound, Tracker};

pub fn spec(round_id: u64, kind: Kind, participants: u32, slice_length: u32, vector_length: u64, weights: Vec<f32>) -> RoundSpec {
    RoundSpec {
        round_id,
        session_hash: confide_agg::mix64(0xC0FF_EE00 ^ round_id),
        kind,
        participants,
        num_slices: vector_length.div_ceil(u64::from(slice_length)) as u32,
        slice_length,
        vector_length,
        weights,
        paillier: None,
        tee: if kind.is_tee() { Some(TeeRound { session: "job-1".into(), round: 3, attempt: 0, rule: None }) } else { None },
    }
}

/// Slice `index` of a participant's vector as little-endian bytes.
pub fn slice_bytes(spec: &RoundSpec, values: &[f32], index: u32) -> Vec<u8> {
    let start = index as usize * spec.slice_length as usize;
    let n = spec.n_valid(index).unwrap();
    values[start..start + n].iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Feeds (participant, index) arrivals; returns the assembled output vector.
pub fn run(tracker: &mut Tracker, spec: &RoundSpec, data: &[Vec<f32>], order: &[(u32, u32)]) -> Vec<Option<Vec<u8>>> {
    let mut out = vec![None; spec.num_slices as usize];
    for &(p, i) in order {
        let payload = slice_bytes(spec, &data[p as usize], i);
        if let Outcome::Completed(bytes) = tracker.ingest(spec, p, i, &payload).unwrap() {
            assert!(out[i as usize].is_none(), "slice {i} completed twice");
            out[i as usize] = Some(bytes);
        }
    }
    out
}

/// float64 reference of sum(w x)/sum(w) (or the sum) and the error scale sum|w x|/wsum.
pub fn reference(data: &[Vec<f32>], weights: &[f32], mean: bool) -> (Vec<f64>, Vec<f64>) {
    let n = data[0].len();
    let wsum: f64 = weights.iter().map(|w| f64::from(*w)).sum();
    let div = if mean { wsum } else { 1.0 };
    let mut value = vec![0f64; n];
    let mut scale = vec![0f64; n];
    for (x, w) in data.iter().zip(weights) {
        for j in 0..n {
            value[j] += f64::from(*w) * f64::from(x[j]);
            scale[j] += (f64::from(*w) * f64::from(x[j])).abs();
        }
    }
    (value.iter().map(|v| v / div).collect(), scale.iter().map(|s| s / div).collect())
}

pub fn assert_close(got: &[f32], want: &[f64], scale: &[f64]) {
    assert_eq!(got.len(), want.len());
    for j in 0..got.len() {
        let err = (f64::from(got[j]) - want[j]).abs();
        assert!(err <= 1e-5 * scale[j] + 1e-30, "value {j}: got {} want {} (scale {})", got[j], want[j], scale[j]);
    }
}
