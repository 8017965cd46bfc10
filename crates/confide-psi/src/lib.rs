//! ECDH private set intersection on ristretto255 (algorithms.md §5.4).
//!
//! The group arithmetic is `curve25519-dalek` (v4, AVX2 backend picked at run time); this
//! crate only arranges it for the protocol:
//!
//! * [`hash_to_group`]: H(id) = ristretto255 one-way map (two Elligator maps, RFC 9496 §4.3.4)
//!   of SHA-512(`u64be(len(dst)) ‖ dst ‖ u64be(len(id)) ‖ id`). Both lengths are written, so
//!   no two (dst, id) pairs hash the same input.
//! * [`PsiKey`]: a secret scalar k drawn from the OS CSPRNG (64 bytes reduced mod ℓ), zeroized
//!   on drop. [`PsiKey::hash_and_blind`] gives k·H(id), [`PsiKey::blind`] gives k·P for a
//!   peer's points; both return canonical 32-byte encodings and run on the current rayon
//!   pool (see [`with_threads`]).
//! * [`tag`]: the first 16 bytes of SHA-256(`"confide-psi-tag"` ‖ encoding). Parties compare
//!   tags, never points: 128 bits make a false match among |X|·|Y| pairs ≈ |X|·|Y|/2^128
//!   (2^-88 for a million ids a side), and a tag reveals nothing the point did not.
//!
//! Two engines give byte-equal results: on CPUs with AVX-512 IFMA, [`lanes`] runs eight points
//! per vector (about 4x dalek here); elsewhere (or with `CONFIDE_DISABLE_IFMA=1`) dalek does,
//! compressing with `double_and_compress_batch` (one field inversion per chunk instead of an
//! inverse square root per point: the key holds k/2 next to k, and enc(2·((k/2)·P)) = enc(k·P)).

use curve25519_dalek::ristretto::{CompressedRistretto, RistrettoPoint};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::Identity;
use rayon::prelude::*;
use sha2::{Digest, Sha256, Sha512};
use zeroize::Zeroize;

#[cfg(target_arch = "x86_64")]
mod lanes;

/// Bytes of a compressed ristretto255 point.
pub const POINT_BYTES: usize = 32;
/// Bytes of a comparison tag.
pub const TAG_BYTES: usize = 16;
/// Domain prefix of [`tag`].
pub const TAG_DOMAIN: &[u8] = b"confide-psi-tag";
/// Longest domain-separation tag accepted by [`hash_to_group`].
pub const MAX_DST_BYTES: usize = 1024;
/// Largest thread count accepted by [`with_threads`].
pub const MAX_THREADS: usize = confide_pool::MAX_THREADS;
/// Elements per batch of the parallel loops (and per batched compression).
const CHUNK: usize = 512;

/// A compressed point.
pub type Point = [u8; POINT_BYTES];
/// A comparison tag.
pub type Tag = [u8; TAG_BYTES];

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in `confide-psi`. Messages name the field and the
/// limit, never secret values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A parameter is outside its allowed range.
    #[error("invalid parameter {field}: {reason}")]
    InvalidParameter {
        /// Parameter name.
        field: &'static str,
        /// The rule it broke.
        reason: String,
    },
    /// An element is not the canonical encoding of a non-identity ristretto255 point.
    #[error("{field}: element {index} is not a valid ristretto255 point (non-canonical encoding, not on the group, or the identity)")]
    InvalidPoint {
        /// Which input.
        field: &'static str,
        /// Position of the element.
        index: usize,
    },
    /// The same tag occurs twice where tags must be distinct.
    #[error("{field}: tag at index {index} repeats an earlier one; tags of distinct ids are distinct")]
    DuplicateTag {
        /// Which input.
        field: &'static str,
        /// Position of the repeat.
        index: usize,
    },
    /// The operating system's random number generator failed.
    #[error("the operating system random number generator failed")]
    Randomness,
}

fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidParameter { field, reason: reason.into() }
}

