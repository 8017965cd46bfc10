//! [`DataPlane`]: one aggregator node. One worker thread per core, each owning a
//! [`Tracker`] and fed by its own bounded queue (back-pressure on the callers);
//! a message wall of open rounds; level-2 routing
//! `worker = mix64(session_hash ^ index) mod workers`, so one index of a session
//! always reaches the same worker and no state is shared between workers.
//!
//! [`DataPlane::push`] is called by many threads at once (one per network
//! stream). It validates what is cheap, dispatches every slice of the batch to
//! its worker (the batch bytes are shared, not copied, through one `Arc`) and
//! waits until each slice was processed, so errors reach the caller.

use crate::enclave::Enclave;
use crate::error::{invalid, slice_error, Error, Result};
use crate::kernels;
use crate::routing::worker_for;
use crate::tracker::{Outcome, RoundCheckpoint, RoundSpec, Tracker, TrackerStats};
use crate::wire::BatchView;
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

/// Jobs each worker queue holds before `push` blocks.
pub const QUEUE_DEPTH: usize = 256;

/// What one `push` did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PushResult {
    /// Slices folded in (including those that completed).
    pub accepted: u32,
    /// Slices this participant had already sent.
    pub duplicates: u32,
    /// Slices that had already completed.
    pub late: u32,
    /// (index, combined payload) of every slice this batch completed, plus any
    /// completions kept from an earlier batch of the round that failed.
    pub completed: Vec<(u32, Vec<u8>)>,
}

/// Counters of the whole node: its trackers' counters summed (workers and enclave), and what only
/// the node knows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Worker threads.
    pub workers: usize,
    /// SIMD level of the primitive.
    pub simd_level: &'static str,
    /// The trackers' counters summed; `peak_staged_bytes` is the node's peak, `aggregated` the
    /// workers' total.
    pub tracker: TrackerStats,
    /// Slices folded per worker.
    pub per_worker_aggregated: Vec<u64>,
}

type SliceReply = (usize, u32, Result<Outcome>);
/// (index, missing participant positions) per incomplete slice.
pub type Missing = Vec<(u32, Vec<u32>)>;
/// (index, combined payload) per completed slice.
pub type Completed = Vec<(u32, Vec<u8>)>;

/// Bytes shared by the workers folding one batch: a copy, or the received message itself.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

enum Job {
    Ingest {
        spec: Arc<RoundSpec>,
        participant: u32,
        index: u32,
        batch: SharedBytes,
        offset: usize,
        len: usize,
        position: usize,
        reply: Sender<SliceReply>,
    },
    Checkpoint {
        spec: Arc<RoundSpec>,
        reply: Sender<Result<RoundCheckpoint>>,
    },
    Restore {
        spec: Arc<RoundSpec>,
        part: RoundCheckpoint,
        reply: Sender<Result<()>>,
    },
    Missing {
        spec: Arc<RoundSpec>,
        reply: Sender<Result<Missing>>,
    },
    Close {
        round_id: u64,
        reply: Sender<()>,
    },
    ResetPeak {
        reply: Sender<()>,
    },
}

