//! The per-worker state tracker (algorithms.md §6.2).
//!
//! One entry per (round, slice index) holds the running aggregate (`acc`), the
//! accumulated weight, a bitmap of the participants seen and the first-arrival
//! time. Each arrival is folded in place (`acc += w·x`, wrapping `acc += x`, or
//! `acc = acc·c mod n²`); when every participant has arrived the result is
//! emitted and the entry freed at once, so memory holds only staged (incomplete)
//! slices. Staged bytes are bounded by a cap: opening an entry beyond it spills
//! the oldest incomplete entry to a checkpoint (a file in `spill_dir`, else an
//! in-memory cold map) and reloads it transparently on its next arrival.

use crate::error::{invalid, malformed, slice_error, Error, Result};
use crate::kernels;
use crate::robust::Rule;
use confide_codec::params::{from_params, to_params, Codec};
use confide_paillier::{CiphertextBlock, Encoding, EncryptionKey};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Largest number of participants of a round.
pub const MAX_PARTICIPANTS: u32 = 1024;
/// Bytes of AES-GCM framing around a sealed slice (12-byte nonce + 16-byte tag).
pub const SEAL_OVERHEAD: usize = 28;
const CHECKPOINT_MAGIC: &[u8; 4] = b"CAGK";
const CHECKPOINT_VERSION: u8 = 1;

/// What a round aggregates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Weighted float32 sum; emits acc.
    F32Sum,
    /// Weighted float32 mean; emits acc / wsum.
    F32Mean,
    /// Wrapping uint32 sum (masked integers).
    U32Sum,
    /// Product of Paillier ciphertext blocks (homomorphic sum).
    PaillierProduct,
    /// `F32Sum` on AES-GCM sealed slices, folded inside the enclave.
    TeeF32Sum,
    /// `F32Mean` on AES-GCM sealed slices, folded inside the enclave.
    TeeF32Mean,
    /// `F32Sum` of slices sent as IEEE float16 (2 bytes a value), widened before they are summed.
    F16Sum,
    /// `F32Sum` of slices sent as bfloat16 (float32's top 16 bits), widened before they are summed.
    Bf16Sum,
    /// `F32Sum` of slices sent as int8 with one float32 scale in front (4 + n bytes): value = q · scale.
    Q8Sum,
    /// `F16Sum` on AES-GCM sealed slices: the enclave opens, widens and sums as float32.
    TeeF16Sum,
    /// `Bf16Sum` on AES-GCM sealed slices.
    TeeBf16Sum,
    /// `Q8Sum` on AES-GCM sealed slices.
    TeeQ8Sum,
    /// Lattice ciphertexts: little-endian 8-byte words mod the 62-bit prime of `confide-lattice`,
    /// two values a word, summed mod that prime; a word outside `[0, q)` is refused.
    RlweSum,
    /// float32 slices kept side by side, not summed: participant p's values fill row p of an
    /// m × n block, which completes as it is (a robust rule at the aggregator reads every update).
    F32Stack,
    /// `F32Stack` on AES-GCM sealed slices: the enclave stacks the opened updates and, as a slice
    /// completes, seals the robust estimate of [`TeeRound::rule`] instead of the block (a
    /// whole-update rule: the block sealed for the enclave alone, until every slice is in).
    TeeF32Stack,
}

impl Kind {
    /// Parses "f32_sum", "f32_mean", "u32_sum", "paillier", "tee_f32_sum", "tee_f32_mean", "f16_sum",
    /// "bf16_sum", "q8_sum", "tee_f16_sum", "tee_bf16_sum", "tee_q8_sum", "rlwe_sum", "f32_stack",
    /// "tee_f32_stack".
    ///
    /// # Errors
    /// `InvalidParameter` naming the known kinds.
    pub fn parse(name: &str) -> Result<Kind> {
        Ok(match name {
            "f32_sum" => Kind::F32Sum,
            "f32_mean" => Kind::F32Mean,
            "u32_sum" => Kind::U32Sum,
            "paillier" => Kind::PaillierProduct,
            "tee_f32_sum" => Kind::TeeF32Sum,
            "tee_f32_mean" => Kind::TeeF32Mean,
            "f16_sum" => Kind::F16Sum,
            "bf16_sum" => Kind::Bf16Sum,
            "q8_sum" => Kind::Q8Sum,
            "tee_f16_sum" => Kind::TeeF16Sum,
            "tee_bf16_sum" => Kind::TeeBf16Sum,
            "tee_q8_sum" => Kind::TeeQ8Sum,
            "rlwe_sum" => Kind::RlweSum,
            "f32_stack" => Kind::F32Stack,
            "tee_f32_stack" => Kind::TeeF32Stack,
            other => {
                return Err(invalid(
                    "kind",
                    format!(
                        "must be one of f32_sum, f32_mean, u32_sum, paillier, tee_f32_sum, tee_f32_mean, f16_sum, bf16_sum, \
                         q8_sum, tee_f16_sum, tee_bf16_sum, tee_q8_sum, rlwe_sum, f32_stack, tee_f32_stack; got {other:?}"
                    ),
                ))
            }
        })
    }
    /// The name [`Kind::parse`] accepts.
    pub fn name(self) -> &'static str {
        match self {
            Kind::F32Sum => "f32_sum",
            Kind::F32Mean => "f32_mean",
            Kind::U32Sum => "u32_sum",
            Kind::PaillierProduct => "paillier",
            Kind::TeeF32Sum => "tee_f32_sum",
            Kind::TeeF32Mean => "tee_f32_mean",
            Kind::F16Sum => "f16_sum",
            Kind::Bf16Sum => "bf16_sum",
            Kind::Q8Sum => "q8_sum",
            Kind::TeeF16Sum => "tee_f16_sum",
            Kind::TeeBf16Sum => "tee_bf16_sum",
            Kind::TeeQ8Sum => "tee_q8_sum",
            Kind::RlweSum => "rlwe_sum",
            Kind::F32Stack => "f32_stack",
            Kind::TeeF32Stack => "tee_f32_stack",
        }
    }
    /// Whether slices are sealed for the enclave.
    pub fn is_tee(self) -> bool {
        matches!(self, Kind::TeeF32Sum | Kind::TeeF32Mean | Kind::TeeF16Sum | Kind::TeeBf16Sum | Kind::TeeQ8Sum | Kind::TeeF32Stack)
    }
    /// The kind of a tee slice once the enclave has opened it (any other kind: itself).
    pub fn opened(self) -> Kind {
        match self {
            Kind::TeeF32Sum => Kind::F32Sum,
            Kind::TeeF32Mean => Kind::F32Mean,
            Kind::TeeF16Sum => Kind::F16Sum,
            Kind::TeeBf16Sum => Kind::Bf16Sum,
            Kind::TeeQ8Sum => Kind::Q8Sum,
            Kind::TeeF32Stack => Kind::F32Stack,
            k => k,
        }
    }
    fn is_f32(self) -> bool {
        matches!(self.opened(), Kind::F32Sum | Kind::F32Mean | Kind::F32Stack) || self.is_narrow()
    }
    /// Float kinds whose slices travel narrower than float32 (widened on arrival, summed as float32).
    fn is_narrow(self) -> bool {
        matches!(self.opened(), Kind::F16Sum | Kind::Bf16Sum | Kind::Q8Sum)
    }
    /// Bytes of `n` values as they travel (opened, for tee kinds); None for paillier (variable).
    pub(crate) fn value_bytes(self, n: usize) -> Option<usize> {
        match self.opened() {
            Kind::PaillierProduct => None,
            Kind::F16Sum | Kind::Bf16Sum => Some(2 * n),
            Kind::Q8Sum => Some(4 + n),
            Kind::RlweSum => Some(8 * n.div_ceil(2)),
            _ => Some(4 * n),
        }
    }
    /// What one slice's values are called in errors (opened, for tee kinds).
    pub(crate) fn values_name(self) -> &'static str {
        match self.opened() {
            Kind::U32Sum => "uint32 words",
            Kind::F16Sum => "float16 values",
            Kind::Bf16Sum => "bfloat16 values",
            Kind::Q8Sum => "int8 values and their float32 scale",
            Kind::RlweSum => "values packed two to a lattice word",
            _ => "float32 values",
        }
    }
    /// Why a slice of `n` values must hold `expected` bytes, as its errors say.
    pub(crate) fn size_rule(self, n: usize, expected: usize) -> String {
        let what = self.values_name();
        match self.value_bytes(n) {
            Some(inner) if self.is_tee() => format!("{n} sealed {what} need {expected} (12 nonce + {inner} + 16 tag)"),
            _ => format!("{n} {what} need {expected}"),
        }
    }
    fn is_mean(self) -> bool {
        self.opened() == Kind::F32Mean
    }
    fn tag(self) -> u8 {
        match self {
            Kind::F32Sum => 1,
            Kind::F32Mean => 2,
            Kind::U32Sum => 3,
            Kind::PaillierProduct => 4,
            Kind::TeeF32Sum => 5,
            Kind::TeeF32Mean => 6,
            Kind::F16Sum => 7,
            Kind::Bf16Sum => 8,
            Kind::Q8Sum => 9,
            Kind::TeeF16Sum => 10,
            Kind::TeeBf16Sum => 11,
            Kind::TeeQ8Sum => 12,
            Kind::RlweSum => 13,
            Kind::F32Stack => 14,
            Kind::TeeF32Stack => 15,
        }
    }
}

