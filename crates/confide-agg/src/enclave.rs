//! The `tee` kinds behind one narrow enclave interface.
//!
//! [`Enclave`] lists the only calls that cross into the enclave ("ecalls"). The
//! data plane's worker threads play the enclave threads: for a tee round they
//! hand the sealed slice to [`Enclave::ingest`] with their worker number, and the
//! enclave decrypts it, folds it into a tracker it owns (one per worker) and,
//! when the slice completes, returns the result sealed under the session key.
//!
//! [`SimulatedEnclave`] is a simulation: no SGX here, the "enclave" is ordinary
//! code and memory of the aggregator process (see its [`EnclaveReport`]).
//!
//! Wire formats (the Python side builds the same bytes with `cryptography`):
//! ```text
//! wrapped key (92 B) = eph_pub (32) ‖ nonce (12) ‖ AES-256-GCM(kek, nonce, session_key (32), aad) (48)
//!   shared = X25519(eph_secret, enclave_pub), all-zero refused
//!   kek    = HKDF-SHA256(salt = enclave_pub ‖ eph_pub, ikm = shared, info = aad, 32 bytes)
//!   aad    = "confide/tee/wrap/v1" ‖ session (UTF-8)
//! sealed slice = nonce (12) ‖ AES-256-GCM(session_key, nonce, f32 LE values, aad)
//!   aad = "confide/tee/slice/v1\0" ‖ session ‖ "\0" ‖ u32le round ‖ u32le attempt
//!         ‖ u32le participant (0xFFFFFFFF for results) ‖ u32le index
//! ```

use crate::error::{invalid, malformed, slice_error, Error, Result};
use crate::tracker::{Outcome, RoundCheckpoint, RoundSpec, Tracker, TrackerStats, SEAL_OVERHEAD};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ring::hkdf::{KeyType, Salt, HKDF_SHA256};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::{Zeroize, Zeroizing};

/// AAD prefix and HKDF info of a wrapped session key.
pub const WRAP_LABEL: &[u8] = b"confide/tee/wrap/v1";
/// AAD prefix of a sealed slice.
pub const SLICE_LABEL: &[u8] = b"confide/tee/slice/v1\x00";
const CHECKPOINT_LABEL: &[u8] = b"confide/tee/checkpoint/v1\x00";
const HELD_LABEL: &[u8] = b"confide/tee/held/v1\x00";
/// Bytes of a wrapped session key.
pub const WRAPPED_KEY_BYTES: usize = 32 + 12 + 32 + 16;
/// Participant position in the AAD of a sealed result.
pub const RESULT_PARTICIPANT: u32 = u32::MAX;
const BUILD: &str = concat!("confide-agg simulated enclave ", env!("CARGO_PKG_VERSION"), " (tracker v1, aes-256-gcm, x25519-hkdf-sha256)");

/// What the enclave says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnclaveReport {
    /// "simulation".
    pub mode: &'static str,
    /// Whether hardware isolates the enclave's memory from the host (false here).
    pub hardware_isolation: bool,
    /// Hex SHA-256 of the build string.
    pub measurement: String,
    /// Plain words on what this is.
    pub note: &'static str,
}

