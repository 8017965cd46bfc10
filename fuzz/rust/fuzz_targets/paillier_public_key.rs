//! `EncryptionKey::from_bytes` (a public key as it travels in round headers and vertical
//! messages): any bytes give a key or an error, never a panic; an accepted key is canonical,
//! so its bytes are exactly the input.
#![no_main]

use confide_paillier::EncryptionKey;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(key) = EncryptionKey::from_bytes(data) {
        assert_eq!(key.to_bytes(), data, "an accepted public key must re-encode to the same bytes");
    }
});