/// The sealed-slice context of a tee round (bound into every slice's AAD).
#[derive(Clone, Debug, PartialEq)]
pub struct TeeRound {
    /// Session (job id) string.
    pub session: String,
    /// Round number in the AAD.
    pub round: u32,
    /// Attempt number in the AAD.
    pub attempt: u32,
    /// The robust rule of a [`Kind::TeeF32Stack`] round (None for every other kind).
    pub rule: Option<Rule>,
}

/// Everything the data plane knows about a round (the "message wall" row).
#[derive(Clone, Debug)]
pub struct RoundSpec {
    /// Round id (key of the wall).
    pub round_id: u64,
    /// Hash of the job id (routing key).
    pub session_hash: u64,
    /// What is aggregated.
    pub kind: Kind,
    /// Number of participants (positions 0..participants), at most 1024.
    pub participants: u32,
    /// Number of slices.
    pub num_slices: u32,
    /// Values per slice (the last one may hold fewer).
    pub slice_length: u32,
    /// Values in the whole vector.
    pub vector_length: u64,
    /// Weight of each participant (all 1.0 for sums).
    pub weights: Vec<f32>,
    /// Key of a `paillier` round.
    pub paillier: Option<Arc<EncryptionKey>>,
    /// Context of a tee round.
    pub tee: Option<TeeRound>,
}

impl RoundSpec {
    /// Checks every field against its limit.
    ///
    /// # Errors
    /// `InvalidParameter` naming the field.
    pub fn validate(&self) -> Result<()> {
        if self.participants == 0 || self.participants > MAX_PARTICIPANTS {
            return Err(invalid("participants", format!("must be in 1..={MAX_PARTICIPANTS}, got {}", self.participants)));
        }
        if self.slice_length == 0 {
            return Err(invalid("slice_length", "must be at least 1"));
        }
        if self.vector_length == 0 {
            return Err(invalid("vector_length", "must be at least 1"));
        }
        let needed = self.vector_length.div_ceil(u64::from(self.slice_length));
        if u64::from(self.num_slices) != needed {
            return Err(invalid(
                "num_slices",
                format!("{} values in slices of {} need {needed} slices, got {}", self.vector_length, self.slice_length, self.num_slices),
            ));
        }
        if self.weights.len() != self.participants as usize {
            return Err(invalid(
                "weights",
                format!("holds {} weights; {} participants need one each", self.weights.len(), self.participants),
            ));
        }
        if let Some(p) = self.weights.iter().position(|w| !w.is_finite() || *w < 0.0 || (self.kind.is_mean() && *w == 0.0)) {
            let limit = if self.kind.is_mean() { "finite and > 0" } else { "finite and >= 0" };
            return Err(invalid("weights", format!("weight of participant {p} is {}; weights must be {limit}", self.weights[p])));
        }
        if (self.kind == Kind::PaillierProduct) != self.paillier.is_some() {
            return Err(invalid("paillier_key", "is required for kind 'paillier' and only for it"));
        }
        if self.kind.is_tee() != self.tee.is_some() {
            return Err(invalid("tee", "a tee context is required for tee kinds and only for them"));
        }
        if (self.kind == Kind::TeeF32Stack) != self.tee.as_ref().is_some_and(|t| t.rule.is_some()) {
            return Err(invalid("robust", "a robust rule is required for kind tee_f32_stack and only for it"));
        }
        Ok(())
    }

