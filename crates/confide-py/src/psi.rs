//! `confide._native.PsiKey`: the ECDH-PSI primitives of `confide-psi` for
//! `confide.vertical.psi`. Points travel as flat bytes (N × 32), tags as N × 16,
//! ids as one buffer plus N + 1 uint64 offsets. Every bulk call releases the GIL and
//! runs on a rayon pool of `threads` threads (0 = one per core).

use crate::errors::{invalid, NativeError};
use confide_psi::{Ids, Point, PsiKey, Tag, POINT_BYTES, TAG_BYTES};
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Adds the PSI class to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPsiKey>()
}

fn run<R: Send>(py: Python<'_>, threads: usize, work: impl FnOnce() -> confide_psi::Result<R> + Send) -> PyResult<R> {
    Ok(py.detach(|| confide_psi::with_threads(threads, work).and_then(|r| r)).map_err(NativeError::from)?)
}

fn points_of<'a>(field: &'static str, data: &'a [u8]) -> PyResult<&'a [Point]> {
    let (points, rest) = data.as_chunks::<POINT_BYTES>();
    if !rest.is_empty() {
        return Err(invalid(field, format!("length {} is not a multiple of {POINT_BYTES} bytes", data.len())));
    }
    Ok(points)
}

fn tags_of<'a>(field: &'static str, data: &'a [u8]) -> PyResult<&'a [Tag]> {
    let (tags, rest) = data.as_chunks::<TAG_BYTES>();
    if !rest.is_empty() {
        return Err(invalid(field, format!("length {} is not a multiple of {TAG_BYTES} bytes", data.len())));
    }
    Ok(tags)
}

fn ids_of<'a>(ids: &'a [u8], offsets: &'a PyReadonlyArray1<'_, u64>) -> PyResult<Ids<'a>> {
    let offsets = offsets.as_slice().map_err(|_| invalid("offsets", "array must be contiguous"))?;
    Ok(Ids::new(ids, offsets).map_err(NativeError::from)?)
}

/// Two index arrays (i, j) of matched tags.
type IndexPairs<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>);

fn points_bytes<'py>(py: Python<'py>, points: &[Point]) -> Bound<'py, PyBytes> {
    PyBytes::new(py, points.as_flattened())
}

/// A party's secret ristretto255 scalar for ECDH-PSI. Not picklable, never printed.
#[pyclass(name = "PsiKey", module = "confide._native", frozen)]
pub struct PyPsiKey {
    key: PsiKey,
}

#[pymethods]
impl PyPsiKey {
    /// A fresh key from the OS CSPRNG.
    #[staticmethod]
    fn generate() -> PyResult<Self> {
        Ok(PyPsiKey { key: PsiKey::generate().map_err(NativeError::from)? })
    }

    /// The key of a canonical little-endian nonzero scalar below the group order (32 bytes): a
    /// party's own per-intersection scalar, handed to its own compute workers.
    #[staticmethod]
    fn from_bytes(scalar: &[u8]) -> PyResult<Self> {
        let bytes: &[u8; 32] = scalar.try_into().map_err(|_| invalid("scalar", format!("must be 32 bytes, got {}", scalar.len())))?;
        Ok(PyPsiKey { key: PsiKey::from_bytes(bytes).map_err(NativeError::from)? })
    }

    /// k·H(id) for every id (`ids[offsets[i]:offsets[i+1]]`), N × 32 bytes.
    #[pyo3(signature = (dst, ids, offsets, threads = 0))]
    fn hash_and_blind<'py>(
        &self,
        py: Python<'py>,
        dst: &[u8],
        ids: &[u8],
        offsets: PyReadonlyArray1<'_, u64>,
        threads: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let ids = ids_of(ids, &offsets)?;
        let points = run(py, threads, || self.key.hash_and_blind(dst, &ids))?;
        Ok(points_bytes(py, &points))
    }

    /// k·P for every 32-byte point P; an invalid encoding is an error naming its index.
    #[pyo3(signature = (points, threads = 0))]
    fn blind<'py>(&self, py: Python<'py>, points: &[u8], threads: usize) -> PyResult<Bound<'py, PyBytes>> {
        let points = points_of("points", points)?;
        let blinded = run(py, threads, || self.key.blind(points))?;
        Ok(points_bytes(py, &blinded))
    }

    /// H(id) for every id, unblinded (N × 32 bytes): for tests and known-answer checks.
    #[staticmethod]
    #[pyo3(signature = (dst, ids, offsets, threads = 0))]
    fn hash_to_group<'py>(
        py: Python<'py>,
        dst: &[u8],
        ids: &[u8],
        offsets: PyReadonlyArray1<'_, u64>,
        threads: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let ids = ids_of(ids, &offsets)?;
        let points = run(py, threads, || confide_psi::hash_to_group(dst, &ids))?;
        Ok(points_bytes(py, &points))
    }

    /// The 16-byte comparison tag of every 32-byte point (N × 16 bytes).
    #[staticmethod]
    #[pyo3(signature = (points, threads = 0))]
    fn tags<'py>(py: Python<'py>, points: &[u8], threads: usize) -> PyResult<Bound<'py, PyBytes>> {
        let points = points_of("points", points)?;
        let tags = run(py, threads, || Ok(confide_psi::tags(points)))?;
        Ok(PyBytes::new(py, tags.as_flattened()))
    }

    /// Index pairs (i, j) with left[i] == right[j], in increasing i, as two int64 arrays.
    #[staticmethod]
    #[pyo3(signature = (left, right, threads = 0))]
    fn match_tags<'py>(py: Python<'py>, left: &[u8], right: &[u8], threads: usize) -> PyResult<IndexPairs<'py>> {
        let (left, right) = (tags_of("left", left)?, tags_of("right", right)?);
        let pairs = run(py, threads, || confide_psi::match_tags(left, right))?;
        // Indices come from slices, so they fit i64.
        let (i, j): (Vec<i64>, Vec<i64>) = pairs.into_iter().map(|(i, j)| (i as i64, j as i64)).unzip();
        Ok((PyArray1::from_vec(py, i), PyArray1::from_vec(py, j)))
    }

    /// Which group-arithmetic engine runs here: `"ifma-8-lane"` (AVX-512 IFMA) or `"dalek"`.
    /// Both give the same bytes.
    #[staticmethod]
    fn engine() -> &'static str {
        if confide_psi::lane_engine() {
            "ifma-8-lane"
        } else {
            "dalek"
        }
    }

    fn __repr__(&self) -> &'static str {
        "PsiKey(<secret>)"
    }
}