/// Runs `work` on the workspace's shared rayon pool of `threads` threads (0 = one per core;
/// `confide-pool`: the same registry the Paillier vector forms use, so blinding and encrypting
/// at once share cores instead of stacking two pools on them).
///
/// # Errors
/// `InvalidParameter` if `threads` > [`MAX_THREADS`] or the pool cannot start.
pub fn with_threads<R: Send>(threads: usize, work: impl FnOnce() -> R + Send) -> Result<R> {
    confide_pool::with_threads(threads, work).map_err(|e| invalid("threads", e.to_string()))
}

/// A list of byte-string ids: one flat buffer and `n + 1` offsets (id i is
/// `data[offsets[i]..offsets[i + 1]]`; `offsets[0] = 0`, `offsets[n] = data.len()`).
#[derive(Clone, Copy, Debug)]
pub struct Ids<'a> {
    data: &'a [u8],
    offsets: &'a [u64],
}

impl<'a> Ids<'a> {
    /// Checks the offsets against the buffer.
    ///
    /// # Errors
    /// `InvalidParameter` naming `offsets` and the first bad position.
    pub fn new(data: &'a [u8], offsets: &'a [u64]) -> Result<Self> {
        let Some((&first, _)) = offsets.split_first() else {
            return Err(invalid("offsets", "needs n + 1 entries (at least one)"));
        };
        if first != 0 {
            return Err(invalid("offsets", format!("offsets[0] must be 0, got {first}")));
        }
        for (i, pair) in offsets.windows(2).enumerate() {
            if pair[1] < pair[0] {
                return Err(invalid(
                    "offsets",
                    format!("must not decrease: offsets[{}] = {} < offsets[{i}] = {}", i + 1, pair[1], pair[0]),
                ));
            }
        }
        let last = offsets[offsets.len() - 1];
        if last != data.len() as u64 {
            return Err(invalid("offsets", format!("the last offset must be the buffer length {}, got {last}", data.len())));
        }
        Ok(Ids { data, offsets })
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Whether there are no ids.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Id `i` (bounds were checked in [`Ids::new`]).
    fn get(&self, i: usize) -> &'a [u8] {
        // Offsets are validated to be non-decreasing and to end at data.len(), so they fit usize.
        let (start, end) = (self.offsets[i] as usize, self.offsets[i + 1] as usize);
        &self.data[start..end]
    }
}

/// SHA-512 state after absorbing `u64be(len(dst)) ‖ dst`, cloned per id.
fn prefix(dst: &[u8]) -> Result<Sha512> {
    if dst.is_empty() || dst.len() > MAX_DST_BYTES {
        return Err(invalid("dst", format!("must be 1..={MAX_DST_BYTES} bytes, got {}", dst.len())));
    }
    let mut hasher = Sha512::new();
    hasher.update((dst.len() as u64).to_be_bytes());
    hasher.update(dst);
    Ok(hasher)
}

fn hasher_of(prefix: &Sha512, id: &[u8]) -> Sha512 {
    let mut hasher = prefix.clone();
    hasher.update((id.len() as u64).to_be_bytes());
    hasher.update(id);
    hasher
}

fn hash_one(prefix: &Sha512, id: &[u8]) -> RistrettoPoint {
    RistrettoPoint::from_hash(hasher_of(prefix, id))
}

/// Whether the IFMA lane engine runs on this machine.
pub fn lane_engine() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        lanes::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Compresses `points` (already multiplied by k/2) as the encodings of their doubles.
fn double_compress_into(points: &[RistrettoPoint], out: &mut [Point]) {
    for (slot, compressed) in out.iter_mut().zip(RistrettoPoint::double_and_compress_batch(points)) {
        *slot = compressed.to_bytes();
    }
}