    /// Values in slice `index`: min(slice_length, vector_length − index·slice_length).
    ///
    /// # Errors
    /// `Slice` if `index >= num_slices`.
    pub fn n_valid(&self, index: u32) -> Result<usize> {
        if index >= self.num_slices {
            return Err(slice_error(index, format!("index must be < num_slices = {}", self.num_slices)));
        }
        let start = u64::from(index) * u64::from(self.slice_length);
        Ok(self.vector_length.saturating_sub(start).min(u64::from(self.slice_length)) as usize)
    }

    /// Exact payload bytes of slice `index` (None for paillier: variable).
    ///
    /// # Errors
    /// As [`RoundSpec::n_valid`].
    pub fn payload_bytes(&self, index: u32) -> Result<Option<usize>> {
        let n = self.n_valid(index)?;
        let inner = self.kind.value_bytes(n);
        Ok(if self.kind.is_tee() { inner.map(|b| SEAL_OVERHEAD + b) } else { inner })
    }

    /// Checks a participant position.
    ///
    /// # Errors
    /// `Slice` naming the limit.
    pub fn check_participant(&self, index: u32, participant: u32) -> Result<()> {
        if participant >= self.participants {
            return Err(slice_error(index, format!("participant {participant} must be < participants = {}", self.participants)));
        }
        Ok(())
    }

    fn check_size(&self, index: u32, plain_bytes: usize) -> Result<()> {
        let n = self.n_valid(index)?;
        // tee slices are checked sealed (node.rs) and arrive here opened.
        if let Some(expected) = self.kind.value_bytes(n).filter(|e| *e != plain_bytes) {
            return Err(slice_error(index, format!("payload holds {plain_bytes} bytes; {n} {} need {expected}", self.kind.values_name())));
        }
        Ok(())
    }

    fn key(&self) -> Result<&EncryptionKey> {
        self.paillier.as_deref().ok_or_else(|| invalid("paillier_key", "is required for kind 'paillier'"))
    }

    fn bitmap_words(&self) -> usize {
        (self.participants as usize).div_ceil(64)
    }
}

/// What happened to one arriving slice.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Folded in; the slice is still waiting for other participants.
    Accepted,
    /// This participant already contributed to this slice; nothing changed.
    Duplicate,
    /// The slice already completed; nothing changed.
    Late,
    /// The last participant arrived: the combined payload (little-endian f32/u32
    /// words, Paillier wire bytes, or, for tee kinds, the sealed result).
    Completed(Vec<u8>),
}

/// Counters of one tracker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrackerStats {
    /// Bytes of accumulators held in memory now.
    pub staged_bytes: u64,
    /// Highest `staged_bytes` since the last reset.
    pub peak_staged_bytes: u64,
    /// Entries held in memory.
    pub open_entries: u64,
    /// Entries spilled out of memory.
    pub spilled_entries: u64,
    /// Slices folded in.
    pub aggregated: u64,
    /// Slices completed.
    pub completed: u64,
    /// Entries spilled (total).
    pub spills: u64,
    /// Entries reloaded (total).
    pub reloads: u64,
    /// Duplicate arrivals.
    pub duplicates: u64,
    /// Late arrivals.
    pub late: u64,
}

impl TrackerStats {
    /// Adds another tracker's counters (peaks add up: an upper bound).
    pub fn add(&mut self, other: &TrackerStats) {
        self.staged_bytes += other.staged_bytes;
        self.peak_staged_bytes += other.peak_staged_bytes;
        self.open_entries += other.open_entries;
        self.spilled_entries += other.spilled_entries;
        self.aggregated += other.aggregated;
        self.completed += other.completed;
        self.spills += other.spills;
        self.reloads += other.reloads;
        self.duplicates += other.duplicates;
        self.late += other.late;
    }
}

enum Acc {
    F32(Vec<f32>),
    U32(Vec<u32>),
    /// Lattice words mod `confide_lattice::Q`.
    Rlwe(Vec<u64>),
    /// Running product; `block` keeps the first arrival's header (params with summed = 1).
    Paillier(CiphertextBlock, Arc<EncryptionKey>),
}

struct Entry {
    acc: Acc,
    wsum: f64,
    seen: Vec<u64>,
    n_seen: u32,
    first: Instant,
    seq: u64,
    bytes: usize,
}

impl Entry {
    fn seen(&self, p: u32) -> bool {
        self.seen[(p / 64) as usize] >> (p % 64) & 1 == 1
    }
    fn mark(&mut self, p: u32) {
        self.seen[(p / 64) as usize] |= 1 << (p % 64);
        self.n_seen += 1;
    }
}

enum Spilled {
    Memory(Vec<u8>),
    File(PathBuf),
}

/// A narrow slice (float16, bfloat16, scaled int8) as little-endian float32 words.
fn widen(kind: Kind, index: u32, payload: &[u8]) -> Result<Vec<u8>> {
    let words: Vec<f32> = match kind.opened() {
        Kind::F16Sum => payload.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Kind::Bf16Sum => payload.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Kind::Q8Sum => {
            let scale = f32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
            if !scale.is_finite() || scale < 0.0 {
                return Err(slice_error(index, format!("int8 slice scale is {scale}; a finite scale >= 0 is required")));
            }
            payload[4..].iter().map(|&q| f32::from(q as i8) * scale).collect()
        }
        other => return Err(invalid("kind", format!("{} slices are not narrow", other.name()))),
    };
    Ok(crate::bytes::f32_bytes(&words).to_vec())
}

/// A decoded arrival, validated and ready to fold.
enum Arrival<'a> {
    Words(&'a [u8]),
    Block(CiphertextBlock),
}

/// Validates a Paillier payload of slice `index` (packed, summed = 1, n_valid values).
fn parse_paillier(spec: &RoundSpec, index: u32, payload: &[u8]) -> Result<CiphertextBlock> {
    let key = spec.key()?;
    let n = spec.n_valid(index)?;
    let block = CiphertextBlock::from_bytes(payload, key).map_err(|source| Error::Paillier { index, source })?;
    let batchcrypt = match block.encoding {
        Encoding::BatchCrypt => true,
        Encoding::FlBooster => false,
        other => {
            return Err(slice_error(
                index,
                format!("ciphertext block encoding is {other:?}; a packed vector (BatchCrypt or FLBooster) is required"),
            ))
        }
    };
    let (codec, plaintext_bits, length, summed) =
        from_params(&block.params, batchcrypt).map_err(|e| slice_error(index, format!("codec parameters: {e}")))?;
    if summed != 1 {
        return Err(slice_error(
            index,
            format!("ciphertext block has summed = {summed}; one participant's vector (summed = 1) is required"),
        ));
    }
    if length != n as u64 {
        return Err(slice_error(index, format!("ciphertext block packs {length} values; slice holds {n}")));
    }
    if plaintext_bits != key.bits() {
        return Err(slice_error(index, format!("codec was built for {plaintext_bits}-bit plaintexts; key has {} bits", key.bits())));
    }
    let layout = match &codec {
        Codec::BatchCrypt(c) => c.layout(),
        Codec::FlBooster(c) => c.layout(),
    };
    let expected = layout.plaintexts_for(n);
    if block.ciphertexts.len() != expected {
        return Err(slice_error(index, format!("{n} packed values need {expected} ciphertexts; block has {}", block.ciphertexts.len())));
    }
    Ok(block)
}

