//! `CiphertextBlock::from_bytes` under the fixture key (ciphertext vectors from parties and the
//! aggregator), then the codec parameters it carries: errors, never panics; an accepted block
//! re-encodes to the input, and every ciphertext is in (0, n^2).
#![no_main]

use confide_codec::params::from_params;
use confide_fuzz::fixture_key;
use confide_paillier::{CiphertextBlock, Encoding};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let key = fixture_key();
    let Ok(block) = CiphertextBlock::from_bytes(data, key) else { return };
    match block.to_bytes(key) {
        Ok(bytes) => assert_eq!(bytes, data, "an accepted block must re-encode to the same bytes"),
        Err(error) => panic!("an accepted block does not re-encode: {error}"),
    }
    for ciphertext in &block.ciphertexts {
        assert!(*ciphertext.as_integer() > 0 && ciphertext.as_integer() < key.n_squared());
    }
    if matches!(block.encoding, Encoding::BatchCrypt | Encoding::FlBooster) {
        let _ = from_params(&block.params, block.encoding == Encoding::BatchCrypt);
    }
});