/// H(id) for every id, compressed (see the crate docs for the encoding). Runs on the
/// current rayon pool.
///
/// # Errors
/// `InvalidParameter` if `dst` is empty or longer than [`MAX_DST_BYTES`].
pub fn hash_to_group(dst: &[u8], ids: &Ids<'_>) -> Result<Vec<Point>> {
    let prefix = prefix(dst)?;
    let mut out = vec![[0u8; POINT_BYTES]; ids.len()];
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(chunk, slots)| {
        for (j, slot) in slots.iter_mut().enumerate() {
            *slot = hash_one(&prefix, ids.get(chunk * CHUNK + j)).compress().to_bytes();
        }
    });
    Ok(out)
}

/// The comparison tag of a compressed point: SHA-256(`"confide-psi-tag"` ‖ point)[0..16].
pub fn tag(point: &Point) -> Tag {
    let digest = Sha256::new().chain_update(TAG_DOMAIN).chain_update(point).finalize();
    let mut out = [0u8; TAG_BYTES];
    out.copy_from_slice(&digest[..TAG_BYTES]);
    out
}

/// [`tag`] of every point, on the current rayon pool.
pub fn tags(points: &[Point]) -> Vec<Tag> {
    points.par_iter().with_min_len(CHUNK).map(tag).collect()
}

/// Pairs `(i, j)` with `left[i] == right[j]`, in increasing `i`.
///
/// # Errors
/// `DuplicateTag` if `right` repeats a tag, or two entries of `left` match the same
/// `right` entry (neither happens for the tags of distinct ids: a peer sent bad data).
pub fn match_tags(left: &[Tag], right: &[Tag]) -> Result<Vec<(usize, usize)>> {
    let mut sorted: Vec<(Tag, usize)> = right.iter().copied().zip(0..).collect();
    sorted.par_sort_unstable();
    if let Some(pair) = sorted.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        return Err(Error::DuplicateTag { field: "right", index: pair[0].1.max(pair[1].1) });
    }
    let pairs: Vec<(usize, usize)> = left
        .par_iter()
        .enumerate()
        .with_min_len(CHUNK)
        .filter_map(|(i, t)| sorted.binary_search_by(|probe| probe.0.cmp(t)).ok().map(|k| (i, sorted[k].1)))
        .collect();
    let mut seen = vec![false; right.len()];
    for &(i, j) in &pairs {
        if std::mem::replace(&mut seen[j], true) {
            return Err(Error::DuplicateTag { field: "left", index: i });
        }
    }
    Ok(pairs)
}

/// A party's secret PSI scalar (with its half, for batched compression). Zeroized on
/// drop; never printed.
pub struct PsiKey {
    scalar: Scalar,
    half: Scalar,
    /// The scalar recoded for the lane engine (zeroized on its own drop).
    #[cfg(target_arch = "x86_64")]
    digits: lanes::Digits,
}

impl Drop for PsiKey {
    fn drop(&mut self) {
        self.scalar.zeroize();
        self.half.zeroize();
    }
}

impl std::fmt::Debug for PsiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PsiKey(<secret>)")
    }
}

impl PsiKey {
    /// A fresh key: 64 bytes from the OS CSPRNG reduced mod ℓ (bias < 2^-250); zero is redrawn.
    ///
    /// # Errors
    /// `Randomness` if the OS generator fails.
    pub fn generate() -> Result<Self> {
        loop {
            let mut wide = [0u8; 64];
            let drawn = getrandom::fill(&mut wide).map_err(|_| Error::Randomness);
            let scalar = Scalar::from_bytes_mod_order_wide(&wide);
            wide.zeroize();
            drawn?;
            if scalar != Scalar::ZERO {
                return Ok(Self::from_scalar(scalar));
            }
        }
    }