/// The per-worker state tracker.
pub struct Tracker {
    cap: usize,
    spill_dir: Option<PathBuf>,
    name: String,
    entries: HashMap<(u64, u32), Entry>,
    spilled: HashMap<(u64, u32), Spilled>,
    completed: HashMap<u64, Vec<u64>>,
    seq: u64,
    stats: TrackerStats,
}

impl Drop for Tracker {
    fn drop(&mut self) {
        for (_, s) in self.spilled.drain() {
            if let Spilled::File(path) = s {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// A little-endian reader with errors naming the blob.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Reader { bytes, position: 0, what }
    }
    pub(crate) fn take(&mut self, count: usize, field: &str) -> Result<&'a [u8]> {
        let end = self.position.checked_add(count).filter(|&e| e <= self.bytes.len()).ok_or_else(|| {
            malformed(
                self.what,
                format!("truncated at {field}: needs {count} bytes at offset {}, {} bytes in all", self.position, self.bytes.len()),
            )
        })?;
        let out = &self.bytes[self.position..end];
        self.position = end;
        Ok(out)
    }
    pub(crate) fn u8(&mut self, field: &str) -> Result<u8> {
        Ok(self.take(1, field)?[0])
    }
    pub(crate) fn u32(&mut self, field: &str) -> Result<u32> {
        let b = self.take(4, field)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(crate) fn u64(&mut self, field: &str) -> Result<u64> {
        let b = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    pub(crate) fn finish(&self) -> Result<()> {
        if self.position != self.bytes.len() {
            return Err(malformed(self.what, format!("{} trailing bytes", self.bytes.len() - self.position)));
        }
        Ok(())
    }
}

/// The incomplete entries of one round, as a versioned blob:
///
/// ```text
/// "CAGK" ‖ u8 version = 1 ‖ u64 round_id ‖ u8 kind ‖ u32 participants ‖ u32 num_slices
/// ‖ u32 slice_length ‖ u64 vector_length ‖ u32 words ‖ completed bitmap (words × u64)
/// ‖ u32 entries ‖ entries × (u32 length ‖ entry) ‖ SHA-256 of everything before
/// entry = u32 index ‖ u32 n_seen ‖ f64 wsum ‖ u32 words ‖ seen bitmap (words × u64)
///       ‖ u8 acc (1 f32, 2 u32, 3 paillier) ‖ u32 length ‖ acc bytes
/// ```
/// All integers little-endian; Paillier accumulators are ciphertext-block wire bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundCheckpoint {
    /// Round id.
    pub round_id: u64,
    kind: u8,
    participants: u32,
    num_slices: u32,
    slice_length: u32,
    vector_length: u64,
    /// Bitmap of completed slice indexes.
    pub completed: Vec<u64>,
    /// (index, serialized entry).
    pub entries: Vec<(u32, Vec<u8>)>,
}

impl RoundCheckpoint {
    /// An empty checkpoint for `spec`.
    pub fn empty(spec: &RoundSpec) -> Self {
        RoundCheckpoint {
            round_id: spec.round_id,
            kind: spec.kind.tag(),
            participants: spec.participants,
            num_slices: spec.num_slices,
            slice_length: spec.slice_length,
            vector_length: spec.vector_length,
            completed: vec![0; (spec.num_slices as usize).div_ceil(64)],
            entries: Vec::new(),
        }
    }

    /// Adds another part of the same round (entries appended, completed bits or-ed).
    pub fn merge(&mut self, other: RoundCheckpoint) {
        for (a, b) in self.completed.iter_mut().zip(&other.completed) {
            *a |= b;
        }
        self.entries.extend(other.entries);
        self.entries.sort_by_key(|(i, _)| *i);
    }

    /// Splits the entries by level-2 worker (each part keeps the completed bitmap).
    pub fn split(self, session_hash: u64, workers: usize) -> Vec<RoundCheckpoint> {
        let mut parts: Vec<RoundCheckpoint> =
            (0..workers.max(1)).map(|_| RoundCheckpoint { entries: Vec::new(), ..self.clone_header() }).collect();
        for (index, entry) in self.entries {
            parts[crate::routing::worker_for(session_hash, index, workers)].entries.push((index, entry));
        }
        parts
    }

    fn clone_header(&self) -> RoundCheckpoint {
        RoundCheckpoint { entries: Vec::new(), completed: self.completed.clone(), ..*self }
    }

    /// Serializes (see the type documentation).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.entries.iter().map(|(_, e)| e.len() + 4).sum::<usize>());
        out.extend_from_slice(CHECKPOINT_MAGIC);
        out.push(CHECKPOINT_VERSION);
        put_u64(&mut out, self.round_id);
        out.push(self.kind);
        put_u32(&mut out, self.participants);
        put_u32(&mut out, self.num_slices);
        put_u32(&mut out, self.slice_length);
        put_u64(&mut out, self.vector_length);
        put_u32(&mut out, self.completed.len() as u32);
        for w in &self.completed {
            put_u64(&mut out, *w);
        }
        put_u32(&mut out, self.entries.len() as u32);
        for (_, e) in &self.entries {
            put_u32(&mut out, e.len() as u32);
            out.extend_from_slice(e);
        }
        let digest = Sha256::digest(&out);
        out.extend_from_slice(&digest);
        out
    }

    /// Parses a blob (structure and checksum only; entries are validated on restore).
    ///
    /// # Errors
    /// `Malformed` naming the field.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        const WHAT: &str = "checkpoint";
        if bytes.len() < 32 {
            return Err(malformed(WHAT, format!("{} bytes is shorter than the 32-byte checksum", bytes.len())));
        }
        let (body, digest) = bytes.split_at(bytes.len() - 32);
        if Sha256::digest(body).as_slice() != digest {
            return Err(malformed(WHAT, "SHA-256 checksum does not match"));
        }
        let mut r = Reader::new(body, WHAT);
        if r.take(4, "magic")? != CHECKPOINT_MAGIC {
            return Err(malformed(WHAT, "magic must be \"CAGK\""));
        }
        let version = r.u8("version")?;
        if version != CHECKPOINT_VERSION {
            return Err(malformed(WHAT, format!("version must be {CHECKPOINT_VERSION}, got {version}")));
        }
        let round_id = r.u64("round_id")?;
        let kind = r.u8("kind")?;
        let participants = r.u32("participants")?;
        let num_slices = r.u32("num_slices")?;
        let slice_length = r.u32("slice_length")?;
        let vector_length = r.u64("vector_length")?;
        let words = r.u32("completed words")? as usize;
        if words != (num_slices as usize).div_ceil(64) {
            return Err(malformed(
                WHAT,
                format!("completed bitmap has {words} words; {num_slices} slices need {}", (num_slices as usize).div_ceil(64)),
            ));
        }
        let completed = (0..words).map(|_| r.u64("completed bitmap")).collect::<Result<Vec<_>>>()?;
        let count = r.u32("entry count")? as usize;
        let mut entries = Vec::with_capacity(count.min(1 << 16));
        for _ in 0..count {
            let len = r.u32("entry length")? as usize;
            let entry = r.take(len, "entry")?;
            let index = Reader::new(entry, WHAT).u32("entry index")?;
            entries.push((index, entry.to_vec()));
        }
        r.finish()?;
        Ok(RoundCheckpoint { round_id, kind, participants, num_slices, slice_length, vector_length, completed, entries })
    }

