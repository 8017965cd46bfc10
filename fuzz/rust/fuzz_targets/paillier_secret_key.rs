//! `DecryptionKey::from_secret_bytes` (a party's exported key file read back from disk): any
//! bytes give a key or an error, never a panic; an accepted key re-exports to the same bytes.
#![no_main]

use confide_paillier::DecryptionKey;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(key) = DecryptionKey::from_secret_bytes(data) {
        assert_eq!(key.to_secret_bytes(), data, "an accepted secret key must re-export to the same bytes");
    }
});
