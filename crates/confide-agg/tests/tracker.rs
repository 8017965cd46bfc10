//! Property tests of the state tracker (algorithms.md §6.2).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use common::*;
use confide_agg::{Kind, Outcome, RoundSpec, Tracker};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    participants: u32,
    slice_length: u32,
    vector_length: u64,
    weights: Vec<f32>,
    data: Vec<Vec<f32>>,
    order: Vec<(u32, u32)>,
    dups: Vec<usize>,
}

fn case() -> impl Strategy<Value = Case> {
    (1u32..7, 1u32..33, 1u64..150).prop_flat_map(|(participants, slice_length, vector_length)| {
        let slices = vector_length.div_ceil(u64::from(slice_length)) as u32;
        let pairs: Vec<(u32, u32)> = (0..participants).flat_map(|p| (0..slices).map(move |i| (p, i))).collect();
        let total = pairs.len();
        (
            proptest::collection::vec(0.1f32..4.0, participants as usize),
            proptest::collection::vec(proptest::collection::vec(-1000f32..1000.0, vector_length as usize), participants as usize),
            Just(pairs).prop_shuffle(),
            proptest::collection::vec(0..total, 0..8),
        )
            .prop_map(move |(weights, data, order, dups)| Case {
                participants,
                slice_length,
                vector_length,
                weights,
                data,
                order,
                dups,
            })
    })
}

/// The arrival order with duplicate re-sends inserted right after some arrivals.
fn with_duplicates(c: &Case) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    for (k, pair) in c.order.iter().enumerate() {
        out.push(*pair);
        if c.dups.contains(&k) {
            out.push(*pair);
        }
    }
    out
}

fn assemble(spec: &RoundSpec, out: &[Option<Vec<u8>>]) -> Vec<u8> {
    assert!(out.iter().all(Option::is_some), "every slice completes");
    let bytes: Vec<u8> = out.iter().flatten().flatten().copied().collect();
    assert_eq!(bytes.len() as u64, 4 * spec.vector_length);
    bytes
}