    /// Checks that the header describes the round `spec`.
    ///
    /// # Errors
    /// `Malformed` naming the mismatching field.
    pub fn check_spec(&self, spec: &RoundSpec) -> Result<()> {
        let mismatch =
            |field: &str, found: u64, expected: u64| malformed("checkpoint", format!("{field} is {found}; the open round has {expected}"));
        if self.round_id != spec.round_id {
            return Err(mismatch("round_id", self.round_id, spec.round_id));
        }
        if self.kind != spec.kind.tag() {
            return Err(mismatch("kind", u64::from(self.kind), u64::from(spec.kind.tag())));
        }
        if self.participants != spec.participants {
            return Err(mismatch("participants", u64::from(self.participants), u64::from(spec.participants)));
        }
        if self.num_slices != spec.num_slices {
            return Err(mismatch("num_slices", u64::from(self.num_slices), u64::from(spec.num_slices)));
        }
        if self.slice_length != spec.slice_length {
            return Err(mismatch("slice_length", u64::from(self.slice_length), u64::from(spec.slice_length)));
        }
        if self.vector_length != spec.vector_length {
            return Err(mismatch("vector_length", self.vector_length, spec.vector_length));
        }
        Ok(())
    }
}

fn completed_bit(bitmap: Option<&Vec<u64>>, index: u32) -> bool {
    bitmap.and_then(|b| b.get((index / 64) as usize)).is_some_and(|w| w >> (index % 64) & 1 == 1)
}

impl Tracker {
    /// A tracker holding at most `max_staged_bytes` of accumulators in memory
    /// (beyond it, the oldest incomplete entries spill to `spill_dir`, or to an
    /// in-memory cold map without one). `name` keeps spill file names apart.
    pub fn new(max_staged_bytes: usize, spill_dir: Option<PathBuf>, name: impl Into<String>) -> Self {
        Tracker {
            cap: max_staged_bytes,
            spill_dir,
            name: name.into(),
            entries: HashMap::new(),
            spilled: HashMap::new(),
            completed: HashMap::new(),
            seq: 0,
            stats: TrackerStats::default(),
        }
    }

    /// Current counters.
    pub fn stats(&self) -> TrackerStats {
        let mut s = self.stats.clone();
        s.open_entries = self.entries.len() as u64;
        s.spilled_entries = self.spilled.len() as u64;
        s
    }

    /// Sets the peak to the current staged bytes.
    pub fn reset_peak(&mut self) {
        self.stats.peak_staged_bytes = self.stats.staged_bytes;
    }

    fn add_staged(&mut self, bytes: usize) {
        self.stats.staged_bytes += bytes as u64;
        self.stats.peak_staged_bytes = self.stats.peak_staged_bytes.max(self.stats.staged_bytes);
    }

    fn sub_staged(&mut self, bytes: usize) {
        self.stats.staged_bytes = self.stats.staged_bytes.saturating_sub(bytes as u64);
    }

