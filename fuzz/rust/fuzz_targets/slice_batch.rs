//! `confide_agg::wire::{parse_batch, parse_push}` (every message of a PushSlices stream, read in
//! place by the aggregator's data path): errors, never panics; an accepted batch's payload range
//! lies inside the message and its lengths add up to it.
#![no_main]

use confide_agg::wire::{parse_batch, parse_push, BatchView, PushBody};
use libfuzzer_sys::fuzz_target;

fn check(view: &BatchView, message: &[u8]) {
    let end = view.payload_start.checked_add(view.payload_len);
    assert!(end.is_some_and(|end| end <= message.len()), "payload range outside the message");
    assert_eq!(view.indices.len(), view.n_valid.len());
    assert_eq!(view.indices.len(), view.lengths.len());
    let total: u64 = view.lengths.iter().map(|&l| u64::from(l)).sum();
    assert_eq!(total, view.payload_len as u64, "lengths do not add up to the payload");
}

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(view)) = parse_batch(data) {
        check(&view, data);
    }
    if let Ok(PushBody::Slices(view)) = parse_push(data) {
        check(&view, data);
    }
});
