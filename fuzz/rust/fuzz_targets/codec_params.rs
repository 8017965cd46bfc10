//! `confide_codec::params::from_params` (the TLV parameters of a packed ciphertext block): the
//! first byte picks BatchCrypt or FLBooster, the rest is the TLV. Errors, never panics; accepted
//! parameters survive a re-encoding with the same meaning.
#![no_main]

use confide_codec::params::{from_params, to_params};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, tlv)) = data.split_first() else { return };
    let batchcrypt = kind & 1 == 1;
    let Ok((codec, plaintext_bits, length, summed)) = from_params(tlv, batchcrypt) else { return };
    let again = to_params(&codec, plaintext_bits, length, summed);
    match from_params(&again, batchcrypt) {
        Ok(decoded) => assert_eq!(decoded, (codec, plaintext_bits, length, summed), "re-encoded parameters differ"),
        Err(error) => panic!("re-encoded parameters do not parse: {error}"),
    }
});