    /// Folds one slice. See [`Outcome`].
    ///
    /// # Errors
    /// `Slice` naming the field and limit (index, participant, size, non-finite
    /// value, Paillier block), `Io` if a spill file cannot be read or written.
    pub fn ingest(&mut self, spec: &RoundSpec, participant: u32, index: u32, payload: &[u8]) -> Result<Outcome> {
        spec.n_valid(index)?;
        spec.check_participant(index, participant)?;
        spec.check_size(index, payload.len())?;
        let key = (spec.round_id, index);
        if completed_bit(self.completed.get(&spec.round_id), index) {
            self.stats.late += 1;
            return Ok(Outcome::Late);
        }
        if self.spilled.contains_key(&key) {
            self.reload(spec, key)?;
        }
        if self.entries.get(&key).is_some_and(|e| e.seen(participant)) {
            self.stats.duplicates += 1;
            return Ok(Outcome::Duplicate);
        }
        let widened;
        let payload = if spec.kind.is_narrow() {
            widened = widen(spec.kind, index, payload)?;
            &widened[..]
        } else {
            payload
        };
        let arrival = match spec.kind {
            Kind::PaillierProduct => Arrival::Block(parse_paillier(spec, index, payload)?),
            k => {
                if k.is_f32() && !kernels::all_finite_f32_bytes_at(kernels::level(), payload) {
                    return Err(slice_error(index, "payload holds a non-finite float32 (NaN or infinity)"));
                }
                Arrival::Words(payload)
            }
        };
        let w = spec.weights[participant as usize];
        match self.entries.get_mut(&key) {
            Some(entry) => {
                match (&mut entry.acc, arrival) {
                    (Acc::F32(acc), Arrival::Words(x)) if spec.kind.opened() == Kind::F32Stack => stack_row(acc, x, participant),
                    (Acc::F32(acc), Arrival::Words(x)) => kernels::accumulate_f32_bytes(acc, x, w)?,
                    (Acc::U32(acc), Arrival::Words(x)) => kernels::accumulate_u32_bytes_at(kernels::level(), acc, x)?,
                    (Acc::Rlwe(acc), Arrival::Words(x)) => fold_rlwe(acc, x, index, participant)?,
                    (Acc::Paillier(acc, _), Arrival::Block(block)) => {
                        if acc.params != block.params || acc.encoding != block.encoding {
                            return Err(slice_error(index, "ciphertext block codec or length differs from the first arrival's"));
                        }
                        let key = spec.key()?;
                        for (a, c) in acc.ciphertexts.iter_mut().zip(&block.ciphertexts) {
                            *a = key.add(a, c);
                        }
                    }
                    _ => return Err(slice_error(index, "payload kind does not match the entry")),
                }
                entry.wsum += f64::from(w);
                entry.mark(participant);
            }
            None => {
                let (acc, bytes) = match arrival {
                    Arrival::Words(x) if spec.kind == Kind::RlweSum => {
                        let mut v = vec![0u64; x.len() / 8];
                        fold_rlwe(&mut v, x, index, participant)?;
                        let b = v.len() * 8;
                        (Acc::Rlwe(v), b)
                    }
                    Arrival::Words(x) if spec.kind.opened() == Kind::F32Stack => {
                        let mut v = vec![0f32; x.len() / 4 * spec.participants as usize];
                        stack_row(&mut v, x, participant);
                        let b = v.len() * 4;
                        (Acc::F32(v), b)
                    }
                    Arrival::Words(x) if spec.kind == Kind::U32Sum => {
                        let v: Vec<u32> = x.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                        let b = v.len() * 4;
                        (Acc::U32(v), b)
                    }
                    Arrival::Words(x) => {
                        let mut v = vec![0f32; x.len() / 4];
                        kernels::scale_into_f32_bytes_at(kernels::level(), &mut v, x, w)?;
                        let b = v.len() * 4;
                        (Acc::F32(v), b)
                    }
                    Arrival::Block(block) => {
                        let key = spec.paillier.clone().ok_or_else(|| invalid("paillier_key", "is required for kind 'paillier'"))?;
                        let b = block.ciphertexts.len() * key.ciphertext_bytes();
                        (Acc::Paillier(block, key), b)
                    }
                };
                self.make_room(bytes)?;
                self.seq += 1;
                let mut entry = Entry {
                    acc,
                    wsum: f64::from(w),
                    seen: vec![0; spec.bitmap_words()],
                    n_seen: 0,
                    first: Instant::now(),
                    seq: self.seq,
                    bytes,
                };
                entry.mark(participant);
                self.add_staged(bytes);
                self.entries.insert(key, entry);
            }
        }
        self.stats.aggregated += 1;
        if self.entries.get(&key).is_some_and(|e| e.n_seen == spec.participants) {
            if let Some(entry) = self.entries.remove(&key) {
                self.sub_staged(entry.bytes);
                let bitmap = self.completed.entry(spec.round_id).or_insert_with(|| vec![0; (spec.num_slices as usize).div_ceil(64)]);
                if let Some(word) = bitmap.get_mut((index / 64) as usize) {
                    *word |= 1 << (index % 64);
                }
                self.stats.completed += 1;
                return Ok(Outcome::Completed(finish(spec, entry)?));
            }
        }
        Ok(Outcome::Accepted)
    }

    /// Age of the oldest incomplete entry of a round held in memory (for timeouts).
    pub fn oldest_age(&self, round_id: u64) -> Option<std::time::Duration> {
        self.entries.iter().filter(|((r, _), _)| *r == round_id).map(|(_, e)| e.first.elapsed()).max()
    }

    fn make_room(&mut self, bytes: usize) -> Result<()> {
        while self.stats.staged_bytes as usize + bytes > self.cap {
            let Some(oldest) = self.entries.iter().min_by_key(|(_, e)| e.seq).map(|(k, _)| *k) else {
                break;
            };
            self.spill(oldest)?;
        }
        Ok(())
    }

    fn spill(&mut self, key: (u64, u32)) -> Result<()> {
        let Some(entry) = self.entries.get(&key) else {
            return Ok(());
        };
        let bytes = encode_entry(key.1, entry)?;
        let place = match &self.spill_dir {
            Some(dir) => {
                let path = dir.join(format!("{}-r{}-i{}.spill", self.name, key.0, key.1));
                std::fs::write(&path, &bytes).map_err(|e| Error::Io { path: path.display().to_string(), reason: e.to_string() })?;
                Spilled::File(path)
            }
            None => Spilled::Memory(bytes),
        };
        if let Some(entry) = self.entries.remove(&key) {
            self.sub_staged(entry.bytes);
        }
        self.spilled.insert(key, place);
        self.stats.spills += 1;
        Ok(())
    }

    fn spilled_bytes(place: &Spilled) -> Result<Vec<u8>> {
        match place {
            Spilled::Memory(b) => Ok(b.clone()),
            Spilled::File(path) => std::fs::read(path).map_err(|e| Error::Io { path: path.display().to_string(), reason: e.to_string() }),
        }
    }

    fn take_spilled(&mut self, key: (u64, u32)) -> Result<Option<Vec<u8>>> {
        let Some(place) = self.spilled.remove(&key) else {
            return Ok(None);
        };
        let bytes = Self::spilled_bytes(&place);
        if let Spilled::File(path) = &place {
            if bytes.is_ok() {
                let _ = std::fs::remove_file(path);
            } else {
                self.spilled.insert(key, place);
            }
        }
        bytes.map(Some)
    }

    fn reload(&mut self, spec: &RoundSpec, key: (u64, u32)) -> Result<()> {
        let Some(bytes) = self.take_spilled(key)? else {
            return Ok(());
        };
        let (index, mut entry) = decode_entry(spec, &bytes)?;
        if index != key.1 {
            return Err(malformed("spilled entry", format!("holds index {index}, expected {}", key.1)));
        }
        self.make_room(entry.bytes)?;
        self.seq += 1;
        entry.seq = self.seq;
        self.add_staged(entry.bytes);
        self.entries.insert(key, entry);
        self.stats.reloads += 1;
        Ok(())
    }