#[derive(Default)]
struct Shared {
    staged: AtomicU64,
    peak: AtomicU64,
    snapshots: Vec<Mutex<TrackerStats>>,
    aggregated: Vec<AtomicU64>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A round on the message wall: its spec, the indices this node's share owns
/// (None: all) and the slices each participant has had folded in.
struct Entry {
    spec: Arc<RoundSpec>,
    owned: Option<Vec<bool>>,
    share: u32,
    cluster_nodes: u32,
    contributed: Vec<AtomicU32>,
}

/// One aggregator node (see the module documentation).
pub struct DataPlane {
    senders: Vec<Sender<Job>>,
    handles: Vec<JoinHandle<()>>,
    wall: RwLock<HashMap<u64, Arc<Entry>>>,
    enclave: Option<Arc<dyn Enclave>>,
    shared: Arc<Shared>,
    pending: Mutex<HashMap<u64, Completed>>,
}

impl Drop for DataPlane {
    fn drop(&mut self) {
        self.senders.clear();
        for handle in self.handles.drain(..) {
            let _ = handle.join();
        }
    }
}

fn worker_loop(id: usize, jobs: Receiver<Job>, mut tracker: Tracker, enclave: Option<Arc<dyn Enclave>>, shared: Arc<Shared>) {
    let mut last_staged = 0u64;
    while let Ok(job) = jobs.recv() {
        // The reply goes out after this worker's stats are published: a caller that reads
        // `stats()` once its call returned sees what the call did (it read the previous job's).
        let reply: Box<dyn FnOnce()> = match job {
            Job::Ingest { spec, participant, index, batch, offset, len, position, reply } => {
                let payload = &(*batch).as_ref()[offset..offset + len];
                let result = if spec.kind.is_tee() {
                    match &enclave {
                        Some(e) => e.ingest(id, spec.round_id, participant, index, payload),
                        None => Err(invalid("enclave", "a tee round needs an enclave")),
                    }
                } else {
                    tracker.ingest(&spec, participant, index, payload)
                };
                if matches!(result, Ok(Outcome::Accepted | Outcome::Completed(_))) {
                    shared.aggregated[id].fetch_add(1, Ordering::Relaxed);
                }
                Box::new(move || {
                    let _ = reply.send((position, index, result));
                })
            }
            Job::Checkpoint { spec, reply } => {
                let parts = tracker.checkpoint_parts(&spec);
                Box::new(move || {
                    let _ = reply.send(parts);
                })
            }
            Job::Restore { spec, part, reply } => {
                let restored = tracker.restore_parts(&spec, &part);
                Box::new(move || {
                    let _ = reply.send(restored);
                })
            }
            Job::Missing { spec, reply } => {
                let missing = tracker.missing(&spec);
                Box::new(move || {
                    let _ = reply.send(missing);
                })
            }
            Job::Close { round_id, reply } => {
                tracker.close_round(round_id);
                Box::new(move || {
                    let _ = reply.send(());
                })
            }
            Job::ResetPeak { reply } => {
                tracker.reset_peak();
                Box::new(move || {
                    let _ = reply.send(());
                })
            }
        };
        let stats = tracker.stats();
        if stats.staged_bytes != last_staged {
            let now = if stats.staged_bytes > last_staged {
                shared.staged.fetch_add(stats.staged_bytes - last_staged, Ordering::Relaxed) + (stats.staged_bytes - last_staged)
            } else {
                shared.staged.fetch_sub(last_staged - stats.staged_bytes, Ordering::Relaxed) - (last_staged - stats.staged_bytes)
            };
            shared.peak.fetch_max(now, Ordering::Relaxed);
            last_staged = stats.staged_bytes;
        }
        *lock(&shared.snapshots[id]) = stats;
        reply();
    }
}

impl DataPlane {
    /// Starts `workers` threads (0 = one per core; with an enclave, 0 = as many as
    /// it has threads). `max_staged_bytes` is split evenly between them.
    ///
    /// # Errors
    /// `InvalidParameter` (worker count differs from the enclave's, spill_dir
    /// missing), `Io` if a thread cannot start.
    pub fn new(workers: usize, max_staged_bytes: usize, spill_dir: Option<PathBuf>, enclave: Option<Arc<dyn Enclave>>) -> Result<Self> {
        let workers = match (&enclave, workers) {
            (Some(e), 0) => e.workers(),
            (_, 0) => std::thread::available_parallelism().map_or(1, |n| n.get()),
            (_, w) => w,
        };
        if let Some(e) = &enclave {
            if e.workers() != workers {
                return Err(invalid("workers", format!("must equal the enclave's thread count {}, got {workers}", e.workers())));
            }
        }
        if workers > 1024 {
            return Err(invalid("workers", format!("must be at most 1024, got {workers}")));
        }
        if let Some(dir) = &spill_dir {
            if !dir.is_dir() {
                return Err(invalid("spill_dir", format!("{} is not a directory", dir.display())));
            }
        }
        let shared = Arc::new(Shared {
            snapshots: (0..workers).map(|_| Mutex::new(TrackerStats::default())).collect(),
            aggregated: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            ..Shared::default()
        });
        let unique = crate::routing::mix64(std::process::id() as u64 ^ (std::ptr::from_ref(shared.as_ref()) as u64));
        let cap = (max_staged_bytes / workers).max(1);
        let mut plane = DataPlane {
            senders: Vec::with_capacity(workers),
            handles: Vec::with_capacity(workers),
            wall: RwLock::new(HashMap::new()),
            enclave,
            shared,
            pending: Mutex::new(HashMap::new()),
        };
        for id in 0..workers {
            let (tx, rx) = bounded(QUEUE_DEPTH);
            let tracker = Tracker::new(cap, spill_dir.clone(), format!("agg-{unique:016x}-w{id}"));
            let (enclave, shared) = (plane.enclave.clone(), plane.shared.clone());
            let handle = std::thread::Builder::new()
                .name(format!("confide-agg-{id}"))
                .spawn(move || worker_loop(id, rx, tracker, enclave, shared))
                .map_err(|e| Error::Io { path: "worker thread".into(), reason: e.to_string() })?;
            plane.senders.push(tx);
            plane.handles.push(handle);
        }
        Ok(plane)
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.senders.len()
    }