    /// A key from a canonical little-endian scalar (known-answer tests, reproducible runs).
    ///
    /// # Errors
    /// `InvalidParameter` if the bytes are not a canonical nonzero scalar.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<Self> {
        let scalar: Option<Scalar> = Scalar::from_canonical_bytes(*bytes).into();
        match scalar {
            Some(s) if s != Scalar::ZERO => Ok(Self::from_scalar(s)),
            _ => Err(invalid("key", "must be a canonical nonzero scalar below the group order")),
        }
    }

    fn from_scalar(scalar: Scalar) -> Self {
        let half = scalar * Scalar::from(2u64).invert();
        PsiKey {
            #[cfg(target_arch = "x86_64")]
            digits: lanes::Digits::new(scalar.as_bytes()),
            scalar,
            half,
        }
    }

    /// k·H(id) for every id, compressed, on the current rayon pool.
    ///
    /// # Errors
    /// `InvalidParameter` for a bad `dst`.
    pub fn hash_and_blind(&self, dst: &[u8], ids: &Ids<'_>) -> Result<Vec<Point>> {
        self.hash_and_blind_with(dst, ids, lane_engine())
    }

    fn hash_and_blind_with(&self, dst: &[u8], ids: &Ids<'_>, use_lanes: bool) -> Result<Vec<Point>> {
        let prefix = prefix(dst)?;
        let mut out = vec![[0u8; POINT_BYTES]; ids.len()];
        out.par_chunks_mut(CHUNK).enumerate().for_each(|(chunk, slots)| {
            let id = |j: usize| ids.get(chunk * CHUNK + j);
            if use_lanes {
                #[cfg(target_arch = "x86_64")]
                for (group, outs) in slots.chunks_mut(lanes::LANES).enumerate() {
                    let base = group * lanes::LANES;
                    let uniform: [[u8; 64]; lanes::LANES] =
                        std::array::from_fn(|l| hasher_of(&prefix, id(base + l.min(outs.len() - 1))).finalize().into());
                    let blinded = lanes::hash_and_blind(&uniform, &self.digits);
                    outs.copy_from_slice(&blinded[..outs.len()]);
                }
                return;
            }
            let halves: Vec<RistrettoPoint> = (0..slots.len()).map(|j| hash_one(&prefix, id(j)) * self.half).collect();
            double_compress_into(&halves, slots);
        });
        Ok(out)
    }

    /// k·P for every point P (a peer's blinded points), compressed, on the current rayon pool.
    ///
    /// # Errors
    /// `InvalidPoint` with the index of the first element that is not the canonical encoding
    /// of a non-identity point.
    pub fn blind(&self, points: &[Point]) -> Result<Vec<Point>> {
        self.blind_with(points, lane_engine())
    }

    fn blind_with(&self, points: &[Point], use_lanes: bool) -> Result<Vec<Point>> {
        let mut out = vec![[0u8; POINT_BYTES]; points.len()];
        let done = out.par_chunks_mut(CHUNK).zip(points.par_chunks(CHUNK)).enumerate().try_for_each(|(chunk, (slots, inputs))| {
            if use_lanes {
                #[cfg(target_arch = "x86_64")]
                for (group, (outs, ins)) in slots.chunks_mut(lanes::LANES).zip(inputs.chunks(lanes::LANES)).enumerate() {
                    let batch: [Point; lanes::LANES] = std::array::from_fn(|l| ins[l.min(ins.len() - 1)]);
                    let (blinded, refused) = lanes::blind(&batch, &self.digits);
                    if refused != 0 {
                        let index = chunk * CHUNK + group * lanes::LANES + refused.trailing_zeros() as usize;
                        return Err(Error::InvalidPoint { field: "points", index });
                    }
                    outs.copy_from_slice(&blinded[..outs.len()]);
                }
                return Ok(());
            }
            let halves = inputs
                .iter()
                .enumerate()
                .map(|(j, bytes)| decompress(bytes, "points", chunk * CHUNK + j).map(|p| p * self.half))
                .collect::<Result<Vec<_>>>()?;
            double_compress_into(&halves, slots);
            Ok(())
        });
        match done {
            Ok(()) => Ok(out),
            // Chunks run in any order: report the first bad element, whichever chunk failed first.
            Err(error) => Err(points.iter().enumerate().find_map(|(i, p)| decompress(p, "points", i).err()).unwrap_or(error)),
        }
    }
}