    /// Serializes and frees every incomplete entry of the round (see [`RoundCheckpoint`]).
    ///
    /// # Errors
    /// `Io` if a spilled entry cannot be read back.
    pub fn checkpoint_parts(&mut self, spec: &RoundSpec) -> Result<RoundCheckpoint> {
        let mut out = RoundCheckpoint::empty(spec);
        if let Some(bitmap) = self.completed.get(&spec.round_id) {
            out.completed.clone_from(bitmap);
        }
        let spilled: Vec<(u64, u32)> = self.spilled.keys().filter(|k| k.0 == spec.round_id).copied().collect();
        for key in spilled {
            if let Some(bytes) = self.take_spilled(key)? {
                out.entries.push((key.1, bytes));
            }
        }
        let keys: Vec<(u64, u32)> = self.entries.keys().filter(|k| k.0 == spec.round_id).copied().collect();
        for key in &keys {
            if let Some(entry) = self.entries.get(key) {
                out.entries.push((key.1, encode_entry(key.1, entry)?));
            }
        }
        for key in keys {
            if let Some(entry) = self.entries.remove(&key) {
                self.sub_staged(entry.bytes);
            }
        }
        out.entries.sort_by_key(|(i, _)| *i);
        Ok(out)
    }

    /// [`Tracker::checkpoint_parts`] as one blob.
    ///
    /// # Errors
    /// As [`Tracker::checkpoint_parts`].
    pub fn checkpoint_round(&mut self, spec: &RoundSpec) -> Result<Vec<u8>> {
        Ok(self.checkpoint_parts(spec)?.encode())
    }

    /// Rebuilds the entries of a checkpoint (all validated before any is inserted).
    ///
    /// # Errors
    /// `Malformed` naming the field (wrong round, bad entry, an index that is
    /// already open or completed, a duplicate index).
    pub fn restore_parts(&mut self, spec: &RoundSpec, checkpoint: &RoundCheckpoint) -> Result<()> {
        checkpoint.check_spec(spec)?;
        let mut decoded = Vec::with_capacity(checkpoint.entries.len());
        let mut indexes = std::collections::HashSet::new();
        let completed = self.completed.get(&spec.round_id);
        for (index, bytes) in &checkpoint.entries {
            let (found, entry) = decode_entry(spec, bytes)?;
            if found != *index {
                return Err(malformed("checkpoint", format!("entry index {found} does not match its header {index}")));
            }
            let key = (spec.round_id, found);
            if !indexes.insert(found) || self.entries.contains_key(&key) || self.spilled.contains_key(&key) {
                return Err(malformed("checkpoint", format!("slice {found} is already open")));
            }
            if completed_bit(completed, found) || completed_bit(Some(&checkpoint.completed), found) {
                return Err(malformed("checkpoint", format!("slice {found} is both incomplete and completed")));
            }
            decoded.push((found, entry));
        }
        if checkpoint.completed.iter().any(|w| *w != 0) || self.completed.contains_key(&spec.round_id) {
            let bitmap = self.completed.entry(spec.round_id).or_insert_with(|| vec![0; (spec.num_slices as usize).div_ceil(64)]);
            for (a, b) in bitmap.iter_mut().zip(&checkpoint.completed) {
                *a |= b;
            }
        }
        for (index, mut entry) in decoded {
            self.make_room(entry.bytes)?;
            self.seq += 1;
            entry.seq = self.seq;
            self.add_staged(entry.bytes);
            self.entries.insert((spec.round_id, index), entry);
        }
        Ok(())
    }

    /// Parses a blob and restores it.
    ///
    /// # Errors
    /// As [`RoundCheckpoint::decode`] and [`Tracker::restore_parts`].
    pub fn restore_round(&mut self, spec: &RoundSpec, blob: &[u8]) -> Result<()> {
        self.restore_parts(spec, &RoundCheckpoint::decode(blob)?)
    }

    /// (index, missing participant positions) of every incomplete entry of the
    /// round, by index. Slices no participant has sent are not listed.
    ///
    /// # Errors
    /// `Io` if a spilled entry cannot be read.
    pub fn missing(&self, spec: &RoundSpec) -> Result<Vec<(u32, Vec<u32>)>> {
        let absent = |seen: &[u64]| -> Vec<u32> {
            (0..spec.participants).filter(|p| seen.get((p / 64) as usize).is_none_or(|w| w >> (p % 64) & 1 == 0)).collect()
        };
        let mut out: Vec<(u32, Vec<u32>)> =
            self.entries.iter().filter(|(k, _)| k.0 == spec.round_id).map(|(k, e)| (k.1, absent(&e.seen))).collect();
        for (key, place) in self.spilled.iter().filter(|(k, _)| k.0 == spec.round_id) {
            let bytes = Self::spilled_bytes(place)?;
            let (_, seen) = entry_header(&bytes)?;
            out.push((key.1, absent(&seen)));
        }
        out.sort_by_key(|(i, _)| *i);
        Ok(out)
    }

    /// Frees every entry (and spill file) of a round and forgets its completed slices.
    pub fn close_round(&mut self, round_id: u64) {
        let keys: Vec<(u64, u32)> = self.entries.keys().filter(|k| k.0 == round_id).copied().collect();
        for key in keys {
            if let Some(entry) = self.entries.remove(&key) {
                self.sub_staged(entry.bytes);
            }
        }
        let spilled: Vec<(u64, u32)> = self.spilled.keys().filter(|k| k.0 == round_id).copied().collect();
        for key in spilled {
            if let Some(Spilled::File(path)) = self.spilled.remove(&key) {
                let _ = std::fs::remove_file(path);
            }
        }
        self.completed.remove(&round_id);
    }
}

/// Folds one participant's lattice words into ``acc`` (mod q); a word out of range is refused by
/// participant and index, and nothing is added.
fn fold_rlwe(acc: &mut [u64], words: &[u8], index: u32, participant: u32) -> Result<()> {
    confide_lattice::packed::fold_words(acc, words).map_err(|(at, value)| {
        slice_error(
            index,
            format!("participant {participant}: lattice word {at} is {value}, outside [0, q = {}); nothing was added", confide_lattice::Q),
        )
    })
}

/// Copies a participant's float32 slice into its row of a stacked block (rows of `x.len() / 4`).
fn stack_row(block: &mut [f32], x: &[u8], participant: u32) {
    let n = x.len() / 4;
    let row = &mut block[participant as usize * n..(participant as usize + 1) * n];
    for (value, bytes) in row.iter_mut().zip(x.chunks_exact(4)) {
        *value = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    }
}

