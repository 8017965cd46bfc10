//! `confide._native.DataPlane` and `SimulatedEnclave`: the aggregation data plane
//! of `confide-agg`. Batches travel as bytes (indices and lengths as little-endian
//! uint32 arrays, payloads concatenated); every push and benchmark releases the GIL.

use crate::errors::{invalid, to_py};
use crate::PyEncryptionKey;
use confide_agg::{DataPlane, Enclave, Kind, RobustRule, RoundSpec, SimulatedEnclave, TeeRound};
use numpy::{PyReadonlyArray1, PyReadwriteArray1};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyDict};
use std::sync::Arc;

/// Adds the data-plane classes and functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDataPlane>()?;
    m.add_class::<PySimulatedEnclave>()?;
    m.add_function(wrap_pyfunction!(agg_accumulate_f32, m)?)?;
    m.add_function(wrap_pyfunction!(agg_bench_primitive, m)?)?;
    m.add_function(wrap_pyfunction!(agg_simd_level, m)?)?;
    m.add_function(wrap_pyfunction!(agg_mix64, m)?)?;
    m.add_function(wrap_pyfunction!(agg_parse_batch, m)?)?;
    crate::aggnet::register(m)?;
    Ok(())
}

fn u32s(field: &'static str, bytes: &[u8]) -> PyResult<Vec<u32>> {
    let (words, rest) = bytes.as_chunks::<4>();
    if !rest.is_empty() {
        return Err(invalid(field, format!("length {} is not a multiple of 4 bytes (little-endian uint32 array)", bytes.len())));
    }
    Ok(words.iter().map(|w| u32::from_le_bytes(*w)).collect())
}

/// The simulated enclave (no SGX: ordinary code in this process; see `report()`).
#[pyclass(name = "SimulatedEnclave", module = "confide._native", frozen)]
struct PySimulatedEnclave {
    inner: Arc<SimulatedEnclave>,
}

#[pymethods]
impl PySimulatedEnclave {
    #[new]
    #[pyo3(signature = (workers = 0))]
    fn new(workers: usize) -> PyResult<Self> {
        Ok(PySimulatedEnclave { inner: Arc::new(SimulatedEnclave::new(workers).map_err(to_py)?) })
    }
    #[getter]
    fn workers(&self) -> usize {
        self.inner.workers()
    }
    fn public_key<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.public_key())
    }
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = self.inner.report();
        let d = PyDict::new(py);
        d.set_item("mode", r.mode)?;
        d.set_item("hardware_isolation", r.hardware_isolation)?;
        d.set_item("measurement", r.measurement)?;
        d.set_item("note", r.note)?;
        Ok(d)
    }
    fn provision(&self, session: &str, wrapped_key: &[u8]) -> PyResult<()> {
        self.inner.provision(session, wrapped_key).map_err(to_py)
    }
}

/// One aggregator node: worker threads with bounded queues and state trackers.
#[pyclass(name = "DataPlane", module = "confide._native", frozen)]
pub(crate) struct PyDataPlane {
    pub(crate) inner: Arc<DataPlane>,
}

#[pymethods]
impl PyDataPlane {
    #[new]
    #[pyo3(signature = (workers = 0, max_staged_bytes = 256 << 20, spill_dir = None, enclave = None))]
    fn new(workers: usize, max_staged_bytes: usize, spill_dir: Option<String>, enclave: Option<&PySimulatedEnclave>) -> PyResult<Self> {
        let enclave = enclave.map(|e| e.inner.clone() as Arc<dyn Enclave>);
        let plane = DataPlane::new(workers, max_staged_bytes, spill_dir.map(Into::into), enclave).map_err(to_py)?;
        Ok(PyDataPlane { inner: Arc::new(plane) })
    }