/// The ecalls: everything that crosses into the enclave.
pub trait Enclave: Send + Sync {
    /// Number of enclave threads (trackers); the data plane must use as many workers.
    fn workers(&self) -> usize;
    /// The enclave's X25519 public key (parties wrap session keys to it).
    fn public_key(&self) -> [u8; 32];
    /// The enclave's self-description.
    fn report(&self) -> EnclaveReport;
    /// Installs the session key of `session` from a 92-byte wrapped key. The first
    /// key of a session sticks; another one for the same session is an error.
    ///
    /// # Errors
    /// `InvalidParameter` (length, session, mismatch), `Crypto` (unwrap failed).
    fn provision(&self, session: &str, wrapped_key: &[u8]) -> Result<()>;
    /// Adds a tee round to the enclave's message wall.
    ///
    /// # Errors
    /// `InvalidParameter` if the spec is not a valid tee round.
    fn open_round(&self, spec: Arc<RoundSpec>) -> Result<()>;
    /// Frees every entry of a round and forgets it.
    fn close_round(&self, round_id: u64);
    /// Decrypts one sealed slice and folds it into worker `worker`'s tracker;
    /// a completion comes back sealed.
    ///
    /// # Errors
    /// `Slice` (size, index, participant, authentication, non-finite value), `UnknownRound`.
    fn ingest(&self, worker: usize, round_id: u64, participant: u32, index: u32, sealed_payload: &[u8]) -> Result<Outcome>;
    /// Serializes and frees the round's incomplete entries, sealed with an enclave-only key.
    ///
    /// # Errors
    /// `UnknownRound`, `Io`, `Crypto`.
    fn checkpoint_round(&self, round_id: u64) -> Result<Vec<u8>>;
    /// Rebuilds entries from a sealed checkpoint of this enclave.
    ///
    /// # Errors
    /// `UnknownRound`, `Malformed` (authentication, content).
    fn restore_round(&self, round_id: u64, sealed: &[u8]) -> Result<()>;
    /// (index, missing participants) of the round's incomplete entries.
    ///
    /// # Errors
    /// `UnknownRound`, `Io`.
    fn missing(&self, round_id: u64) -> Result<Vec<(u32, Vec<u32>)>>;
    /// A whole-update robust round's estimates: `held` are the blocks [`Enclave::ingest`] sealed
    /// for the enclave alone as their slices completed, every slice of the round once; the
    /// enclave opens them, weighs the updates over all of them and seals each slice's estimate
    /// under the session key, as a completed slice.
    ///
    /// # Errors
    /// `UnknownRound`, `InvalidParameter` (not a whole-update round, a slice missing or twice),
    /// `Malformed` (a block not sealed by this enclave for this round and slice).
    fn finish_robust(&self, round_id: u64, held: &[(u32, Vec<u8>)]) -> Result<Vec<(u32, Vec<u8>)>>;
    /// Counters of the enclave's trackers, summed.
    fn stats(&self) -> TrackerStats;
    /// Resets the trackers' peaks.
    fn reset_peak(&self);
}

struct SessionKey {
    raw: Zeroizing<[u8; 32]>,
    key: LessSafeKey,
}

/// A software stand-in for an SGX enclave (see the module documentation).
pub struct SimulatedEnclave {
    secret: StaticSecret,
    public: PublicKey,
    checkpoint_key: LessSafeKey,
    sessions: RwLock<HashMap<String, SessionKey>>,
    wall: RwLock<HashMap<u64, Arc<RoundSpec>>>,
    trackers: Vec<Mutex<Tracker>>,
}

fn random<const N: usize>() -> Result<[u8; N]> {
    let mut out = [0u8; N];
    getrandom::fill(&mut out).map_err(|e| Error::Crypto(format!("the operating system random number generator failed: {e}")))?;
    Ok(out)
}

fn aes_key(bytes: &[u8]) -> Result<LessSafeKey> {
    Ok(LessSafeKey::new(UnboundKey::new(&AES_256_GCM, bytes).map_err(|_| Error::Crypto("AES-256-GCM key setup failed".into()))?))
}

struct Len32;
impl KeyType for Len32 {
    fn len(&self) -> usize {
        32
    }
}

fn wrap_aad(session: &str) -> Vec<u8> {
    [WRAP_LABEL, session.as_bytes()].concat()
}

/// The key-encryption key of a wrapped session key.
fn kek(shared: &[u8; 32], enclave_pub: &[u8; 32], eph_pub: &[u8; 32], session: &str) -> Result<Zeroizing<[u8; 32]>> {
    let salt = Salt::new(HKDF_SHA256, &[enclave_pub.as_slice(), eph_pub.as_slice()].concat());
    let prk = salt.extract(shared);
    let info = wrap_aad(session);
    let info_parts = [info.as_slice()];
    let okm = prk.expand(&info_parts, Len32).map_err(|_| Error::Crypto("HKDF expand failed".into()))?;
    let mut out = Zeroizing::new([0u8; 32]);
    okm.fill(out.as_mut()).map_err(|_| Error::Crypto("HKDF fill failed".into()))?;
    Ok(out)
}

fn shared_secret(secret: &StaticSecret, peer: &[u8; 32]) -> Result<Zeroizing<[u8; 32]>> {
    let shared = secret.diffie_hellman(&PublicKey::from(*peer));
    if !shared.was_contributory() {
        return Err(invalid("wrapped_key", "the ephemeral public key gives an all-zero X25519 shared secret"));
    }
    Ok(Zeroizing::new(*shared.as_bytes()))
}