fn feed_counting(tracker: &mut Tracker, spec: &RoundSpec, data: &[Vec<f32>], order: &[(u32, u32)]) -> (Vec<Option<Vec<u8>>>, usize) {
    let mut out = vec![None; spec.num_slices as usize];
    let mut dups = 0;
    for &(p, i) in order {
        match tracker.ingest(spec, p, i, &slice_bytes(spec, &data[p as usize], i)).unwrap() {
            Outcome::Completed(b) => out[i as usize] = Some(b),
            Outcome::Duplicate | Outcome::Late => dups += 1,
            Outcome::Accepted => {}
        }
    }
    (out, dups)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn f32_mean_matches_float64_in_any_order_with_duplicates(c in case()) {
        let spec = spec(1, Kind::F32Mean, c.participants, c.slice_length, c.vector_length, c.weights.clone());
        let (want, scale) = reference(&c.data, &c.weights, true);
        let order = with_duplicates(&c);
        let mut tracker = Tracker::new(usize::MAX, None, "t");
        let (out, rejected) = feed_counting(&mut tracker, &spec, &c.data, &order);
        prop_assert_eq!(rejected, order.len() - c.order.len());
        assert_close(&f32s(&assemble(&spec, &out)), &want, &scale);
        let mut reversed = c.order.clone();
        reversed.reverse();
        let mut tracker = Tracker::new(usize::MAX, None, "t");
        let out = run(&mut tracker, &spec, &c.data, &reversed);
        assert_close(&f32s(&assemble(&spec, &out)), &want, &scale);
        prop_assert_eq!(tracker.stats().staged_bytes, 0);
        prop_assert_eq!(tracker.stats().open_entries, 0);
    }

    #[test]
    fn f32_sum_matches_float64(c in case()) {
        let ones = vec![1.0; c.participants as usize];
        let spec = spec(2, Kind::F32Sum, c.participants, c.slice_length, c.vector_length, ones.clone());
        let (want, scale) = reference(&c.data, &ones, false);
        let mut tracker = Tracker::new(usize::MAX, None, "t");
        let out = run(&mut tracker, &spec, &c.data, &with_duplicates(&c));
        assert_close(&f32s(&assemble(&spec, &out)), &want, &scale);
    }

    #[test]
    fn f32_stack_keeps_every_participants_slice_in_its_row(c in case()) {
        let spec = spec(5, Kind::F32Stack, c.participants, c.slice_length, c.vector_length, vec![1.0; c.participants as usize]);
        let mut tracker = Tracker::new(usize::MAX, None, "t");
        let out = run(&mut tracker, &spec, &c.data, &with_duplicates(&c));
        let m = c.participants as usize;
        for (index, block) in out.iter().enumerate() {
            let block = f32s(block.as_ref().expect("every slice completes"));
            let start = index * c.slice_length as usize;
            let n = spec.n_valid(index as u32).unwrap();
            prop_assert_eq!(block.len(), m * n);
            for p in 0..m {
                prop_assert_eq!(&block[p * n..(p + 1) * n], &c.data[p][start..start + n]);
            }
        }
        prop_assert_eq!(tracker.stats().staged_bytes, 0);
    }

    #[test]
    fn u32_wrapping_sums_exact_in_any_order(c in case(), seed in any::<u32>()) {
        let spec = spec(3, Kind::U32Sum, c.participants, c.slice_length, c.vector_length, vec![1.0; c.participants as usize]);
        let words: Vec<Vec<u32>> = (0..c.participants).map(|p| (0..c.vector_length as u32).map(|j| seed.wrapping_mul(2654435761).wrapping_add(j.wrapping_mul(0x9E37_79B9) ^ p.wrapping_mul(0x85EB_CA6B))).collect()).collect();
        let data: Vec<Vec<f32>> = words.iter().map(|w| w.iter().map(|v| f32::from_bits(*v)).collect()).collect();
        let want: Vec<u32> = (0..c.vector_length as usize).map(|j| words.iter().fold(0u32, |a, w| a.wrapping_add(w[j]))).collect();
        for order in [with_duplicates(&c), c.order.iter().rev().copied().collect()] {
            let mut tracker = Tracker::new(usize::MAX, None, "t");
            let out = run(&mut tracker, &spec, &data, &order);
            let got: Vec<u32> = assemble(&spec, &out).chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            prop_assert_eq!(&got, &want);
        }
    }

    #[test]
    fn checkpoint_restore_equals_uninterrupted(c in case(), cut in 0.0f64..1.0, drop_last in any::<bool>(), stacked in any::<bool>()) {
        // a stacked slice's entry holds m rows, not one sum
        let spec = if stacked {
            spec(4, Kind::F32Stack, c.participants, c.slice_length, c.vector_length, vec![1.0; c.participants as usize])
        } else {
            spec(4, Kind::F32Mean, c.participants, c.slice_length, c.vector_length, c.weights.clone())
        };
        let mut whole = Tracker::new(usize::MAX, None, "a");
        let want = run(&mut whole, &spec, &c.data, &c.order);
        // First part, then checkpoint (as if the remaining participants were missing).
        let split = ((c.order.len() as f64) * cut) as usize;
        let mut first = Tracker::new(usize::MAX, None, "b");
        let mut got = run(&mut first, &spec, &c.data, &c.order[..split]);
        let missing = first.missing(&spec).unwrap();
        let remaining: usize = missing.iter().map(|(_, m)| m.len()).sum();
        let blob = first.checkpoint_round(&spec).unwrap();
        prop_assert_eq!(first.stats().staged_bytes, 0);
        prop_assert!(first.missing(&spec).unwrap().is_empty());
        // Restore into a fresh tracker (or the same one) and finish.
        let mut second = if drop_last { Tracker::new(usize::MAX, None, "c") } else { first };
        second.restore_round(&spec, &blob).unwrap();
        prop_assert_eq!(second.missing(&spec).unwrap(), missing);
        let rest = run(&mut second, &spec, &c.data, &c.order[split..]);
        for (g, r) in got.iter_mut().zip(rest) {
            if g.is_none() { *g = r; }
        }
        prop_assert_eq!(&got, &want, "bit-identical to an uninterrupted run");
        prop_assert!(remaining <= c.order.len() - split);
        // Restoring the same blob twice is refused (slices already open or completed).
        if !blob.is_empty() && split > 0 && split < c.order.len() {
            let mut third = Tracker::new(usize::MAX, None, "d");
            third.restore_round(&spec, &blob).unwrap();
            let again = third.restore_round(&spec, &blob);
            let has_entries = !confide_agg::RoundCheckpoint::decode(&blob).unwrap().entries.is_empty();
            prop_assert_eq!(again.is_err(), has_entries);
        }
    }

    #[test]
    fn spill_under_tiny_cap_is_identical(c in case(), to_disk in any::<bool>()) {
        let spec = spec(5, Kind::F32Mean, c.participants, c.slice_length, c.vector_length, c.weights.clone());
        let mut free = Tracker::new(usize::MAX, None, "a");
        let want = run(&mut free, &spec, &c.data, &with_duplicates(&c));
        let dir = std::env::temp_dir().join(format!("confide-agg-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut capped = Tracker::new(1, to_disk.then(|| dir.clone()), format!("spill-{}", rand_name()));
        let got = run(&mut capped, &spec, &c.data, &with_duplicates(&c));
        prop_assert_eq!(&got, &want);
        let s = capped.stats();
        prop_assert_eq!(s.spills, s.reloads + s.spilled_entries);
        prop_assert!(s.peak_staged_bytes <= 4 * u64::from(c.slice_length));
        prop_assert_eq!(s.staged_bytes, 0);
    }
}

fn rand_name() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[test]
fn errors_name_field_and_limit() {
    let spec = spec(9, Kind::F32Sum, 3, 256, 1000, vec![1.0; 3]);
    let mut t = Tracker::new(usize::MAX, None, "e");
    let e = t.ingest(&spec, 0, 1, &[0u8; 1000]).unwrap_err().to_string();
    assert_eq!(e, "slice 1: payload holds 1000 bytes; 256 float32 values need 1024");
    let e = t.ingest(&spec, 0, 3, &[0u8; 1000]).unwrap_err().to_string();
    assert!(e.contains("232 float32 values need 928"), "{e}");
    let e = t.ingest(&spec, 0, 4, &[0u8; 4]).unwrap_err().to_string();
    assert_eq!(e, "slice 4: index must be < num_slices = 4");
    let e = t.ingest(&spec, 3, 0, &[0u8; 1024]).unwrap_err().to_string();
    assert_eq!(e, "slice 0: participant 3 must be < participants = 3");
    let mut bad = vec![0u8; 1024];
    bad[40..44].copy_from_slice(&f32::NAN.to_le_bytes());
    let e = t.ingest(&spec, 0, 0, &bad).unwrap_err().to_string();
    assert!(e.starts_with("slice 0: payload holds a non-finite"), "{e}");
    assert_eq!(t.stats().open_entries, 0, "a refused slice opens nothing");
    let mut wrong = spec.clone();
    wrong.num_slices = 5;
    assert!(wrong.validate().unwrap_err().to_string().contains("num_slices"));
    assert!(confide_agg::RoundCheckpoint::decode(b"garbage").is_err());
    let mut blob = t.checkpoint_round(&spec).unwrap();
    blob[10] ^= 1;
    assert!(t.restore_round(&spec, &blob).unwrap_err().to_string().contains("checksum"));
}

#[test]
fn late_and_duplicate() {
    let spec = spec(10, Kind::F32Sum, 2, 4, 4, vec![1.0; 2]);
    let mut t = Tracker::new(usize::MAX, None, "l");
    let x = [1f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    assert_eq!(t.ingest(&spec, 0, 0, &x).unwrap(), Outcome::Accepted);
    assert_eq!(t.ingest(&spec, 0, 0, &x).unwrap(), Outcome::Duplicate);
    assert!(matches!(t.ingest(&spec, 1, 0, &x).unwrap(), Outcome::Completed(b) if f32s(&b) == vec![2.0, 4.0, 6.0, 8.0]));
    assert_eq!(t.ingest(&spec, 1, 0, &x).unwrap(), Outcome::Late);
    let s = t.stats();
    assert_eq!((s.aggregated, s.completed, s.duplicates, s.late), (2, 1, 1, 1));
    t.close_round(10);
    assert_eq!(t.ingest(&spec, 1, 0, &x).unwrap(), Outcome::Accepted, "close forgets the round");
}

#[test]
fn narrow_slices_are_widened_then_summed_as_float32() {
    let values = [1.5f32, -2.25, 1024.0, 0.001];
    // float16 and bfloat16: exact for these values' magnitudes up to their precision.
    let f16: Vec<u8> = values.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
    let bf16: Vec<u8> = values.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect();
    for (kind, payload) in [(Kind::F16Sum, &f16), (Kind::Bf16Sum, &bf16)] {
        let round = spec(20, kind, 2, 4, 4, vec![1.0; 2]);
        let mut t = Tracker::new(usize::MAX, None, "n");
        assert_eq!(t.ingest(&round, 0, 0, payload).unwrap(), Outcome::Accepted);
        let Outcome::Completed(sum) = t.ingest(&round, 1, 0, payload).unwrap() else { panic!("{kind:?} did not complete") };
        let want: Vec<f32> = payload
            .chunks_exact(2)
            .map(|c| {
                2.0 * if kind == Kind::F16Sum {
                    half::f16::from_le_bytes([c[0], c[1]]).to_f32()
                } else {
                    half::bf16::from_le_bytes([c[0], c[1]]).to_f32()
                }
            })
            .collect();
        assert_eq!(f32s(&sum), want, "{kind:?}");
        let e = t.ingest(&spec(21, kind, 2, 4, 4, vec![1.0; 2]), 0, 0, &[0u8; 16]).unwrap_err().to_string();
        assert!(e.contains("payload holds 16 bytes; 4 ") && e.contains("values need 8"), "{e}");
    }
    // int8 with a scale in front: q * scale, each party its own scale.
    let q8 = |scale: f32, q: [i8; 4]| -> Vec<u8> { scale.to_le_bytes().into_iter().chain(q.iter().map(|v| *v as u8)).collect() };
    let spec = spec(22, Kind::Q8Sum, 2, 4, 4, vec![1.0; 2]);
    let mut t = Tracker::new(usize::MAX, None, "q");
    assert_eq!(t.ingest(&spec, 0, 0, &q8(0.5, [127, -127, 2, 0])).unwrap(), Outcome::Accepted);
    let Outcome::Completed(sum) = t.ingest(&spec, 1, 0, &q8(0.25, [4, 4, -8, 1])).unwrap() else { panic!("q8 did not complete") };
    assert_eq!(f32s(&sum), vec![64.5, -62.5, -1.0, 0.25]);
    let e = t.ingest(&spec, 0, 0, &[0u8; 16]).unwrap_err().to_string();
    assert!(e.contains("4 int8 values and their float32 scale need 8"), "{e}");
    let e = Tracker::new(usize::MAX, None, "s").ingest(&spec, 0, 0, &q8(f32::NAN, [0; 4])).unwrap_err().to_string();
    assert!(e.contains("scale is NaN"), "{e}");
}

#[test]
fn lattice_words_sum_mod_q_survive_a_checkpoint_and_refuse_words_out_of_range() {
    const Q: u64 = confide_lattice::Q;
    let words = |w: &[u64]| w.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    // 5 values in slices of 3: two words (the second holding one value), then one word
    let spec = spec(30, Kind::RlweSum, 3, 3, 5, vec![1.0; 3]);
    let mut t = Tracker::new(usize::MAX, None, "r");
    let e = t.ingest(&spec, 0, 0, &[0u8; 12]).unwrap_err().to_string();
    assert_eq!(e, "slice 0: payload holds 12 bytes; 3 values packed two to a lattice word need 16");
    let e = t.ingest(&spec, 1, 0, &words(&[5, Q])).unwrap_err().to_string();
    assert!(e.contains("participant 1: lattice word 1 is") && e.contains("outside [0, q"), "{e}");
    assert_eq!(t.stats().open_entries, 0, "a refused slice opens nothing");
    assert_eq!(t.ingest(&spec, 0, 0, &words(&[Q - 1, 7])).unwrap(), Outcome::Accepted);
    let e = t.ingest(&spec, 1, 0, &words(&[1, Q + 3])).unwrap_err().to_string();
    assert!(e.contains("lattice word 1"), "{e}");
    assert_eq!(t.ingest(&spec, 1, 0, &words(&[2, Q - 8])).unwrap(), Outcome::Accepted, "the refusal left the sum as it was");
    let blob = t.checkpoint_round(&spec).unwrap();
    let mut restored = Tracker::new(usize::MAX, None, "r2");
    restored.restore_round(&spec, &blob).unwrap();
    let Outcome::Completed(sum) = restored.ingest(&spec, 2, 0, &words(&[3, 4])).unwrap() else { panic!("slice 0 did not complete") };
    assert_eq!(sum, words(&[(Q - 1 + 2 + 3) % Q, (7 + Q - 8 + 4) % Q]));
}
