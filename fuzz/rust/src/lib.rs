//! Fixtures shared by the fuzz targets: the fixed Paillier key that the seed corpora were
//! encrypted under (fuzz/fixtures/, written by fuzz/make_corpus.py), so that the fuzzer starts
//! from ciphertext blocks whose key id matches and reaches the parsing behind that check.

use confide_paillier::EncryptionKey;
use std::sync::OnceLock;

/// Canonical bytes of the fixture public key (2048 bits).
pub const FIXTURE_PUBLIC_KEY: &[u8] = include_bytes!("../../fixtures/paillier_public_key.bin");

/// The fixture public key, parsed once per process.
///
/// # Panics
/// If the committed fixture does not parse (a broken checkout, not a finding).
pub fn fixture_key() -> &'static EncryptionKey {
    static KEY: OnceLock<EncryptionKey> = OnceLock::new();
    KEY.get_or_init(|| match EncryptionKey::from_bytes(FIXTURE_PUBLIC_KEY) {
        Ok(key) => key,
        Err(error) => panic!("fuzz/fixtures/paillier_public_key.bin does not parse: {error}"),
    })
}