/// The party side of key wrapping (used by tests; Python has its own).
///
/// # Errors
/// `InvalidParameter` for a low-order enclave key, `Crypto`.
pub fn wrap_session_key(
    enclave_pub: &[u8; 32],
    eph_secret: [u8; 32],
    nonce: [u8; 12],
    session: &str,
    session_key: &[u8; 32],
) -> Result<Vec<u8>> {
    let eph = StaticSecret::from(eph_secret);
    let eph_pub = PublicKey::from(&eph).to_bytes();
    let shared = shared_secret(&eph, enclave_pub)?;
    let kek = aes_key(kek(&shared, enclave_pub, &eph_pub, session)?.as_ref())?;
    let mut body = session_key.to_vec();
    kek.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(wrap_aad(session)), &mut body)
        .map_err(|_| Error::Crypto("AES-GCM seal failed".into()))?;
    Ok([eph_pub.as_slice(), nonce.as_slice(), body.as_slice()].concat())
}

/// AAD of a sealed slice (participant = [`RESULT_PARTICIPANT`] for results).
pub fn slice_aad(session: &str, round: u32, attempt: u32, participant: u32, index: u32) -> Vec<u8> {
    let mut aad = Vec::with_capacity(SLICE_LABEL.len() + session.len() + 17);
    aad.extend_from_slice(SLICE_LABEL);
    aad.extend_from_slice(session.as_bytes());
    aad.push(0);
    for v in [round, attempt, participant, index] {
        aad.extend_from_slice(&v.to_le_bytes());
    }
    aad
}

/// Seals a slice: nonce ‖ AES-256-GCM(key, nonce, plaintext, aad).
///
/// # Errors
/// `Crypto`.
pub fn seal_with(key: &[u8; 32], nonce: [u8; 12], aad: &[u8], plaintext: &[u8]) -> Result<Vec<u8>> {
    seal(&aes_key(key)?, nonce, aad, plaintext)
}

fn seal(key: &LessSafeKey, nonce: [u8; 12], aad: &[u8], plaintext: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(plaintext.len() + SEAL_OVERHEAD);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(plaintext);
    let mut body = out.split_off(12);
    key.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut body)
        .map_err(|_| Error::Crypto("AES-GCM seal failed".into()))?;
    out.extend_from_slice(&body);
    Ok(out)
}

/// Opens nonce ‖ ciphertext ‖ tag; None if authentication fails.
fn open(key: &LessSafeKey, aad: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
    if sealed.len() < SEAL_OVERHEAD {
        return None;
    }
    let mut nonce = [0u8; 12];
    nonce.copy_from_slice(&sealed[..12]);
    let mut body = sealed[12..].to_vec();
    let len = key.open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut body).ok()?.len();
    body.truncate(len);
    Some(body)
}