    /// The enclave, if any.
    pub fn enclave(&self) -> Option<&Arc<dyn Enclave>> {
        self.enclave.as_ref()
    }

    /// A whole-update robust tee round's sealed estimates, from the blocks its slices completed as
    /// ([`Enclave::finish_robust`]).
    ///
    /// # Errors
    /// `InvalidParameter` without an enclave; the enclave's errors.
    pub fn finish_robust(&self, round_id: u64, held: &[(u32, Vec<u8>)]) -> Result<Vec<(u32, Vec<u8>)>> {
        self.enclave.as_ref().ok_or_else(|| invalid("enclave", "a tee round needs an enclave"))?.finish_robust(round_id, held)
    }

    fn entry(&self, round_id: u64) -> Result<Arc<Entry>> {
        self.wall.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(&round_id).cloned().ok_or(Error::UnknownRound { round_id })
    }

    fn spec(&self, round_id: u64) -> Result<Arc<RoundSpec>> {
        Ok(self.entry(round_id)?.spec.clone())
    }

    fn send(&self, worker: usize, job: Job) -> Result<()> {
        self.senders.get(worker).ok_or(Error::Stopped { worker })?.send(job).map_err(|_| Error::Stopped { worker })
    }

    /// Adds a round to the message wall (and to the enclave's, for tee kinds).
    ///
    /// # Errors
    /// `InvalidParameter` (invalid spec, round already open, tee without enclave).
    pub fn open_round(&self, spec: RoundSpec) -> Result<()> {
        self.open_round_share(spec, None)
    }