    #[pyo3(signature = (round_id, session, kind, participants, num_slices, slice_length, vector_length,
                        weights = None, paillier_key = None, tee_round = 0, tee_attempt = 0, share = None, robust = None))]
    #[allow(clippy::too_many_arguments)]
    fn open_round(
        &self,
        round_id: u64,
        session: &str,
        kind: &str,
        participants: u32,
        num_slices: u32,
        slice_length: u32,
        vector_length: u64,
        weights: Option<Vec<f32>>,
        paillier_key: Option<&PyEncryptionKey>,
        tee_round: u32,
        tee_attempt: u32,
        share: Option<(u32, u32, Vec<u32>)>,
        robust: Option<(String, u32, u32, u32, f64)>,
    ) -> PyResult<()> {
        let kind = Kind::parse(kind).map_err(to_py)?;
        let rule = match (&robust, kind == Kind::TeeF32Stack) {
            (Some((rule, cut, byzantine, selected, bound)), true) => {
                Some(RobustRule::parse(rule, *cut, *byzantine, *selected, *bound, participants).map_err(to_py)?)
            }
            (None, false) => None,
            // the plain stacked kind's rule runs in Python (aggregator/robust.py), not here
            (Some(_), false) if kind == Kind::F32Stack => None,
            _ => return Err(invalid("robust", "a rule is required for kind tee_f32_stack and only for the stacked kinds")),
        };
        let spec = RoundSpec {
            round_id,
            session_hash: confide_agg::session_hash(session),
            kind,
            participants,
            num_slices,
            slice_length,
            vector_length,
            weights: weights.unwrap_or_else(|| vec![1.0; participants as usize]),
            paillier: paillier_key.map(|k| Arc::new(k.key.clone())),
            tee: kind.is_tee().then(|| TeeRound { session: session.to_string(), round: tee_round, attempt: tee_attempt, rule }),
        };
        let share = share.as_ref().map(|(s, n, owned)| (*s, *n, owned.as_slice()));
        self.inner.open_round_share(spec, share).map_err(to_py)
    }

    /// A whole-update robust tee round's sealed estimates from the blocks its slices completed as:
    /// [(index, sealed estimate)].
    fn finish_robust<'py>(&self, py: Python<'py>, round_id: u64, held: Vec<(u32, Vec<u8>)>) -> PyResult<Vec<(u32, Bound<'py, PyBytes>)>> {
        let inner = self.inner.clone();
        let out = py.detach(move || inner.finish_robust(round_id, &held)).map_err(to_py)?;
        Ok(out.into_iter().map(|(i, b)| (i, PyBytes::new(py, &b))).collect())
    }

    /// Slices folded in per participant position.
    fn contributions(&self, round_id: u64) -> PyResult<Vec<u32>> {
        self.inner.contributions(round_id).map_err(to_py)
    }

    /// Checks and folds the slices of a serialized `PushMessage` (a batch or one slice) in
    /// place: the payload is not copied. Returns (accepted, duplicates, late, completed).
    fn push_message<'py>(&self, py: Python<'py>, round_id: u64, participant: u32, message: PyBackedBytes) -> PyResult<PushReply<'py>> {
        let view = match confide_agg::parse_push(&message).map_err(to_py)? {
            confide_agg::PushBody::Slices(view) => view,
            _ => return Err(invalid("message", "carries no slices".to_string())),
        };
        let shared: confide_agg::node::SharedBytes = Arc::new(message);
        let inner = self.inner.clone();
        let result = py.detach(move || inner.push_batch(round_id, participant, shared, &view)).map_err(to_py)?;
        Ok(push_reply(py, result))
    }

    /// Checks and folds a batch given as arrays (little-endian uint32 indices, n_valid and
    /// lengths; payloads back to back). Returns (accepted, duplicates, late, [(index, bytes)]
    /// of completed slices).
    #[allow(clippy::too_many_arguments)]
    fn push<'py>(
        &self,
        py: Python<'py>,
        round_id: u64,
        participant: u32,
        indices: &[u8],
        n_valid: &[u8],
        lengths: &[u8],
        payload: &[u8],
    ) -> PyResult<PushReply<'py>> {
        let indices = u32s("indices", indices)?;
        let n_valid = u32s("n_valid", n_valid)?;
        let lengths = u32s("lengths", lengths)?;
        if indices.len() != lengths.len() || indices.len() != n_valid.len() {
            return Err(invalid(
                "lengths",
                format!("indices, n_valid and lengths differ in length ({}, {}, {})", indices.len(), n_valid.len(), lengths.len()),
            ));
        }
        let total: u64 = lengths.iter().map(|&l| u64::from(l)).sum();
        if total != payload.len() as u64 {
            return Err(invalid("payload", format!("holds {} bytes; the lengths add up to {total}", payload.len())));
        }
        let view = confide_agg::BatchView { indices, n_valid, lengths, payload_start: 0, payload_len: payload.len() };
        let batch: Arc<[u8]> = Arc::from(payload);
        let shared: confide_agg::node::SharedBytes = Arc::new(batch);
        let inner = self.inner.clone();
        let result = py.detach(move || inner.push_batch(round_id, participant, shared, &view)).map_err(to_py)?;
        Ok(push_reply(py, result))
    }

    fn take_completed<'py>(&self, py: Python<'py>, round_id: u64) -> Vec<(u32, Bound<'py, PyBytes>)> {
        self.inner.take_completed(round_id).into_iter().map(|(i, b)| (i, PyBytes::new(py, &b))).collect()
    }

    fn close_round(&self, py: Python<'_>, round_id: u64) -> PyResult<()> {
        let inner = self.inner.clone();
        py.detach(move || inner.close_round(round_id)).map_err(to_py)
    }

    fn checkpoint_round<'py>(&self, py: Python<'py>, round_id: u64) -> PyResult<Bound<'py, PyBytes>> {
        let inner = self.inner.clone();
        let blob = py.detach(move || inner.checkpoint_round(round_id)).map_err(to_py)?;
        Ok(PyBytes::new(py, &blob))
    }

    fn restore_round(&self, py: Python<'_>, round_id: u64, blob: &[u8]) -> PyResult<()> {
        let inner = self.inner.clone();
        py.detach(move || inner.restore_round(round_id, blob)).map_err(to_py)
    }

    fn missing(&self, py: Python<'_>, round_id: u64) -> PyResult<Vec<(u32, Vec<u32>)>> {
        let inner = self.inner.clone();
        py.detach(move || inner.missing(round_id)).map_err(to_py)
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("workers", s.workers)?;
        d.set_item("simd_level", s.simd_level)?;
        d.set_item("staged_bytes", s.tracker.staged_bytes)?;
        d.set_item("peak_staged_bytes", s.tracker.peak_staged_bytes)?;
        d.set_item("open_entries", s.tracker.open_entries)?;
        d.set_item("spilled_entries", s.tracker.spilled_entries)?;
        d.set_item("aggregated", s.tracker.aggregated)?;
        d.set_item("completed", s.tracker.completed)?;
        d.set_item("spills", s.tracker.spills)?;
        d.set_item("reloads", s.tracker.reloads)?;
        d.set_item("duplicates", s.tracker.duplicates)?;
        d.set_item("late", s.tracker.late)?;
        d.set_item("per_worker_aggregated", s.per_worker_aggregated)?;
        Ok(d)
    }

    fn reset_peak(&self, py: Python<'_>) -> PyResult<()> {
        let inner = self.inner.clone();
        py.detach(move || inner.reset_peak()).map_err(to_py)
    }
}

