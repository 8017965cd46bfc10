//! The byte inputs of `confide-psi`: a peer's blinded points (`PsiKey::blind`) and a peer's
//! tags (`match_tags`). The first byte picks which; errors, never panics.
#![no_main]

use confide_psi::{match_tags, tags, PsiKey, Tag, POINT_BYTES, TAG_BYTES};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn key() -> &'static PsiKey {
    static KEY: OnceLock<PsiKey> = OnceLock::new();
    KEY.get_or_init(|| match PsiKey::from_bytes(&[7; 32]) {
        Ok(key) => key,
        Err(error) => panic!("fixed PSI key refused: {error}"),
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else { return };
    if which & 1 == 0 {
        let (points, _) = rest.as_chunks::<POINT_BYTES>();
        if let Ok(blinded) = key().blind(points) {
            assert_eq!(blinded.len(), points.len());
            let _: Vec<Tag> = tags(&blinded);
        }
    } else {
        let (all, _) = rest.as_chunks::<TAG_BYTES>();
        let (left, right) = all.split_at(all.len() / 2);
        if let Ok(pairs) = match_tags(left, right) {
            for (i, j) in pairs {
                assert_eq!(left[i], right[j]);
            }
        }
    }
});