    /// [`DataPlane::open_round`] for one share of a round spread over a cluster:
    /// `share` = (share number, cluster nodes, indices the share owns); slices of
    /// other indices are refused by [`DataPlane::push_batch`].
    ///
    /// # Errors
    /// As `open_round`; `InvalidParameter` for an owned index out of range.
    pub fn open_round_share(&self, spec: RoundSpec, share: Option<(u32, u32, &[u32])>) -> Result<()> {
        spec.validate()?;
        let (share, cluster_nodes, owned) = match share {
            None => (0, 0, None),
            Some((share, nodes, indices)) => {
                let mut mask = vec![false; spec.num_slices as usize];
                for &i in indices {
                    *mask
                        .get_mut(i as usize)
                        .ok_or_else(|| invalid("owned", format!("index {i} is out of range (num_slices {})", spec.num_slices)))? = true;
                }
                (share, nodes, Some(mask))
            }
        };
        let contributed = (0..spec.participants).map(|_| AtomicU32::new(0)).collect();
        let spec = Arc::new(spec);
        let mut wall = self.wall.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if wall.contains_key(&spec.round_id) {
            return Err(invalid("round_id", format!("round {} is already open", spec.round_id)));
        }
        if spec.kind.is_tee() {
            self.enclave
                .as_ref()
                .ok_or_else(|| invalid("enclave", format!("kind {} needs a DataPlane with an enclave", spec.kind.name())))?
                .open_round(spec.clone())?;
        }
        wall.insert(spec.round_id, Arc::new(Entry { spec, owned, share, cluster_nodes, contributed }));
        Ok(())
    }

    /// Frees every entry of a round and removes it from the wall.
    ///
    /// # Errors
    /// `Stopped` if a worker is gone.
    pub fn close_round(&self, round_id: u64) -> Result<()> {
        let spec = self.wall.write().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&round_id).map(|e| e.spec.clone());
        lock(&self.pending).remove(&round_id);
        if let (Some(spec), Some(enclave)) = (&spec, &self.enclave) {
            if spec.kind.is_tee() {
                enclave.close_round(round_id);
            }
        }
        let (tx, rx) = unbounded();
        for w in 0..self.workers() {
            self.send(w, Job::Close { round_id, reply: tx.clone() })?;
        }
        for w in 0..self.workers() {
            rx.recv().map_err(|_| Error::Stopped { worker: w })?;
        }
        Ok(())
    }

    /// Folds a batch of one participant's slices: `slices` = (index, offset, length)
    /// into `batch`. Blocks until every slice was processed.
    ///
    /// # Errors
    /// The first error in batch order (naming the slice). Completions of other
    /// slices of a failed batch are kept and returned by the next successful
    /// `push` of the round or by [`DataPlane::take_completed`].
    pub fn push(&self, round_id: u64, participant: u32, batch: Arc<[u8]>, slices: &[(u32, usize, usize)]) -> Result<PushResult> {
        self.push_shared(round_id, participant, Arc::new(batch), slices)
    }

    /// [`DataPlane::push`] over any shared buffer (the received message itself: no copy).
    pub fn push_shared(&self, round_id: u64, participant: u32, batch: SharedBytes, slices: &[(u32, usize, usize)]) -> Result<PushResult> {
        let entry = self.entry(round_id)?;
        let spec = entry.spec.clone();
        let bytes: &[u8] = (*batch).as_ref();
        for &(index, offset, len) in slices {
            spec.check_participant(index, participant)?;
            if offset.checked_add(len).is_none_or(|end| end > bytes.len()) {
                return Err(slice_error(index, format!("bytes {offset}..{offset}+{len} lie outside the batch of {} bytes", bytes.len())));
            }
            if let Some(expected) = spec.payload_bytes(index)? {
                if len != expected {
                    let n = spec.n_valid(index)?;
                    return Err(slice_error(index, format!("payload holds {len} bytes; {}", spec.kind.size_rule(n, expected))));
                }
            }
        }
        let (tx, rx) = unbounded();
        for (position, &(index, offset, len)) in slices.iter().enumerate() {
            let worker = worker_for(spec.session_hash, index, self.workers());
            self.send(
                worker,
                Job::Ingest { spec: spec.clone(), participant, index, batch: batch.clone(), offset, len, position, reply: tx.clone() },
            )?;
        }
        drop(tx);
        let mut result = PushResult::default();
        let mut first_error: Option<(usize, Error)> = None;
        for _ in 0..slices.len() {
            let (position, index, outcome) = rx.recv().map_err(|_| Error::Stopped { worker: 0 })?;
            match outcome {
                Ok(Outcome::Accepted) => result.accepted += 1,
                Ok(Outcome::Duplicate) => result.duplicates += 1,
                Ok(Outcome::Late) => result.late += 1,
                Ok(Outcome::Completed(bytes)) => {
                    result.accepted += 1;
                    result.completed.push((index, bytes));
                }
                Err(e) => {
                    if first_error.as_ref().is_none_or(|(p, _)| position < *p) {
                        first_error = Some((position, e));
                    }
                }
            }
        }
        result.completed.sort_by_key(|(i, _)| *i);
        if let Some(count) = entry.contributed.get(participant as usize) {
            count.fetch_add(result.accepted, Ordering::Relaxed);
        }
        let mut pending = lock(&self.pending);
        if let Some((_, error)) = first_error {
            if !result.completed.is_empty() {
                pending.entry(round_id).or_default().extend(result.completed);
            }
            return Err(error);
        }
        if let Some(mut kept) = pending.remove(&round_id) {
            kept.append(&mut result.completed);
            result.completed = kept;
        }
        Ok(result)
    }