/// Opens a sealed slice with a raw session key (for tests and clients).
///
/// # Errors
/// `Crypto` if authentication fails.
pub fn open_with(key: &[u8; 32], aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>> {
    open(&aes_key(key)?, aad, sealed).ok_or_else(|| Error::Crypto("AES-GCM authentication failed".into()))
}

fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl SimulatedEnclave {
    /// An enclave with `workers` trackers (0 = one per core) and a fresh X25519 key.
    ///
    /// # Errors
    /// `Crypto` if the OS random generator fails.
    pub fn new(workers: usize) -> Result<Self> {
        Self::from_secret(random::<32>()?, workers)
    }

    /// An enclave with a given X25519 secret (known-answer tests only).
    ///
    /// # Errors
    /// `Crypto` if the OS random generator fails.
    pub fn from_secret(secret: [u8; 32], workers: usize) -> Result<Self> {
        let workers = if workers == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { workers };
        let secret = StaticSecret::from(secret);
        let public = PublicKey::from(&secret);
        let checkpoint_key = aes_key(Zeroizing::new(random::<32>()?).as_ref())?;
        let trackers = (0..workers).map(|w| Mutex::new(Tracker::new(usize::MAX, None, format!("enclave-{w}")))).collect();
        Ok(SimulatedEnclave {
            secret,
            public,
            checkpoint_key,
            sessions: RwLock::new(HashMap::new()),
            wall: RwLock::new(HashMap::new()),
            trackers,
        })
    }

    fn spec(&self, round_id: u64) -> Result<Arc<RoundSpec>> {
        self.wall.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(&round_id).cloned().ok_or(Error::UnknownRound { round_id })
    }

    fn checkpoint_aad(round_id: u64) -> Vec<u8> {
        [CHECKPOINT_LABEL, &round_id.to_le_bytes()].concat()
    }

    fn held_aad(round_id: u64, index: u32) -> Vec<u8> {
        [HELD_LABEL, &round_id.to_le_bytes(), &index.to_le_bytes()].concat()
    }
}

impl Enclave for SimulatedEnclave {
    fn workers(&self) -> usize {
        self.trackers.len()
    }

    fn public_key(&self) -> [u8; 32] {
        self.public.to_bytes()
    }

    fn report(&self) -> EnclaveReport {
        EnclaveReport {
            mode: "simulation",
            hardware_isolation: false,
            measurement: Sha256::digest(BUILD.as_bytes()).iter().map(|b| format!("{b:02x}")).collect(),
            note: "no SGX on this machine: the enclave side runs as ordinary code in the aggregator process; the host can read its memory",
        }
    }

    fn provision(&self, session: &str, wrapped_key: &[u8]) -> Result<()> {
        if session.is_empty() {
            return Err(invalid("session", "must not be empty"));
        }
        if wrapped_key.len() != WRAPPED_KEY_BYTES {
            return Err(invalid(
                "wrapped_key",
                format!(
                    "holds {} bytes; a wrapped key is {WRAPPED_KEY_BYTES} (32 eph_pub + 12 nonce + 32 key + 16 tag)",
                    wrapped_key.len()
                ),
            ));
        }
        let mut eph_pub = [0u8; 32];
        eph_pub.copy_from_slice(&wrapped_key[..32]);
        let shared = shared_secret(&self.secret, &eph_pub)?;
        let kek = aes_key(kek(&shared, &self.public.to_bytes(), &eph_pub, session)?.as_ref())?;
        let mut plain = open(&kek, &wrap_aad(session), &wrapped_key[32..])
            .ok_or_else(|| invalid("wrapped_key", "AES-GCM authentication failed (wrong enclave key, session or bytes)"))?;
        let mut raw = Zeroizing::new([0u8; 32]);
        raw.copy_from_slice(&plain);
        plain.zeroize();
        let mut sessions = self.sessions.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(existing) = sessions.get(session) {
            if existing.raw.as_ref() != raw.as_ref() {
                return Err(invalid("wrapped_key", format!("session {session:?} already has a different key")));
            }
            return Ok(());
        }
        let key = aes_key(raw.as_ref())?;
        sessions.insert(session.to_string(), SessionKey { raw, key });
        Ok(())
    }

    fn open_round(&self, spec: Arc<RoundSpec>) -> Result<()> {
        spec.validate()?;
        if !spec.kind.is_tee() {
            return Err(invalid("kind", format!("the enclave aggregates tee kinds only, got {}", spec.kind.name())));
        }
        self.wall.write().unwrap_or_else(std::sync::PoisonError::into_inner).insert(spec.round_id, spec);
        Ok(())
    }

    fn close_round(&self, round_id: u64) {
        for t in &self.trackers {
            lock(t).close_round(round_id);
        }
        self.wall.write().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&round_id);
    }

    fn ingest(&self, worker: usize, round_id: u64, participant: u32, index: u32, sealed: &[u8]) -> Result<Outcome> {
        let spec = self.spec(round_id)?;
        let tee = spec.tee.as_ref().ok_or_else(|| invalid("tee", "round has no tee context"))?;
        let n = spec.n_valid(index)?;
        spec.check_participant(index, participant)?;
        if let Some(expected) = spec.payload_bytes(index)?.filter(|e| *e != sealed.len()) {
            return Err(slice_error(index, format!("sealed payload holds {} bytes; {}", sealed.len(), spec.kind.size_rule(n, expected))));
        }
        let sessions = self.sessions.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let key =
            sessions.get(&tee.session).ok_or_else(|| slice_error(index, format!("session {:?} has no provisioned key", tee.session)))?;
        let aad = slice_aad(&tee.session, tee.round, tee.attempt, participant, index);
        let mut plain = Zeroizing::new(open(&key.key, &aad, sealed).ok_or_else(|| slice_error(index, "AES-GCM authentication failed"))?);
        let tracker = &self.trackers[worker % self.trackers.len()];
        let outcome = lock(tracker).ingest(&spec, participant, index, &plain)?;
        plain.zeroize();
        Ok(match outcome {
            Outcome::Completed(mut result) => {
                match tee.rule {
                    Some(rule) if rule.whole_update() => {
                        // held by the host, sealed for the enclave alone, until every slice is in
                        let held = seal(&self.checkpoint_key, random::<12>()?, &Self::held_aad(round_id, index), &result)?;
                        result.zeroize();
                        return Ok(Outcome::Completed(held));
                    }
                    Some(rule) => {
                        // the stacked updates become the rule's estimate before anything is sealed
                        let mut block = Zeroizing::new(f32_values(&result));
                        result.zeroize();
                        result = rule.combine(&block, spec.participants as usize).iter().flat_map(|v| v.to_le_bytes()).collect();
                        block.zeroize();
                    }
                    None => {}
                }
                let aad = slice_aad(&tee.session, tee.round, tee.attempt, RESULT_PARTICIPANT, index);
                let sealed = seal(&key.key, random::<12>()?, &aad, &result)?;
                result.zeroize();
                Outcome::Completed(sealed)
            }
            other => other,
        })
    }

    fn checkpoint_round(&self, round_id: u64) -> Result<Vec<u8>> {
        let spec = self.spec(round_id)?;
        let mut all = RoundCheckpoint::empty(&spec);
        for t in &self.trackers {
            all.merge(lock(t).checkpoint_parts(&spec)?);
        }
        let mut blob = Zeroizing::new(all.encode());
        let sealed = seal(&self.checkpoint_key, random::<12>()?, &Self::checkpoint_aad(round_id), &blob)?;
        blob.zeroize();
        Ok(sealed)
    }

    fn restore_round(&self, round_id: u64, sealed: &[u8]) -> Result<()> {
        let spec = self.spec(round_id)?;
        let blob = Zeroizing::new(
            open(&self.checkpoint_key, &Self::checkpoint_aad(round_id), sealed)
                .ok_or_else(|| malformed("checkpoint", "AES-GCM authentication failed (not sealed by this enclave for this round)"))?,
        );
        let all = RoundCheckpoint::decode(&blob)?;
        all.check_spec(&spec)?;
        let parts = all.split(spec.session_hash, self.trackers.len());
        for (t, part) in self.trackers.iter().zip(&parts) {
            lock(t).restore_parts(&spec, part)?;
        }
        Ok(())
    }

    fn missing(&self, round_id: u64) -> Result<Vec<(u32, Vec<u32>)>> {
        let spec = self.spec(round_id)?;
        let mut out = Vec::new();
        for t in &self.trackers {
            out.extend(lock(t).missing(&spec)?);
        }
        out.sort_by_key(|(i, _)| *i);
        Ok(out)
    }

    fn finish_robust(&self, round_id: u64, held: &[(u32, Vec<u8>)]) -> Result<Vec<(u32, Vec<u8>)>> {
        let spec = self.spec(round_id)?;
        let tee = spec.tee.as_ref().ok_or_else(|| invalid("tee", "round has no tee context"))?;
        let rule = tee.rule.filter(|r| r.whole_update()).ok_or_else(|| invalid("robust", "the round's rule is not a whole-update rule"))?;
        let mut indices: Vec<u32> = held.iter().map(|(i, _)| *i).collect();
        indices.sort_unstable();
        if indices != (0..spec.num_slices).collect::<Vec<_>>() {
            return Err(invalid("held", format!("must hold each of the round's {} slices once", spec.num_slices)));
        }
        let m = spec.participants as usize;
        let mut blocks = Vec::with_capacity(held.len());
        let mut gram = vec![0f64; m * m];
        for (index, sealed) in held {
            let mut plain = Zeroizing::new(
                open(&self.checkpoint_key, &Self::held_aad(round_id, *index), sealed)
                    .ok_or_else(|| malformed("held", format!("slice {index}: not sealed by this enclave for this round")))?,
            );
            let block = Zeroizing::new(f32_values(&plain));
            plain.zeroize();
            crate::robust::add_gram(&mut gram, &block, m);
            blocks.push((*index, block));
        }
        let weights = rule.weights(&gram, m);
        gram.zeroize();
        let sessions = self.sessions.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = sessions.get(&tee.session).ok_or_else(|| invalid("session", format!("{:?} has no provisioned key", tee.session)))?;
        let mut out = Vec::with_capacity(blocks.len());
        for (index, block) in &blocks {
            let mut estimate: Vec<u8> = crate::robust::weighted(block, &weights).iter().flat_map(|v| v.to_le_bytes()).collect();
            let aad = slice_aad(&tee.session, tee.round, tee.attempt, RESULT_PARTICIPANT, *index);
            out.push((*index, seal(&key.key, random::<12>()?, &aad, &estimate)?));
            estimate.zeroize();
        }
        Ok(out)
    }

    fn stats(&self) -> TrackerStats {
        let mut s = TrackerStats::default();
        for t in &self.trackers {
            s.add(&lock(t).stats());
        }
        s
    }

    fn reset_peak(&self) {
        for t in &self.trackers {
            lock(t).reset_peak();
        }
    }
}