/// acc += w * x in place (float32, fused multiply-add, SIMD).
#[pyfunction]
fn agg_accumulate_f32(mut acc: PyReadwriteArray1<'_, f32>, x: PyReadonlyArray1<'_, f32>, w: f32) -> PyResult<()> {
    let x = x.as_slice().map_err(|_| invalid("x", "array must be contiguous"))?;
    let acc = acc.as_slice_mut().map_err(|_| invalid("acc", "array must be contiguous and writable"))?;
    confide_agg::accumulate_f32(acc, x, w).map_err(to_py)
}

/// Seconds for `iterations` folds of the `slices` (k × slice_len values) into one buffer.
#[pyfunction]
fn agg_bench_primitive(
    py: Python<'_>,
    slices: PyReadonlyArray1<'_, f32>,
    slice_len: usize,
    weights: PyReadonlyArray1<'_, f32>,
    iterations: usize,
) -> PyResult<f64> {
    let slices = slices.as_slice().map_err(|_| invalid("slices", "array must be contiguous"))?;
    let weights = weights.as_slice().map_err(|_| invalid("weights", "array must be contiguous"))?;
    py.detach(|| confide_agg::bench_primitive(slices, slice_len, weights, iterations)).map_err(to_py)
}

/// (accepted, duplicates, late, [(index, bytes)] of completed slices).
type PushReply<'py> = (u32, u32, u32, Vec<(u32, Bound<'py, PyBytes>)>);

fn push_reply(py: Python<'_>, result: confide_agg::PushResult) -> PushReply<'_> {
    let completed = result.completed.into_iter().map(|(i, b)| (i, PyBytes::new(py, &b))).collect();
    (result.accepted, result.duplicates, result.late, completed)
}

fn le_words(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// The batch of a serialized `PushMessage` read in place: (indices, n_valid, lengths) as
/// little-endian u32 bytes and the payload size, or None when the body is not a batch.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn agg_parse_batch<'py>(
    py: Python<'py>,
    message: &[u8],
) -> PyResult<Option<(Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>, usize)>> {
    let Some(view) = confide_agg::parse_batch(message).map_err(to_py)? else { return Ok(None) };
    Ok(Some((
        PyBytes::new(py, &le_words(&view.indices)),
        PyBytes::new(py, &le_words(&view.n_valid)),
        PyBytes::new(py, &le_words(&view.lengths)),
        view.payload_len,
    )))
}

/// SIMD level of the aggregation primitive: "avx512", "avx2" or "scalar".
#[pyfunction]
fn agg_simd_level() -> &'static str {
    confide_agg::simd_level()
}

/// The splitmix64 finalizer used for routing.
#[pyfunction]
fn agg_mix64(x: u64) -> u64 {
    confide_agg::mix64(x)
}