    /// Checks a received batch against the round (index range, values per slice,
    /// the node's share) and folds it, reading the payloads in place in `message`.
    ///
    /// # Errors
    /// `Batch` naming the first bad slice (nothing of the batch is folded then),
    /// or as [`DataPlane::push_shared`].
    pub fn push_batch(&self, round_id: u64, participant: u32, message: SharedBytes, view: &BatchView) -> Result<PushResult> {
        let entry = self.entry(round_id)?;
        let spec = &entry.spec;
        let mut slices = Vec::with_capacity(view.indices.len());
        let mut offset = view.payload_start;
        for ((&index, &n_valid), &length) in view.indices.iter().zip(&view.n_valid).zip(&view.lengths) {
            if index >= spec.num_slices {
                return Err(Error::Batch(format!("slice.index {index} is out of range (num_slices {})", spec.num_slices)));
            }
            let wanted = spec.n_valid(index)?;
            if n_valid as usize != wanted {
                return Err(Error::Batch(format!("slice.n_valid of slice {index} is {n_valid}; it must be {wanted}")));
            }
            if entry.owned.as_ref().is_some_and(|mask| !mask[index as usize]) {
                return Err(Error::Batch(format!(
                    "slice {index} belongs to another share than {} of this {}-node cluster",
                    entry.share, entry.cluster_nodes
                )));
            }
            slices.push((index, offset, length as usize));
            offset += length as usize;
        }
        drop(entry);
        self.push_shared(round_id, participant, message, &slices)
    }

    /// Slices folded in per participant position (duplicates and late copies not counted).
    ///
    /// # Errors
    /// `UnknownRound`.
    pub fn contributions(&self, round_id: u64) -> Result<Vec<u32>> {
        Ok(self.entry(round_id)?.contributed.iter().map(|c| c.load(Ordering::Relaxed)).collect())
    }

    /// Completions kept from failed batches of a round.
    pub fn take_completed(&self, round_id: u64) -> Vec<(u32, Vec<u8>)> {
        lock(&self.pending).remove(&round_id).unwrap_or_default()
    }

