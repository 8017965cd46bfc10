//! `confide_lattice::packed::fold_words` (the aggregator's sum of lattice ciphertext words mod q,
//! on the bytes as they arrived): errors, never panics; accepted words are added mod q and the
//! sum stays under q; a refusal names the first word at least q (or the wrong length) and leaves
//! the running sum as it was, across the fold's chunks of 2,048 words too.
#![no_main]

use confide_lattice::packed::fold_words;
use confide_lattice::Q;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [flags, l0, l1, p0, p1, rest @ ..] = data else { return };
    if rest.is_empty() {
        return;
    }
    // Up to 5,119 words from a short input: the bytes repeat, so a refusal can sit past a chunk.
    let length = usize::from(u16::from_le_bytes([*l0, *l1]) % 5120);
    let mut bytes: Vec<u8> = rest.iter().copied().cycle().take(8 * length).collect();
    if flags & 1 == 1 {
        // Mostly valid words: all reduced under q, but for one raw word at `p` when bit 1 says so.
        let raw = usize::from(u16::from_le_bytes([*p0, *p1]));
        for (i, word) in bytes.chunks_exact_mut(8).enumerate() {
            let value = u64::from_le_bytes(word.try_into().unwrap());
            if !(flags & 2 == 2 && i == raw % length.max(1)) {
                word.copy_from_slice(&(value % Q).to_le_bytes());
            }
        }
    }
    if flags & 4 == 4 && !bytes.is_empty() {
        bytes.pop(); // a length that is not the sum's
    }
    let before: Vec<u64> = (0..length as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % Q).collect();
    let mut acc = before.clone();
    let words: Vec<u64> = bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
    match fold_words(&mut acc, &bytes) {
        Ok(()) => {
            assert_eq!(bytes.len(), 8 * length, "a wrong length was accepted");
            for ((&sum, &old), &word) in acc.iter().zip(&before).zip(&words) {
                assert!(word < Q, "a word at least q was accepted");
                assert_eq!(u128::from(sum), (u128::from(old) + u128::from(word)) % u128::from(Q));
            }
        }
        Err((index, value)) => {
            assert_eq!(acc, before, "a refused fold changed the running sum");
            if bytes.len() == 8 * length {
                assert!(value >= Q, "refused a word under q");
                assert_eq!(words.iter().position(|&w| w >= Q), Some(index), "not the first word at least q");
                assert_eq!(words[index], value);
            }
        }
    }
});