fn rlwe_bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn finish(spec: &RoundSpec, entry: Entry) -> Result<Vec<u8>> {
    Ok(match entry.acc {
        Acc::F32(acc) => {
            let mut out = Vec::with_capacity(acc.len() * 4);
            if spec.kind.is_mean() {
                for v in acc {
                    out.extend_from_slice(&((f64::from(v) / entry.wsum) as f32).to_le_bytes());
                }
            } else {
                out.extend_from_slice(crate::bytes::f32_bytes(&acc));
            }
            out
        }
        Acc::U32(acc) => crate::bytes::u32_bytes(&acc).to_vec(),
        Acc::Rlwe(acc) => rlwe_bytes(&acc),
        Acc::Paillier(mut block, key) => {
            let (codec, bits, length, _) = from_params(&block.params, block.encoding == Encoding::BatchCrypt)
                .map_err(|e| invalid("paillier", format!("codec parameters: {e}")))?;
            block.params = to_params(&codec, bits, length, u64::from(spec.participants));
            block.flags = 0;
            block.to_bytes(&key).map_err(|source| Error::Paillier { index: 0, source })?
        }
    })
}

fn encode_entry(index: u32, entry: &Entry) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(32 + entry.bytes + entry.seen.len() * 8);
    put_u32(&mut out, index);
    put_u32(&mut out, entry.n_seen);
    put_u64(&mut out, entry.wsum.to_bits());
    put_u32(&mut out, entry.seen.len() as u32);
    for w in &entry.seen {
        put_u64(&mut out, *w);
    }
    let (tag, body): (u8, std::borrow::Cow<'_, [u8]>) = match &entry.acc {
        Acc::F32(v) => (1, crate::bytes::f32_bytes(v).into()),
        Acc::U32(v) => (2, crate::bytes::u32_bytes(v).into()),
        Acc::Rlwe(v) => (4, rlwe_bytes(v).into()),
        Acc::Paillier(block, key) => (3, block.to_bytes(key).map_err(|source| Error::Paillier { index, source })?.into()),
    };
    out.push(tag);
    put_u32(&mut out, body.len() as u32);
    out.extend_from_slice(&body);
    Ok(out)
}

fn entry_header(bytes: &[u8]) -> Result<(Reader<'_>, Vec<u64>)> {
    let mut r = Reader::new(bytes, "checkpoint entry");
    r.u32("index")?;
    r.u32("n_seen")?;
    r.u64("wsum")?;
    let words = r.u32("seen words")? as usize;
    if words > (MAX_PARTICIPANTS as usize).div_ceil(64) {
        return Err(malformed("checkpoint entry", format!("seen bitmap has {words} words; at most {}", MAX_PARTICIPANTS / 64)));
    }
    let seen = (0..words).map(|_| r.u64("seen bitmap")).collect::<Result<Vec<_>>>()?;
    Ok((r, seen))
}

fn decode_entry(spec: &RoundSpec, bytes: &[u8]) -> Result<(u32, Entry)> {
    const WHAT: &str = "checkpoint entry";
    let mut head = Reader::new(bytes, WHAT);
    let index = head.u32("index")?;
    let n_seen = head.u32("n_seen")?;
    let wsum = f64::from_bits(head.u64("wsum")?);
    let (mut r, seen) = entry_header(bytes)?;
    let n = spec.n_valid(index).map_err(|_| malformed(WHAT, format!("index {index} must be < num_slices = {}", spec.num_slices)))?;
    if seen.len() != spec.bitmap_words() {
        return Err(malformed(
            WHAT,
            format!("slice {index}: seen bitmap has {} words; {} participants need {}", seen.len(), spec.participants, spec.bitmap_words()),
        ));
    }
    let popcount: u32 = seen.iter().map(|w| w.count_ones()).sum();
    let beyond = (spec.participants..spec.bitmap_words() as u32 * 64).any(|p| seen[(p / 64) as usize] >> (p % 64) & 1 == 1);
    if beyond || popcount != n_seen || n_seen == 0 || n_seen >= spec.participants {
        return Err(malformed(
            WHAT,
            format!(
                "slice {index}: n_seen = {n_seen} must equal the seen bits ({popcount}), lie in 1..{} and name only participants < {}",
                spec.participants, spec.participants
            ),
        ));
    }
    if !wsum.is_finite() || wsum < 0.0 {
        return Err(malformed(WHAT, format!("slice {index}: wsum = {wsum} must be finite and >= 0")));
    }
    let tag = r.u8("accumulator kind")?;
    let len = r.u32("accumulator length")? as usize;
    let body = r.take(len, "accumulator")?;
    r.finish()?;
    let (acc, bytes_held) = match (tag, spec.kind) {
        (1, k) if k.is_f32() => {
            // a stacked slice holds every participant's row
            let n = if k.opened() == Kind::F32Stack { n * spec.participants as usize } else { n };
            if len != 4 * n || !kernels::all_finite_f32_bytes_at(kernels::level(), body) {
                return Err(malformed(
                    WHAT,
                    format!("slice {index}: accumulator must hold {n} finite float32 values ({} bytes), got {len} bytes", 4 * n),
                ));
            }
            (Acc::F32(body.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()), len)
        }
        (2, Kind::U32Sum) => {
            if len != 4 * n {
                return Err(malformed(WHAT, format!("slice {index}: accumulator must hold {n} uint32 words ({} bytes), got {len}", 4 * n)));
            }
            (Acc::U32(body.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()), len)
        }
        (4, Kind::RlweSum) => {
            let words = n.div_ceil(2);
            let mut acc = vec![0u64; words];
            if len != 8 * words || confide_lattice::packed::fold_words(&mut acc, body).is_err() {
                return Err(malformed(
                    WHAT,
                    format!("slice {index}: accumulator must hold {words} lattice words under q ({} bytes), got {len} bytes", 8 * words),
                ));
            }
            (Acc::Rlwe(acc), len)
        }
        (3, Kind::PaillierProduct) => {
            let block = parse_paillier(spec, index, body).map_err(|e| malformed(WHAT, e.to_string()))?;
            let key = spec.paillier.clone().ok_or_else(|| invalid("paillier_key", "is required for kind 'paillier'"))?;
            let held = block.ciphertexts.len() * key.ciphertext_bytes();
            (Acc::Paillier(block, key), held)
        }
        (tag, kind) => return Err(malformed(WHAT, format!("slice {index}: accumulator kind {tag} does not fit a {} round", kind.name()))),
    };
    Ok((index, Entry { acc, wsum, seen, n_seen, first: Instant::now(), seq: 0, bytes: bytes_held }))
}