    fn gather<T>(&self, make: impl Fn(Sender<Result<T>>) -> Job) -> Result<Vec<T>> {
        let (tx, rx) = unbounded();
        for w in 0..self.workers() {
            self.send(w, make(tx.clone()))?;
        }
        drop(tx);
        let mut out = Vec::with_capacity(self.workers());
        let mut first_error = None;
        for w in 0..self.workers() {
            match rx.recv().map_err(|_| Error::Stopped { worker: w })? {
                Ok(v) => out.push(v),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(out), Err)
    }

    /// Serializes and frees every incomplete entry of the round: one blob for
    /// all workers (tee rounds: the enclave's sealed checkpoint).
    ///
    /// # Errors
    /// `UnknownRound`, `Io`, `Stopped`.
    pub fn checkpoint_round(&self, round_id: u64) -> Result<Vec<u8>> {
        let spec = self.spec(round_id)?;
        if spec.kind.is_tee() {
            return self.enclave.as_ref().ok_or_else(|| invalid("enclave", "a tee round needs an enclave"))?.checkpoint_round(round_id);
        }
        let mut all = RoundCheckpoint::empty(&spec);
        for part in self.gather(|reply| Job::Checkpoint { spec: spec.clone(), reply })? {
            all.merge(part);
        }
        Ok(all.encode())
    }

    /// Rebuilds the entries of a checkpoint, routing each index to its worker
    /// (the worker count may differ from the one that wrote it).
    ///
    /// # Errors
    /// `UnknownRound`, `Malformed` naming the field.
    pub fn restore_round(&self, round_id: u64, blob: &[u8]) -> Result<()> {
        let spec = self.spec(round_id)?;
        if spec.kind.is_tee() {
            return self.enclave.as_ref().ok_or_else(|| invalid("enclave", "a tee round needs an enclave"))?.restore_round(round_id, blob);
        }
        let all = RoundCheckpoint::decode(blob)?;
        all.check_spec(&spec)?;
        let parts = all.split(spec.session_hash, self.workers());
        let (tx, rx) = unbounded();
        for (w, part) in parts.into_iter().enumerate() {
            self.send(w, Job::Restore { spec: spec.clone(), part, reply: tx.clone() })?;
        }
        drop(tx);
        let mut first_error = None;
        for w in 0..self.workers() {
            if let Err(e) = rx.recv().map_err(|_| Error::Stopped { worker: w })? {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// (index, missing participants) of every incomplete slice of the round.
    ///
    /// # Errors
    /// `UnknownRound`, `Io`, `Stopped`.
    pub fn missing(&self, round_id: u64) -> Result<Vec<(u32, Vec<u32>)>> {
        let spec = self.spec(round_id)?;
        if spec.kind.is_tee() {
            return self.enclave.as_ref().ok_or_else(|| invalid("enclave", "a tee round needs an enclave"))?.missing(round_id);
        }
        let mut out: Vec<(u32, Vec<u32>)> =
            self.gather(|reply| Job::Missing { spec: spec.clone(), reply })?.into_iter().flatten().collect();
        out.sort_by_key(|(i, _)| *i);
        Ok(out)
    }

    /// Counters of the node (workers and enclave together).
    pub fn stats(&self) -> Stats {
        let mut sum = TrackerStats::default();
        for s in &self.shared.snapshots {
            sum.add(&lock(s));
        }
        let mut peak = self.shared.peak.load(Ordering::Relaxed);
        if let Some(e) = &self.enclave {
            let es = e.stats();
            peak += es.peak_staged_bytes;
            sum.add(&es);
        }
        let per_worker_aggregated: Vec<u64> = self.shared.aggregated.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        sum.peak_staged_bytes = peak.max(sum.staged_bytes);
        sum.aggregated = per_worker_aggregated.iter().sum();
        Stats { workers: self.workers(), simd_level: kernels::simd_level(), tracker: sum, per_worker_aggregated }
    }

    /// Sets the peak of staged bytes to the current value.
    ///
    /// # Errors
    /// `Stopped` if a worker is gone.
    pub fn reset_peak(&self) -> Result<()> {
        let (tx, rx) = unbounded();
        for w in 0..self.workers() {
            self.send(w, Job::ResetPeak { reply: tx.clone() })?;
        }
        for w in 0..self.workers() {
            rx.recv().map_err(|_| Error::Stopped { worker: w })?;
        }
        if let Some(e) = &self.enclave {
            e.reset_peak();
        }
        self.shared.peak.store(self.shared.staged.load(Ordering::Relaxed), Ordering::Relaxed);
        Ok(())
    }
}