fn decompress(bytes: &Point, field: &'static str, index: usize) -> Result<RistrettoPoint> {
    match CompressedRistretto(*bytes).decompress() {
        Some(point) if point != RistrettoPoint::identity() => Ok(point),
        _ => Err(Error::InvalidPoint { field, index }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&[u8]]) -> (Vec<u8>, Vec<u64>) {
        let mut data = Vec::new();
        let mut offsets = vec![0u64];
        for id in list {
            data.extend_from_slice(id);
            offsets.push(data.len() as u64);
        }
        (data, offsets)
    }

    fn key() -> Result<PsiKey> {
        PsiKey::generate()
    }

    #[test]
    fn blinding_commutes() -> Result<()> {
        let (a, b) = (key()?, key()?);
        let list: Vec<Vec<u8>> = (0..1500u32).map(|i| format!("user-{i}").into_bytes()).collect();
        let refs: Vec<&[u8]> = list.iter().map(Vec::as_slice).collect();
        let (data, offsets) = ids(&refs);
        let ids = Ids::new(&data, &offsets)?;
        let ab = b.blind(&a.hash_and_blind(b"dst", &ids)?)?;
        let ba = a.blind(&b.hash_and_blind(b"dst", &ids)?)?;
        assert_eq!(ab, ba);
        // Against the plain (unbatched) arithmetic.
        let hashed = hash_to_group(b"dst", &ids)?;
        for (i, h) in hashed.iter().enumerate().step_by(97) {
            let point = decompress(h, "h", i)?;
            assert_eq!((point * a.scalar * b.scalar).compress().to_bytes(), ab[i]);
            assert_eq!((point * a.scalar).compress().to_bytes(), a.hash_and_blind(b"dst", &ids)?[i]);
        }
        assert_eq!(tags(&ab), tags(&ba));
        Ok(())
    }

    #[test]
    fn hash_matches_the_documented_encoding() -> Result<()> {
        let (data, offsets) = ids(&[b"alice", b""]);
        let got = hash_to_group(b"my-dst", &Ids::new(&data, &offsets)?)?;
        let mut input = Vec::new();
        input.extend_from_slice(&6u64.to_be_bytes());
        input.extend_from_slice(b"my-dst");
        input.extend_from_slice(&5u64.to_be_bytes());
        input.extend_from_slice(b"alice");
        assert_eq!(got[0], RistrettoPoint::hash_from_bytes::<Sha512>(&input).compress().to_bytes());
        assert_ne!(got[0], got[1]);
        Ok(())
    }

    #[test]
    fn distinct_dst_gives_distinct_points() -> Result<()> {
        let (data, offsets) = ids(&[b"1", b"2"]);
        let ids = Ids::new(&data, &offsets)?;
        let one = hash_to_group(b"confide-psi/int", &ids)?;
        let two = hash_to_group(b"confide-psi/str", &ids)?;
        assert_ne!(one[0], two[0]);
        assert_ne!(one[1], two[1]);
        // The length prefix keeps (dst, id) boundaries apart: ("ab", "c") != ("a", "bc").
        let (d1, o1) = ids_of(b"c");
        let (d2, o2) = ids_of(b"bc");
        assert_ne!(hash_to_group(b"ab", &Ids::new(&d1, &o1)?)?, hash_to_group(b"a", &Ids::new(&d2, &o2)?)?);
        Ok(())
    }

    fn ids_of(id: &[u8]) -> (Vec<u8>, Vec<u64>) {
        ids(&[id])
    }

    #[test]
    fn invalid_encodings_are_refused_by_index() -> Result<()> {
        let k = key()?;
        let (data, offsets) = ids(&[b"x", b"y", b"z"]);
        let mut points = k.hash_and_blind(b"d", &Ids::new(&data, &offsets)?)?;
        assert!(k.blind(&points).is_ok());
        // Non-canonical: the field element p (= 0 mod p) written unreduced.
        let mut p = [0xffu8; 32];
        p[0] = 0xed;
        p[31] = 0x7f;
        points[1] = p;
        assert_eq!(k.blind(&points), Err(Error::InvalidPoint { field: "points", index: 1 }));
        // Negative s (odd low bit) is never canonical.
        points[1] = [0u8; 32];
        points[1][0] = 1;
        assert_eq!(k.blind(&points), Err(Error::InvalidPoint { field: "points", index: 1 }));
        // The identity is a valid encoding but no honest party sends it.
        points[1] = [0u8; 32];
        assert_eq!(k.blind(&points), Err(Error::InvalidPoint { field: "points", index: 1 }));
        // An index past the first chunk is reported exactly.
        let mut many = vec![points[0]; CHUNK * 2 + 5];
        many[CHUNK + 3] = [0xffu8; 32];
        assert_eq!(k.blind(&many), Err(Error::InvalidPoint { field: "points", index: CHUNK + 3 }));
        Ok(())
    }

    /// Deterministic pseudo-random bytes for the engine comparisons.
    fn stream(seed: u64, n: usize) -> Vec<[u8; 32]> {
        (0..n as u64).map(|i| Sha256::new().chain_update(seed.to_le_bytes()).chain_update(i.to_le_bytes()).finalize().into()).collect()
    }

    #[test]
    fn lane_engine_equals_dalek_on_ids_and_points() -> Result<()> {
        if !lane_engine() {
            eprintln!("skipped: this CPU has no AVX-512 IFMA (or CONFIDE_DISABLE_IFMA is set)");
            return Ok(());
        }
        // Sizes around the 8-lane groups and the 512-element chunks, to cover padded groups.
        let list: Vec<Vec<u8>> = (0..CHUNK as u32 + 13).map(|i| format!("patient-{i}").into_bytes()).collect();
        let refs: Vec<&[u8]> = list.iter().map(Vec::as_slice).collect();
        let (data, offsets) = ids(&refs);
        let mut one = [0u8; 32];
        one[0] = 1;
        // The largest scalar, ℓ − 1, and one with the top digit set exercise the recoding.
        let largest = (Scalar::ZERO - Scalar::ONE).to_bytes();
        let top = Scalar::from_bytes_mod_order([0xff; 32]).to_bytes();
        for key in [key()?, key()?, PsiKey::from_bytes(&one)?, PsiKey::from_bytes(&largest)?, PsiKey::from_bytes(&top)?] {
            for n in [1, 7, 8, 9, CHUNK + 13] {
                let ids = Ids::new(&data[..offsets[n] as usize], &offsets[..=n])?;
                let fast = key.hash_and_blind_with(b"dst", &ids, true)?;
                assert_eq!(fast, key.hash_and_blind_with(b"dst", &ids, false)?, "hash_and_blind, {n} ids");
                assert_eq!(key.blind_with(&fast, true)?, key.blind_with(&fast, false)?, "blind, {n} points");
            }
        }
        Ok(())
    }

    #[test]
    fn lane_engine_refuses_exactly_what_dalek_refuses() -> Result<()> {
        if !lane_engine() {
            eprintln!("skipped: this CPU has no AVX-512 IFMA (or CONFIDE_DISABLE_IFMA is set)");
            return Ok(());
        }
        let k = key()?;
        let mut inputs = stream(7, 4000);
        // Random strings with bit 255 and the sign bit cleared: about half decode.
        inputs.extend(stream(8, 4000).into_iter().map(|mut b| {
            b[31] &= 0x7f;
            b[0] &= 0xfe;
            b
        }));
        let (data, offsets) = ids(&[b"a", b"b", b"c"]);
        let valid = k.hash_and_blind(b"d", &Ids::new(&data, &offsets)?)?;
        let mut p_bytes = [0xffu8; 32];
        p_bytes[0] = 0xed;
        p_bytes[31] = 0x7f;
        for v in &valid {
            inputs.push(*v);
            let mut high = *v;
            high[31] |= 0x80;
            inputs.push(high);
            // v + p, when it still fits in 255 bits, is the same element written unreduced.
            let (mut sum, mut carry) = ([0u8; 32], 0u16);
            for i in 0..32 {
                let t = u16::from(v[i]) + u16::from(p_bytes[i]) + carry;
                sum[i] = t as u8;
                carry = t >> 8;
            }
            inputs.push(sum);
        }
        let mut minus_two = p_bytes;
        minus_two[0] -= 2; // p − 2: canonical, even, and not on the group or on it (whatever dalek says)
        inputs.extend([[0u8; 32], p_bytes, minus_two, [0xff; 32]]);
        let mut accepted = 0;
        for (i, input) in inputs.iter().enumerate() {
            let (fast, slow) = (k.blind_with(&[*input], true), k.blind_with(&[*input], false));
            assert_eq!(fast, slow, "input {i}: {input:02x?}");
            accepted += usize::from(slow.is_ok());
        }
        assert!(accepted > 1000, "only {accepted} of {} inputs decoded", inputs.len());
        // In a batch, the first refused index is the one reported.
        let mut batch: Vec<Point> = std::iter::repeat_n(valid[0], 40).collect();
        batch[21] = [0xff; 32];
        batch[33] = [0u8; 32];
        assert_eq!(k.blind_with(&batch, true), Err(Error::InvalidPoint { field: "points", index: 21 }));
        Ok(())
    }

    #[test]
    fn offsets_are_checked() {
        assert!(Ids::new(b"abc", &[]).is_err());
        assert!(Ids::new(b"abc", &[1, 3]).is_err());
        assert!(Ids::new(b"abc", &[0, 2, 1, 3]).is_err());
        assert!(Ids::new(b"abc", &[0, 2]).is_err());
        assert!(Ids::new(b"abc", &[0, 1, 3]).is_ok());
        assert!(Ids::new(b"", &[0]).is_ok_and(|ids| ids.is_empty()));
        assert!(hash_to_group(b"", &Ids { data: b"", offsets: &[0] }).is_err());
    }

    #[test]
    fn keys_are_distinct_and_checked() -> Result<()> {
        let (a, b) = (key()?, key()?);
        assert_ne!(a.scalar, b.scalar);
        assert_eq!(a.half + a.half, a.scalar);
        assert!(PsiKey::from_bytes(&[0u8; 32]).is_err());
        assert!(PsiKey::from_bytes(&[0xffu8; 32]).is_err());
        let mut one = [0u8; 32];
        one[0] = 1;
        let k = PsiKey::from_bytes(&one)?;
        let (data, offsets) = ids(&[b"q"]);
        let ids = Ids::new(&data, &offsets)?;
        assert_eq!(k.hash_and_blind(b"d", &ids)?, hash_to_group(b"d", &ids)?);
        assert_eq!(format!("{k:?}"), "PsiKey(<secret>)");
        Ok(())
    }

    #[test]
    fn matching_finds_common_tags_and_refuses_repeats() -> Result<()> {
        let t = |i: u8| [i; TAG_BYTES];
        let left = [t(1), t(2), t(3), t(4)];
        let right = [t(4), t(9), t(2)];
        assert_eq!(match_tags(&left, &right)?, vec![(1, 2), (3, 0)]);
        assert_eq!(match_tags(&left, &[t(1), t(1)]), Err(Error::DuplicateTag { field: "right", index: 1 }));
        assert_eq!(match_tags(&[t(5), t(5)], &[t(5)]), Err(Error::DuplicateTag { field: "left", index: 1 }));
        assert_eq!(match_tags(&[], &right)?, vec![]);
        Ok(())
    }

    #[test]
    fn thread_counts_are_checked() -> Result<()> {
        assert!(with_threads(MAX_THREADS + 1, || ()).is_err());
        assert_eq!(with_threads(1, rayon::current_num_threads)?, 1);
        assert_eq!(with_threads(2, rayon::current_num_threads)?, 2);
        Ok(())
    }
}
