//! `confide._native`: the only PyO3 crate. Every method (a) takes numpy buffers
//! or bytes, never Python lists in hot paths, (b) runs the core call with the
//! GIL released (`py.detach`) on a rayon pool of the requested size, (c) maps
//! errors once (errors.rs). The public Python API is `confide.crypto`.

mod agg;
mod aggnet;
mod errors;
mod lattice;
mod psi;

use confide_codec::params::{from_params, to_params, Codec};
use confide_codec::{BatchCryptCodec, FlBoosterCodec, Quantizer};
use confide_paillier::{
    with_threads, Ciphertext, CiphertextBlock, DecryptionKey, Encoding, EncryptionKey, Integer, Randomizer, FLAG_RERANDOMIZED,
};
use errors::{invalid, NativeError, NativeResult};
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use rayon::prelude::*;
use rug::integer::Order;
use std::sync::Arc;

fn randomizer(name: &str) -> PyResult<Randomizer> {
    match name {
        "fixed_base" => Ok(Randomizer::FixedBase),
        "classical" => Ok(Randomizer::Classical),
        other => Err(invalid("randomizer", format!("must be 'fixed_base' or 'classical', got {other:?}"))),
    }
}

fn threaded<R: Send>(threads: usize, work: impl FnOnce() -> NativeResult<R> + Send) -> NativeResult<R> {
    with_threads(threads, work)?
}

/// Metadata of a packed vector: the codec, the number of values and how many
/// party vectors were summed into it.
#[derive(Clone, PartialEq)]
struct PackInfo {
    codec: Codec,
    length: u64,
    summed: u64,
}

/// Unpacks and dequantizes decrypted plaintexts of a packed vector: (sums, overflow positions).
fn decode_packed(pack: &PackInfo, plaintexts: &[Integer]) -> NativeResult<(Vec<f64>, Vec<i64>)> {
    let layout = codec_layout(&pack.codec);
    let mut limbs = Vec::with_capacity(plaintexts.len() * layout.limbs);
    for plaintext in plaintexts {
        let mut digits = plaintext.to_digits::<u64>(Order::Lsf);
        if digits.len() > layout.limbs {
            return Err(NativeError::from(confide_codec::Error::Malformed("a decrypted plaintext exceeds the packing width".into())));
        }
        digits.resize(layout.limbs, 0);
        limbs.extend_from_slice(&digits);
    }
    let length = pack.length as usize;
    Ok(match &pack.codec {
        Codec::BatchCrypt(c) => {
            let decoded = c.decode(&limbs, length, pack.summed)?;
            (decoded.values, decoded.overflow.into_iter().map(|i| i as i64).collect())
        }
        Codec::FlBooster(c) => (c.decode(&limbs, length, pack.summed)?, Vec::new()),
    })
}

enum Encryptor<'a> {
    Public(&'a EncryptionKey),
    Holder(&'a DecryptionKey),
}

impl Encryptor<'_> {
    fn public(&self) -> &EncryptionKey {
        match self {
            Encryptor::Public(key) => key,
            Encryptor::Holder(key) => key.encryption_key(),
        }
    }
    fn encrypt_many(&self, plaintexts: &[Integer], randomizer: Randomizer) -> confide_paillier::Result<Vec<Ciphertext>> {
        match self {
            Encryptor::Public(key) => key.encrypt_many(plaintexts, randomizer),
            Encryptor::Holder(key) => key.encrypt_many(plaintexts, randomizer),
        }
    }

    fn encrypt_i64(
        &self,
        py: Python<'_>,
        values: PyReadonlyArray1<'_, i64>,
        randomizer_name: &str,
        threads: usize,
    ) -> PyResult<PyCiphertextVector> {
        let randomizer = randomizer(randomizer_name)?;
        let values = values.as_slice().map_err(|_| invalid("values", "array must be contiguous"))?;
        let public = self.public().clone();
        let ciphertexts = py.detach(|| {
            threaded(threads, || {
                let plaintexts =
                    values.iter().map(|&v| public.encode_signed(&Integer::from(v))).collect::<confide_paillier::Result<Vec<_>>>()?;
                Ok(self.encrypt_many(&plaintexts, randomizer)?)
            })
        })?;
        Ok(PyCiphertextVector::new(public, ciphertexts, None))
    }

    fn encrypt_raw(&self, py: Python<'_>, plaintexts: Vec<Vec<u8>>, randomizer_name: &str, threads: usize) -> PyResult<PyCiphertextVector> {
        let randomizer = randomizer(randomizer_name)?;
        let public = self.public().clone();
        let ciphertexts = py.detach(|| {
            threaded(threads, || {
                let integers: Vec<Integer> = plaintexts.iter().map(|b| Integer::from_digits(b, Order::Msf)).collect();
                Ok(self.encrypt_many(&integers, randomizer)?)
            })
        })?;
        Ok(PyCiphertextVector::new(public, ciphertexts, None))
    }

    #[allow(clippy::too_many_arguments)]
    fn encrypt_packed(
        &self,
        py: Python<'_>,
        values: &Bound<'_, PyAny>,
        kind: &str,
        bits: u32,
        max_summands: u32,
        alpha: f64,
        quantizer: &str,
        seed: Option<u64>,
        threads: usize,
        engine: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyCiphertextVector> {
        let public = self.public().clone();
        let codec = build_codec(kind, bits, max_summands, alpha, quantizer, public.bits())?;
        let encode = |slice: Slice<'_>| -> NativeResult<confide_codec::Packed> {
            Ok(match (&codec, slice) {
                (Codec::BatchCrypt(c), Slice::F32(v)) => c.encode(v, seed)?,
                (Codec::BatchCrypt(c), Slice::F64(v)) => c.encode(v, seed)?,
                (Codec::FlBooster(c), Slice::F32(v)) => c.encode(v)?,
                (Codec::FlBooster(c), Slice::F64(v)) => c.encode(v)?,
            })
        };
        let layout = codec_layout(&codec);
        let per = layout.limbs.max(1);
        let run = |slice: Slice<'_>| -> PyResult<(usize, Vec<Ciphertext>)> {
            let Some(engine) = engine else {
                return Ok(py.detach(|| {
                    threaded(threads, || {
                        let packed = encode(slice)?;
                        let plaintexts: Vec<Integer> = packed.limbs.chunks(per).map(|l| Integer::from_digits(l, Order::Lsf)).collect();
                        Ok((packed.length, self.encrypt_many(&plaintexts, Randomizer::FixedBase)?))
                    })
                })?);
            };
            // Another engine (the GPU, confide.crypto.gpu) encrypts what the codec packed:
            // engine(limbs: uint64 array, limbs_per_plaintext, holder) -> big-endian ciphertext bytes.
            let packed = py.detach(|| threaded(threads, || encode(slice)))?;
            let count = packed.limbs.len() / per;
            let holder = matches!(self, Encryptor::Holder(_));
            let out = engine.call1((PyArray1::from_vec(py, packed.limbs), per, holder))?;
            let out = out.cast_into::<PyBytes>().map_err(|_| invalid("engine", "must return bytes"))?;
            let bytes = out.as_bytes();
            let ciphertexts = py.detach(|| threaded(threads, || ciphertexts_from_engine(&public, bytes, count)))?;
            Ok((packed.length, ciphertexts))
        };
        let (length, ciphertexts) = if let Ok(array) = values.extract::<PyReadonlyArray1<'_, f32>>() {
            run(Slice::F32(array.as_slice().map_err(|_| invalid("values", "array must be contiguous"))?))?
        } else if let Ok(array) = values.extract::<PyReadonlyArray1<'_, f64>>() {
            run(Slice::F64(array.as_slice().map_err(|_| invalid("values", "array must be contiguous"))?))?
        } else {
            return Err(invalid("values", "must be a one-dimensional float32 or float64 numpy array"));
        };
        Ok(PyCiphertextVector::new(public, ciphertexts, Some(PackInfo { codec, length: length as u64, summed: 1 })))
    }
}

/// Ciphertexts an external engine returned as `count` big-endian elements of the key's
/// ciphertext width, each checked to lie in (0, n²).
fn ciphertexts_from_engine(public: &EncryptionKey, bytes: &[u8], count: usize) -> NativeResult<Vec<Ciphertext>> {
    let width = public.ciphertext_bytes();
    if bytes.len() != count * width {
        return Err(NativeError::from(confide_paillier::Error::InvalidParameter {
            field: "engine",
            reason: format!("returned {} bytes for {count} ciphertexts of {width} bytes", bytes.len()),
        }));
    }
    Ok(bytes
        .par_chunks(width)
        .map(|c| Ciphertext::new(public, Integer::from_digits(c, Order::Msf)))
        .collect::<confide_paillier::Result<Vec<_>>>()?)
}

#[derive(Clone, Copy)]
enum Slice<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
}

fn build_codec(kind: &str, bits: u32, max_summands: u32, alpha: f64, quantizer: &str, plaintext_bits: u32) -> PyResult<Codec> {
    Ok(match kind {
        "batchcrypt" => {
            let quantizer = match quantizer {
                "exact_bound" => Quantizer::ExactBound,
                "paper" => Quantizer::Paper,
                other => return Err(invalid("quantizer", format!("must be 'exact_bound' or 'paper', got {other:?}"))),
            };
            Codec::BatchCrypt(BatchCryptCodec::new(bits, max_summands, alpha, plaintext_bits, quantizer).map_err(NativeError::from)?)
        }
        "flbooster" => Codec::FlBooster(FlBoosterCodec::new(bits, max_summands, alpha, plaintext_bits).map_err(NativeError::from)?),
        other => return Err(invalid("codec", format!("must be 'batchcrypt' or 'flbooster', got {other:?}"))),
    })
}

fn codec_layout(codec: &Codec) -> confide_codec::Layout {
    match codec {
        Codec::BatchCrypt(c) => c.layout(),
        Codec::FlBooster(c) => c.layout(),
    }
}

/// Paillier public key (`confide.crypto.EncryptionKey` wraps it).
#[pyclass(name = "EncryptionKey", module = "confide._native", frozen)]
struct PyEncryptionKey {
    key: EncryptionKey,
}

#[pymethods]
impl PyEncryptionKey {
    #[getter]
    fn bits(&self) -> u32 {
        self.key.bits()
    }
    #[getter]
    fn key_id(&self) -> String {
        self.key.key_id().to_string()
    }
    #[getter]
    fn window(&self) -> u32 {
        self.key.window()
    }
    #[getter]
    fn ciphertext_bytes(&self) -> usize {
        self.key.ciphertext_bytes()
    }
    fn n_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.key.n().to_digits::<u8>(Order::Msf))
    }
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.key.to_bytes())
    }
    #[staticmethod]
    fn from_bytes(py: Python<'_>, data: &[u8]) -> PyResult<Self> {
        Ok(PyEncryptionKey { key: py.detach(|| EncryptionKey::from_bytes(data)).map_err(NativeError::from)? })
    }
    fn with_window(&self, window: u32) -> PyResult<Self> {
        Ok(PyEncryptionKey { key: self.key.with_window(window).map_err(NativeError::from)? })
    }
    fn precompute(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(py.detach(|| self.key.precompute()).map_err(NativeError::from)?)
    }
    #[pyo3(signature = (values, randomizer = "fixed_base", threads = 0))]
    fn encrypt_i64(
        &self,
        py: Python<'_>,
        values: PyReadonlyArray1<'_, i64>,
        randomizer: &str,
        threads: usize,
    ) -> PyResult<PyCiphertextVector> {
        Encryptor::Public(&self.key).encrypt_i64(py, values, randomizer, threads)
    }
    #[pyo3(signature = (plaintexts, randomizer = "fixed_base", threads = 0))]
    fn encrypt_raw(&self, py: Python<'_>, plaintexts: Vec<Vec<u8>>, randomizer: &str, threads: usize) -> PyResult<PyCiphertextVector> {
        Encryptor::Public(&self.key).encrypt_raw(py, plaintexts, randomizer, threads)
    }
    #[pyo3(signature = (values, kind, bits, max_summands, alpha, quantizer = "exact_bound", seed = None, threads = 0, engine = None))]
    #[allow(clippy::too_many_arguments)]
    fn encrypt_packed(
        &self,
        py: Python<'_>,
        values: &Bound<'_, PyAny>,
        kind: &str,
        bits: u32,
        max_summands: u32,
        alpha: f64,
        quantizer: &str,
        seed: Option<u64>,
        threads: usize,
        engine: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyCiphertextVector> {
        Encryptor::Public(&self.key).encrypt_packed(py, values, kind, bits, max_summands, alpha, quantizer, seed, threads, engine)
    }
    fn __eq__(&self, other: &Self) -> bool {
        self.key == other.key
    }
    fn __hash__(&self) -> u64 {
        let id = self.key.key_id().0;
        u64::from_be_bytes([id[0], id[1], id[2], id[3], id[4], id[5], id[6], id[7]])
    }
    fn __repr__(&self) -> String {
        format!("EncryptionKey(bits={}, key_id={})", self.key.bits(), self.key.key_id())
    }
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let constructor = py.get_type::<PyEncryptionKey>().getattr("from_bytes")?;
        let bytes = PyBytes::new(py, &slf.get().key.to_bytes());
        Ok((constructor, PyTuple::new(py, [bytes])?))
    }
}

/// Paillier private key. Not picklable; export is explicit.
#[pyclass(name = "DecryptionKey", module = "confide._native", frozen)]
struct PyDecryptionKey {
    key: DecryptionKey,
}

#[pymethods]
impl PyDecryptionKey {
    #[staticmethod]
    #[pyo3(signature = (p, q, public = None))]
    fn from_primes(py: Python<'_>, p: &[u8], q: &[u8], public: Option<&PyEncryptionKey>) -> PyResult<Self> {
        let (p, q) = (Integer::from_digits(p, Order::Msf), Integer::from_digits(q, Order::Msf));
        let public = public.map(|k| k.key.clone());
        Ok(PyDecryptionKey { key: py.detach(|| DecryptionKey::from_primes(p, q, public)).map_err(NativeError::from)? })
    }
    #[staticmethod]
    fn from_secret_bytes(py: Python<'_>, data: &[u8]) -> PyResult<Self> {
        Ok(PyDecryptionKey { key: py.detach(|| DecryptionKey::from_secret_bytes(data)).map_err(NativeError::from)? })
    }
    fn to_secret_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.key.to_secret_bytes())
    }
    fn primes_bytes<'py>(&self, py: Python<'py>) -> (Bound<'py, PyBytes>, Bound<'py, PyBytes>) {
        let (p, q) = self.key.primes();
        (PyBytes::new(py, &p.to_digits::<u8>(Order::Msf)), PyBytes::new(py, &q.to_digits::<u8>(Order::Msf)))
    }
    #[getter]
    fn encryption_key(&self) -> PyEncryptionKey {
        PyEncryptionKey { key: self.key.encryption_key().clone() }
    }
    fn precompute(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(py.detach(|| self.key.precompute()).map_err(NativeError::from)?)
    }
    #[pyo3(signature = (values, randomizer = "fixed_base", threads = 0))]
    fn encrypt_i64(
        &self,
        py: Python<'_>,
        values: PyReadonlyArray1<'_, i64>,
        randomizer: &str,
        threads: usize,
    ) -> PyResult<PyCiphertextVector> {
        Encryptor::Holder(&self.key).encrypt_i64(py, values, randomizer, threads)
    }
    #[pyo3(signature = (plaintexts, randomizer = "fixed_base", threads = 0))]
    fn encrypt_raw(&self, py: Python<'_>, plaintexts: Vec<Vec<u8>>, randomizer: &str, threads: usize) -> PyResult<PyCiphertextVector> {
        Encryptor::Holder(&self.key).encrypt_raw(py, plaintexts, randomizer, threads)
    }
    #[pyo3(signature = (values, kind, bits, max_summands, alpha, quantizer = "exact_bound", seed = None, threads = 0, engine = None))]
    #[allow(clippy::too_many_arguments)]
    fn encrypt_packed(
        &self,
        py: Python<'_>,
        values: &Bound<'_, PyAny>,
        kind: &str,
        bits: u32,
        max_summands: u32,
        alpha: f64,
        quantizer: &str,
        seed: Option<u64>,
        threads: usize,
        engine: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyCiphertextVector> {
        Encryptor::Holder(&self.key).encrypt_packed(py, values, kind, bits, max_summands, alpha, quantizer, seed, threads, engine)
    }
    #[pyo3(signature = (vector, threads = 0))]
    fn decrypt_i64<'py>(&self, py: Python<'py>, vector: &PyCiphertextVector, threads: usize) -> PyResult<Bound<'py, PyArray1<i64>>> {
        self.check_key(vector)?;
        let values = py.detach(|| {
            threaded(threads, || {
                let decoded = self.key.decrypt_signed_many(&vector.ciphertexts)?;
                decoded
                    .iter()
                    .enumerate()
                    .map(|(index, v)| v.to_i64().ok_or(NativeError::NotInt64 { index }))
                    .collect::<NativeResult<Vec<i64>>>()
            })
        })?;
        Ok(PyArray1::from_vec(py, values))
    }
    #[pyo3(signature = (vector, threads = 0))]
    fn decrypt_raw<'py>(&self, py: Python<'py>, vector: &PyCiphertextVector, threads: usize) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        self.check_key(vector)?;
        let values = py.detach(|| threaded(threads, || Ok(self.key.decrypt_many(&vector.ciphertexts)?)))?;
        Ok(values.iter().map(|v| PyBytes::new(py, &v.to_digits::<u8>(Order::Msf))).collect())
    }
    /// Returns (sums as float64, overflow positions as int64).
    #[allow(clippy::type_complexity)]
    /// With `engine`, another engine (the GPU) decrypts: engine(ciphertext bytes, count) -> the
    /// plaintexts as `count` big-endian elements of the modulus width.
    #[pyo3(signature = (vector, threads = 0, engine = None))]
    fn decrypt_packed<'py>(
        &self,
        py: Python<'py>,
        vector: &PyCiphertextVector,
        threads: usize,
        engine: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(Bound<'py, PyArray1<f64>>, Bound<'py, PyArray1<i64>>)> {
        self.check_key(vector)?;
        let pack = vector.pack.as_ref().ok_or_else(|| invalid("vector", "holds raw ciphertexts, not a packed vector: use decrypt_i64"))?;
        let public = self.key.encryption_key();
        let external = match engine {
            None => None,
            Some(engine) => {
                let width = public.ciphertext_bytes();
                let mut data = Vec::with_capacity(vector.ciphertexts.len() * width);
                for c in vector.ciphertexts.iter() {
                    let digits = c.as_integer().to_digits::<u8>(Order::Msf);
                    data.resize(data.len() + width - digits.len(), 0);
                    data.extend_from_slice(&digits);
                }
                let count = vector.ciphertexts.len();
                let out = engine.call1((PyBytes::new(py, &data), count))?;
                let out = out.cast_into::<PyBytes>().map_err(|_| invalid("engine", "must return bytes"))?;
                let n_width = public.ciphertext_bytes() / 2;
                if out.as_bytes().len() != count * n_width {
                    return Err(invalid(
                        "engine",
                        format!("returned {} bytes for {count} plaintexts of {n_width} bytes", out.as_bytes().len()),
                    ));
                }
                let plaintexts: Vec<Integer> = out.as_bytes().chunks(n_width).map(|c| Integer::from_digits(c, Order::Msf)).collect();
                if let Some(index) = plaintexts.iter().position(|m| m >= public.n()) {
                    return Err(invalid("engine", format!("plaintext {index} is not below n")));
                }
                Some(plaintexts)
            }
        };
        let (values, overflow) = py.detach(|| {
            threaded(threads, || {
                let plaintexts = match external {
                    Some(plaintexts) => plaintexts,
                    None => self.key.decrypt_many(&vector.ciphertexts)?,
                };
                decode_packed(pack, &plaintexts)
            })
        })?;
        Ok((PyArray1::from_vec(py, values), PyArray1::from_vec(py, overflow)))
    }
    fn __repr__(&self) -> String {
        format!(
            "DecryptionKey(bits={}, key_id={}, secret=<redacted>)",
            self.key.encryption_key().bits(),
            self.key.encryption_key().key_id()
        )
    }
    fn __reduce__(&self) -> PyResult<()> {
        Err(PyTypeError::new_err("DecryptionKey cannot be pickled: export it explicitly with export_secret() and protect the bytes"))
    }
}

impl PyDecryptionKey {
    fn check_key(&self, vector: &PyCiphertextVector) -> PyResult<()> {
        let (expected, found) = (self.key.encryption_key().key_id(), vector.key.key_id());
        if expected != found {
            return Err(NativeError::from(confide_paillier::Error::KeyMismatch {
                what: "ciphertext vector",
                expected: expected.to_string(),
                found: found.to_string(),
            })
            .into());
        }
        Ok(())
    }
}

/// A vector of Paillier ciphertexts under one key, raw or packed.
#[pyclass(name = "CiphertextVector", module = "confide._native", frozen)]
struct PyCiphertextVector {
    key: EncryptionKey,
    ciphertexts: Arc<Vec<Ciphertext>>,
    pack: Option<PackInfo>,
    rerandomized: bool,
}

impl PyCiphertextVector {
    fn new(key: EncryptionKey, ciphertexts: Vec<Ciphertext>, pack: Option<PackInfo>) -> Self {
        PyCiphertextVector { key, ciphertexts: Arc::new(ciphertexts), pack, rerandomized: false }
    }
    fn raw_only(&self, operation: &str) -> PyResult<()> {
        if self.pack.is_some() {
            return Err(invalid(
                "vector",
                format!("{operation} is only defined on raw ciphertexts; packed vectors support addition and re-randomization"),
            ));
        }
        Ok(())
    }
    fn derived(&self, ciphertexts: Vec<Ciphertext>) -> Self {
        PyCiphertextVector::new(self.key.clone(), ciphertexts, self.pack.clone())
    }
}

#[pymethods]
impl PyCiphertextVector {
    fn __len__(&self) -> usize {
        self.ciphertexts.len()
    }
    #[getter]
    fn key_id(&self) -> String {
        self.key.key_id().to_string()
    }
    #[getter]
    fn encryption_key(&self) -> PyEncryptionKey {
        PyEncryptionKey { key: self.key.clone() }
    }
    #[getter]
    fn encoding(&self) -> &'static str {
        match &self.pack {
            None => "raw",
            Some(PackInfo { codec: Codec::BatchCrypt(_), .. }) => "batchcrypt",
            Some(PackInfo { codec: Codec::FlBooster(_), .. }) => "flbooster",
        }
    }
    /// Number of values: packed length, or the ciphertext count for raw vectors.
    #[getter]
    fn length(&self) -> u64 {
        self.pack.as_ref().map_or(self.ciphertexts.len() as u64, |p| p.length)
    }
    #[getter]
    fn summed(&self) -> u64 {
        self.pack.as_ref().map_or(1, |p| p.summed)
    }
    #[getter]
    fn rerandomized(&self) -> bool {
        self.rerandomized
    }
    /// Quantizer of a BatchCrypt vector ("exact_bound" or "paper"), else None.
    #[getter]
    fn quantizer(&self) -> Option<&'static str> {
        match &self.pack {
            Some(PackInfo { codec: Codec::BatchCrypt(c), .. }) => {
                Some(if c.quantizer() == Quantizer::Paper { "paper" } else { "exact_bound" })
            }
            _ => None,
        }
    }
    /// (slot_bits, slots) of a packed vector, or None.
    #[getter]
    fn packing(&self) -> Option<(u32, usize)> {
        self.pack.as_ref().map(|p| {
            let layout = codec_layout(&p.codec);
            (layout.slot_bits, layout.slots)
        })
    }

    #[staticmethod]
    #[pyo3(signature = (vectors, threads = 0))]
    fn sum(py: Python<'_>, vectors: Vec<PyRef<'_, PyCiphertextVector>>, threads: usize) -> PyResult<Self> {
        let first = vectors.first().ok_or_else(|| invalid("vectors", "at least one vector is required"))?;
        let mut summed = 0u64;
        for (index, v) in vectors.iter().enumerate() {
            if v.key.key_id() != first.key.key_id() {
                return Err(NativeError::from(confide_paillier::Error::KeyMismatch {
                    what: "summed vector",
                    expected: first.key.key_id().to_string(),
                    found: v.key.key_id().to_string(),
                })
                .into());
            }
            let same_codec = match (&v.pack, &first.pack) {
                (None, None) => true,
                (Some(a), Some(b)) => a.codec == b.codec && a.length == b.length,
                _ => false,
            };
            if !same_codec {
                return Err(invalid("vectors", format!("vector {index} has a different encoding or length than vector 0")));
            }
            summed += v.pack.as_ref().map_or(1, |p| p.summed);
        }
        let slices: Vec<&[Ciphertext]> = vectors.iter().map(|v| v.ciphertexts.as_slice()).collect();
        let key = first.key.clone();
        let ciphertexts = py.detach(|| threaded(threads, || Ok(key.sum_many(&slices)?)))?;
        let pack = first.pack.clone().map(|p| PackInfo { summed, ..p });
        Ok(PyCiphertextVector::new(key, ciphertexts, pack))
    }
    #[pyo3(signature = (other, threads = 0))]
    fn add(slf: PyRef<'_, Self>, py: Python<'_>, other: PyRef<'_, Self>, threads: usize) -> PyResult<Self> {
        PyCiphertextVector::sum(py, vec![slf, other], threads)
    }
    #[pyo3(signature = (values, threads = 0))]
    fn add_plain_i64(&self, py: Python<'_>, values: PyReadonlyArray1<'_, i64>, threads: usize) -> PyResult<Self> {
        self.raw_only("add_plain")?;
        let values = values.as_slice().map_err(|_| invalid("values", "array must be contiguous"))?;
        let out = py.detach(|| {
            threaded(threads, || {
                let plaintexts =
                    values.iter().map(|&v| self.key.encode_signed(&Integer::from(v))).collect::<confide_paillier::Result<Vec<_>>>()?;
                Ok(self.key.add_plain_many(&self.ciphertexts, &plaintexts)?)
            })
        })?;
        Ok(self.derived(out))
    }
    #[pyo3(signature = (threads = 0))]
    fn negate(&self, py: Python<'_>, threads: usize) -> PyResult<Self> {
        self.raw_only("negate")?;
        let out = py.detach(|| threaded(threads, || Ok(self.key.negate_many(&self.ciphertexts)?)))?;
        Ok(self.derived(out))
    }
    #[pyo3(signature = (scalars, threads = 0))]
    fn mul_scalar_i64(&self, py: Python<'_>, scalars: PyReadonlyArray1<'_, i64>, threads: usize) -> PyResult<Self> {
        self.raw_only("mul_scalar")?;
        let scalars = scalars.as_slice().map_err(|_| invalid("scalars", "array must be contiguous"))?;
        let out = py.detach(|| {
            threaded(threads, || {
                let scalars: Vec<Integer> = scalars.iter().map(|&s| Integer::from(s)).collect();
                Ok(self.key.mul_scalar_many(&self.ciphertexts, &scalars)?)
            })
        })?;
        Ok(self.derived(out))
    }
    /// Every element raised to one signed big-endian exponent mod n² (threshold partial
    /// decryption: c^(2·Δ·d_j)). The result is a raw vector: it no longer encrypts the packing.
    #[pyo3(signature = (exponent, negative = false, threads = 0))]
    fn power(&self, py: Python<'_>, exponent: &[u8], negative: bool, threads: usize) -> PyResult<Self> {
        if exponent.is_empty() || exponent.len() > 4096 {
            return Err(invalid("exponent", format!("must hold 1 to 4096 bytes, got {}", exponent.len())));
        }
        let mut scalar = Integer::from_digits(exponent, Order::Msf);
        if negative {
            scalar = -scalar;
        }
        let out = py.detach(|| threaded(threads, || Ok(self.key.pow_shared_many(&self.ciphertexts, &scalar)?)))?;
        Ok(PyCiphertextVector::new(self.key.clone(), out, None))
    }
    /// Unpacks and dequantizes plaintexts recovered outside this process (threshold
    /// decryption), one big-endian integer per ciphertext of this packed vector.
    #[allow(clippy::type_complexity)]
    fn decode_plaintexts<'py>(
        &self,
        py: Python<'py>,
        plaintexts: Vec<Vec<u8>>,
    ) -> PyResult<(Bound<'py, PyArray1<f64>>, Bound<'py, PyArray1<i64>>)> {
        let pack = self.pack.as_ref().ok_or_else(|| invalid("vector", "holds raw ciphertexts, not a packed vector"))?;
        if plaintexts.len() != self.ciphertexts.len() {
            return Err(invalid(
                "plaintexts",
                format!("must hold {} values, one per ciphertext, got {}", self.ciphertexts.len(), plaintexts.len()),
            ));
        }
        let (values, overflow) = py.detach(|| {
            let plaintexts: Vec<Integer> = plaintexts.iter().map(|b| Integer::from_digits(b, Order::Msf)).collect();
            decode_packed(pack, &plaintexts)
        })?;
        Ok((PyArray1::from_vec(py, values), PyArray1::from_vec(py, overflow)))
    }
    #[pyo3(signature = (threads = 0))]
    fn rerandomize(&self, py: Python<'_>, threads: usize) -> PyResult<Self> {
        let out = py.detach(|| threaded(threads, || Ok(self.key.rerandomize_many(&self.ciphertexts)?)))?;
        let mut vector = self.derived(out);
        vector.rerandomized = true;
        Ok(vector)
    }
    /// Gradient histograms (SecureBoost): `bins` is a C-contiguous uint8 (F, N) array with
    /// N = len(self); out[f*n_bins + b] sums self[r] over the `rows` r with bins[f, r] == b
    /// (empty bins: the ciphertext 1). Bit-identical to the naive products mod n².
    #[pyo3(signature = (bins, rows, n_bins, threads = 0))]
    fn histogram(
        &self,
        py: Python<'_>,
        bins: numpy::PyReadonlyArray2<'_, u8>,
        rows: PyReadonlyArray1<'_, u32>,
        n_bins: i64,
        threads: usize,
    ) -> PyResult<Self> {
        use numpy::PyUntypedArrayMethods;
        self.raw_only("histogram")?;
        let n_bins = usize::try_from(n_bins).map_err(|_| invalid("n_bins", format!("must be in 1..=256, got {n_bins}")))?;
        let (features, samples) = (bins.shape()[0], bins.shape()[1]);
        if samples != self.ciphertexts.len() {
            return Err(NativeError::from(confide_paillier::Error::LengthMismatch {
                what: "bins (second axis: one column per ciphertext)",
                expected: self.ciphertexts.len(),
                found: samples,
            })
            .into());
        }
        if !bins.is_c_contiguous() {
            return Err(invalid("bins", "array must be C-contiguous (F, N)"));
        }
        let bins = bins.as_slice().map_err(|_| invalid("bins", "array must be C-contiguous (F, N)"))?;
        let rows = rows.as_slice().map_err(|_| invalid("rows", "array must be contiguous"))?;
        let out = py.detach(|| threaded(threads, || Ok(self.key.histogram(&self.ciphertexts, bins, features, rows, n_bins)?)))?;
        Ok(self.derived(out))
    }
    /// Cipher compression: each group of `per` consecutive ciphertexts becomes one holding
    /// sum_j m_j * 2^(width*j) (first ciphertext in the lowest slot); per*width < key bits - 1.
    #[pyo3(signature = (width, per, threads = 0))]
    fn fold(&self, py: Python<'_>, width: i64, per: i64, threads: usize) -> PyResult<Self> {
        self.raw_only("fold")?;
        let width = u32::try_from(width).map_err(|_| invalid("width", format!("must be in 1..=1024, got {width}")))?;
        let per = usize::try_from(per).map_err(|_| invalid("per", format!("must be at least 1, got {per}")))?;
        let out = py.detach(|| threaded(threads, || Ok(self.key.fold(&self.ciphertexts, width, per)?)))?;
        Ok(self.derived(out))
    }
    /// Encrypted matrix-vector product: `matrix` is a C-contiguous uint64 (F, N) array with
    /// N = len(self) and entries < 2^bits; out[j] = prod_i self[i]^matrix[j, i] mod n^2.
    #[pyo3(signature = (matrix, bits, threads = 0))]
    fn dot_u64(&self, py: Python<'_>, matrix: numpy::PyReadonlyArray2<'_, u64>, bits: i64, threads: usize) -> PyResult<Self> {
        use numpy::PyUntypedArrayMethods;
        self.raw_only("dot_u64")?;
        let bits = u32::try_from(bits).map_err(|_| invalid("bits", format!("must be in 1..=64, got {bits}")))?;
        let (rows, columns) = (matrix.shape()[0], matrix.shape()[1]);
        if columns != self.ciphertexts.len() {
            return Err(NativeError::from(confide_paillier::Error::LengthMismatch {
                what: "matrix (second axis: one column per ciphertext)",
                expected: self.ciphertexts.len(),
                found: columns,
            })
            .into());
        }
        if !matrix.is_c_contiguous() {
            return Err(invalid("matrix", "array must be C-contiguous (F, N)"));
        }
        let matrix = matrix.as_slice().map_err(|_| invalid("matrix", "array must be C-contiguous (F, N)"))?;
        let out = py.detach(|| threaded(threads, || Ok(self.key.dot_u64(&self.ciphertexts, matrix, rows, bits)?)))?;
        Ok(self.derived(out))
    }
    /// The same uint64 (F, K) exponent matrix on each consecutive group of K ciphertexts:
    /// out[g·F + j] = prod_k self[g·K + k]^matrix[j, k] mod n^2 (len(self) a multiple of K).
    #[pyo3(signature = (matrix, bits, threads = 0))]
    fn dot_groups_u64(&self, py: Python<'_>, matrix: numpy::PyReadonlyArray2<'_, u64>, bits: i64, threads: usize) -> PyResult<Self> {
        use numpy::PyUntypedArrayMethods;
        self.raw_only("dot_groups_u64")?;
        let bits = u32::try_from(bits).map_err(|_| invalid("bits", format!("must be in 1..=64, got {bits}")))?;
        let (rows, group) = (matrix.shape()[0], matrix.shape()[1]);
        if !matrix.is_c_contiguous() {
            return Err(invalid("matrix", "array must be C-contiguous (F, K)"));
        }
        let matrix = matrix.as_slice().map_err(|_| invalid("matrix", "array must be C-contiguous (F, K)"))?;
        let out = py.detach(|| threaded(threads, || Ok(self.key.dot_groups_u64(&self.ciphertexts, group, matrix, rows, bits)?)))?;
        Ok(self.derived(out))
    }
    /// Ciphertexts `start..stop` as a vector of their own (raw vectors only): a range of rows,
    /// shipped to the worker that holds those rows.
    fn slice(&self, start: usize, stop: usize) -> PyResult<Self> {
        self.raw_only("slice")?;
        let n = self.ciphertexts.len();
        if start > stop || stop > n {
            return Err(invalid("stop", format!("must satisfy start <= stop <= {n}, got {start}..{stop}")));
        }
        Ok(self.derived(self.ciphertexts[start..stop].to_vec()))
    }
    /// The ciphertexts at `indices` (uint32), in that order (raw vectors only): the rows one
    /// worker holds, wherever they sit in the vector.
    fn take(&self, indices: PyReadonlyArray1<'_, u32>) -> PyResult<Self> {
        self.raw_only("take")?;
        let n = self.ciphertexts.len();
        let indices = indices.as_slice()?;
        let mut out = Vec::with_capacity(indices.len());
        for &i in indices {
            let c = self.ciphertexts.get(i as usize).ok_or_else(|| invalid("indices", format!("must be < {n}, got {i}")))?;
            out.push(c.clone());
        }
        Ok(self.derived(out))
    }
    /// Ciphertext `index` as a big-endian integer (for interoperability).
    fn element_bytes<'py>(&self, py: Python<'py>, index: usize) -> PyResult<Bound<'py, PyBytes>> {
        let c =
            self.ciphertexts.get(index).ok_or_else(|| invalid("index", format!("must be < {}, got {index}", self.ciphertexts.len())))?;
        Ok(PyBytes::new(py, &c.as_integer().to_digits::<u8>(Order::Msf)))
    }
    /// A raw vector from big-endian ciphertext integers, each checked 0 < c < n².
    #[staticmethod]
    fn from_elements(py: Python<'_>, elements: Vec<Vec<u8>>, key: &PyEncryptionKey) -> PyResult<Self> {
        let key = key.key.clone();
        let ciphertexts = py.detach(|| {
            elements
                .iter()
                .enumerate()
                .map(|(index, e)| {
                    Ciphertext::new(&key, Integer::from_digits(e, Order::Msf))
                        .map_err(|_| confide_paillier::Error::CiphertextOutOfRange { index })
                })
                .collect::<confide_paillier::Result<Vec<_>>>()
        });
        Ok(PyCiphertextVector::new(key, ciphertexts.map_err(NativeError::from)?, None))
    }
    /// Canonical wire bytes (ciphertext block, algorithms.md §1.9).
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let (encoding, params) = match &self.pack {
            None => (Encoding::Raw, Vec::new()),
            Some(p) => (
                if matches!(p.codec, Codec::BatchCrypt(_)) { Encoding::BatchCrypt } else { Encoding::FlBooster },
                to_params(&p.codec, self.key.bits(), p.length, p.summed),
            ),
        };
        let block = CiphertextBlock {
            key_id: self.key.key_id(),
            encoding,
            params,
            flags: if self.rerandomized { FLAG_RERANDOMIZED } else { 0 },
            ciphertexts: self.ciphertexts.as_ref().clone(),
        };
        let bytes = py.detach(|| block.to_bytes(&self.key)).map_err(NativeError::from)?;
        Ok(PyBytes::new(py, &bytes))
    }
    #[staticmethod]
    fn from_bytes(py: Python<'_>, data: &[u8], key: &PyEncryptionKey) -> PyResult<Self> {
        let key = key.key.clone();
        let block = py.detach(|| CiphertextBlock::from_bytes(data, &key)).map_err(NativeError::from)?;
        let pack = match block.encoding {
            Encoding::Raw => None,
            Encoding::BatchCrypt | Encoding::FlBooster => {
                let (codec, plaintext_bits, length, summed) =
                    from_params(&block.params, block.encoding == Encoding::BatchCrypt).map_err(NativeError::from)?;
                if plaintext_bits != key.bits() {
                    return Err(invalid(
                        "params",
                        format!("codec was built for {plaintext_bits}-bit plaintexts, key has {} bits", key.bits()),
                    ));
                }
                let expected = codec_layout(&codec).plaintexts_for(length as usize);
                if expected != block.ciphertexts.len() {
                    return Err(NativeError::from(confide_codec::Error::Malformed(format!(
                        "{length} packed values need {expected} ciphertexts, block has {}",
                        block.ciphertexts.len()
                    )))
                    .into());
                }
                Some(PackInfo { codec, length, summed })
            }
            other => return Err(invalid("encoding", format!("{other:?} blocks are not supported by CiphertextVector"))),
        };
        let mut vector = PyCiphertextVector::new(key, block.ciphertexts, pack);
        vector.rerandomized = block.flags & FLAG_RERANDOMIZED != 0;
        Ok(vector)
    }
    fn __repr__(&self) -> String {
        format!(
            "CiphertextVector(encoding={}, length={}, ciphertexts={}, summed={}, key_id={})",
            self.encoding(),
            self.length(),
            self.ciphertexts.len(),
            self.summed(),
            self.key.key_id()
        )
    }
}

/// Generates a key pair (OS CSPRNG); bits ∈ {2048, 3072, 4096}.
#[pyfunction]
fn generate_keypair(py: Python<'_>, bits: u32) -> PyResult<PyDecryptionKey> {
    Ok(PyDecryptionKey { key: py.detach(|| DecryptionKey::generate(bits)).map_err(NativeError::from)? })
}

/// dACIQ clipping threshold for one layer (see confide_codec::daciq).
#[pyfunction]
#[pyo3(signature = (maxima, minima, elements, bits, parties, effective_bits = true))]
fn daciq_threshold(
    maxima: PyReadonlyArray1<'_, f64>,
    minima: PyReadonlyArray1<'_, f64>,
    elements: u64,
    bits: u32,
    parties: u32,
    effective_bits: bool,
) -> PyResult<f64> {
    let maxima = maxima.as_slice().map_err(|_| invalid("maxima", "array must be contiguous"))?;
    let minima = minima.as_slice().map_err(|_| invalid("minima", "array must be contiguous"))?;
    Ok(confide_codec::daciq::clipping_threshold(maxima, minima, elements, bits, parties, effective_bits).map_err(NativeError::from)?)
}

/// Which modular-arithmetic engine runs: "avx512-ifma" (8 lanes) or "gmp".
#[pyfunction]
fn engine() -> &'static str {
    if confide_paillier::ifma_available() {
        "avx512-ifma"
    } else {
        "gmp"
    }
}

/// A(b) from the corrected dACIQ table.
#[pyfunction]
fn daciq_alpha_factor(bits: u32) -> PyResult<f64> {
    Ok(confide_codec::daciq::alpha_factor(bits).map_err(NativeError::from)?)
}

/// (slot_bits, slots) of a codec for a plaintext size; validates the parameters.
#[pyfunction]
#[pyo3(signature = (kind, bits, max_summands, alpha, plaintext_bits, quantizer = "exact_bound"))]
fn codec_layout_of(kind: &str, bits: u32, max_summands: u32, alpha: f64, plaintext_bits: u32, quantizer: &str) -> PyResult<(u32, usize)> {
    let layout = codec_layout(&build_codec(kind, bits, max_summands, alpha, quantizer, plaintext_bits)?);
    Ok((layout.slot_bits, layout.slots))
}

/// The BatchCrypt codes `encrypt_packed` packs for `values` (float64) under `seed`, as uint32 words
/// (two's complement): what a paillier party contributed, for verification.
#[pyfunction]
#[pyo3(signature = (values, bits, max_summands, alpha, plaintext_bits, seed, quantizer = "exact_bound"))]
#[allow(clippy::too_many_arguments)]
fn batchcrypt_codes<'py>(
    py: Python<'py>,
    values: PyReadonlyArray1<'_, f64>,
    bits: u32,
    max_summands: u32,
    alpha: f64,
    plaintext_bits: u32,
    seed: u64,
    quantizer: &str,
) -> PyResult<Bound<'py, PyArray1<u32>>> {
    let Codec::BatchCrypt(codec) = build_codec("batchcrypt", bits, max_summands, alpha, quantizer, plaintext_bits)? else {
        return Err(invalid("kind", "codes are BatchCrypt's"));
    };
    let values = values.as_slice().map_err(|_| invalid("values", "must be a contiguous float64 array"))?;
    let codes = py.detach(|| codec.codes(values, Some(seed))).map_err(NativeError::from)?;
    Ok(PyArray1::from_vec(py, codes.iter().map(|&c| c as u32).collect()))
}

/// The 16-byte key of a challenge, or an error naming the field.
fn tag_key(key: &[u8]) -> PyResult<[u8; 16]> {
    key.try_into().map_err(|_| invalid("key", format!("must be 16 bytes, got {}", key.len())))
}

/// Integer tags of verifiable aggregation: `<r_k, q> mod 2^31 - 1` for k < `vectors`, with `q` the
/// signed residues mod `2^bits` held in `words` (confide_codec::tags; GIL released).
#[pyfunction]
fn verify_integer_tags(py: Python<'_>, words: PyReadonlyArray1<'_, u32>, bits: u32, key: &[u8], vectors: usize) -> PyResult<Vec<u64>> {
    let key = tag_key(key)?;
    let words = words.as_slice().map_err(|_| invalid("words", "must be a contiguous uint32 array"))?;
    Ok(py.detach(|| confide_codec::tags::integer_tags(words, bits, &key, vectors)).map_err(NativeError::from)?)
}

/// One slice's fused check in a fixed-point mode: (commitment hash, the sum's tags, this party's
/// tags) from the delivered payload, the sum's words and this party's float32 or float64 values
/// (encoded here as the mode encodes them). GIL released.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn verify_check_fixed<'py>(
    py: Python<'py>,
    prefix: &[u8],
    payload: &[u8],
    words: PyReadonlyArray1<'_, u32>,
    values: &Bound<'py, PyAny>,
    scale: f64,
    bound: f64,
    bits: u32,
    vectors: usize,
) -> PyResult<(Bound<'py, PyBytes>, Vec<u64>, Vec<u64>)> {
    use confide_codec::tags::{check_fixed_point, FixedPoint};
    let fixed = FixedPoint { scale, bound, bits };
    let words = words.as_slice().map_err(|_| invalid("words", "must be a contiguous uint32 array"))?;
    let check = if let Ok(values) = values.extract::<PyReadonlyArray1<'_, f32>>() {
        let values = values.as_slice().map_err(|_| invalid("values", "must be contiguous"))?;
        py.detach(|| check_fixed_point(prefix, payload, words, values, fixed, vectors))
    } else {
        let values = values.extract::<PyReadonlyArray1<'_, f64>>().map_err(|_| invalid("values", "must be a float32 or float64 array"))?;
        let values = values.as_slice().map_err(|_| invalid("values", "must be contiguous"))?;
        py.detach(|| check_fixed_point(prefix, payload, words, values, fixed, vectors))
    }
    .map_err(NativeError::from)?;
    Ok((PyBytes::new(py, &check.digest), check.sums, check.tags))
}

/// One slice's fused check in a float mode: (commitment hash, `<r_k, S>`, `<r_k, x>`, `<|r_k|, |x|>`).
#[pyfunction]
#[allow(clippy::type_complexity)]
fn verify_check_float<'py>(
    py: Python<'py>,
    prefix: &[u8],
    payload: &[u8],
    sums: PyReadonlyArray1<'_, f32>,
    values: PyReadonlyArray1<'_, f32>,
    vectors: usize,
) -> PyResult<(Bound<'py, PyBytes>, Vec<f64>, Vec<f64>, Vec<f64>)> {
    let sums = sums.as_slice().map_err(|_| invalid("sums", "must be a contiguous float32 array"))?;
    let values = values.as_slice().map_err(|_| invalid("values", "must be a contiguous float32 array"))?;
    let (check, digest) =
        py.detach(|| confide_codec::tags::check_float(prefix, payload, sums, values, vectors)).map_err(NativeError::from)?;
    Ok((PyBytes::new(py, &digest), check.sums, check.tags, check.weights))
}

/// The first `count` words of challenge vector `vector` under `key` (tests check the tags against them).
#[pyfunction]
fn verify_challenge_words<'py>(py: Python<'py>, key: &[u8], vector: u64, count: usize) -> PyResult<Bound<'py, PyArray1<u32>>> {
    let key = tag_key(key)?;
    Ok(PyArray1::from_vec(py, confide_codec::tags::challenge_words(&key, vector, count)))
}

/// `words` (residues mod `2^ring_bits`) read as signed values and offset by `2^(bits - 1)`.
fn offset_values(words: &[u32], ring_bits: u32, bits: u32) -> PyResult<Vec<u64>> {
    if !(2..=32).contains(&ring_bits) || !(1..=ring_bits).contains(&bits) {
        return Err(invalid("bits", format!("must be in 1..={ring_bits} (ring_bits in 2..=32), got {bits}")));
    }
    let (shift, offset) = (32 - ring_bits, 1i64 << (bits - 1));
    Ok(words.iter().map(|&w| (((w << shift) as i32 >> shift) as i64 + offset) as u64).collect())
}

fn pair_keys(keys: Vec<Vec<u8>>) -> PyResult<Vec<[u8; 16]>> {
    keys.iter().map(|k| k.as_slice().try_into().map_err(|_| invalid("keys", "each pair key must be 16 bytes"))).collect()
}

/// A party's bound proof message for its fixed-point `words` (docs/crypto.md, "Bounded updates"),
/// followed by the proof that their L2 norm is at most `l2` (fixed-point units) when one is given.
#[pyfunction]
#[pyo3(signature = (context, words, ring_bits, bits, keys, adds, l2 = None))]
#[allow(clippy::too_many_arguments)]
fn bound_prove<'py>(
    py: Python<'py>,
    context: &[u8],
    words: PyReadonlyArray1<'_, u32>,
    ring_bits: u32,
    bits: u32,
    keys: Vec<Vec<u8>>,
    adds: Vec<bool>,
    l2: Option<u64>,
) -> PyResult<Bound<'py, PyBytes>> {
    let values = offset_values(words.as_slice().map_err(|_| invalid("words", "must be a contiguous uint32 array"))?, ring_bits, bits)?;
    let keys = pair_keys(keys)?;
    let message = py
        .detach(|| {
            let gammas = confide_codec::bound::blindings(&keys, &adds, values.len())?;
            let mut message = confide_codec::bound::prove(context, &values, bits, &gammas)?;
            if let Some(l2) = l2 {
                let commitments = confide_codec::bound::verify(context, &message, values.len(), bits, false)
                    .map_err(|e| confide_codec::Error::Malformed(format!("its own bound proof: {e:?}")))?;
                message.extend(confide_codec::norm::prove(context, &values, bits, &gammas, &commitments, l2)?);
            }
            Ok::<_, confide_codec::Error>(message)
        })
        .map_err(NativeError::from)?;
    Ok(PyBytes::new(py, &message))
}

/// The norm proof alone (what [`bound_prove`] appends with `l2`), on the commitments of a bound
/// proof of the same `words` and pair keys: for measuring it apart from the range proofs.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn bound_norm_prove<'py>(
    py: Python<'py>,
    context: &[u8],
    words: PyReadonlyArray1<'_, u32>,
    ring_bits: u32,
    bits: u32,
    keys: Vec<Vec<u8>>,
    adds: Vec<bool>,
    commitments: &[u8],
    l2: u64,
) -> PyResult<Bound<'py, PyBytes>> {
    let values = offset_values(words.as_slice().map_err(|_| invalid("words", "must be a contiguous uint32 array"))?, ring_bits, bits)?;
    let keys = pair_keys(keys)?;
    let message = py
        .detach(|| {
            let gammas = confide_codec::bound::blindings(&keys, &adds, values.len())?;
            confide_codec::norm::prove(context, &values, bits, &gammas, commitments, l2)
        })
        .map_err(NativeError::from)?;
    Ok(PyBytes::new(py, &message))
}

/// Whether a norm proof alone verifies against `commitments`: "" or why not ("norm", or what is
/// malformed).
#[pyfunction]
fn bound_norm_verify(py: Python<'_>, context: &[u8], message: &[u8], commitments: &[u8], count: usize, bits: u32, l2: u64) -> String {
    match py.detach(|| confide_codec::norm::verify(context, message, commitments, count, bits, l2)) {
        Ok(()) => String::new(),
        Err(confide_codec::bound::Refusal::Malformed(why)) => why,
        Err(_) => "norm".to_string(),
    }
}

/// The squared L2 norm of fixed-point `words` (exact, as the norm proof sees them).
#[pyfunction]
fn bound_squared_norm(words: PyReadonlyArray1<'_, u32>, ring_bits: u32, bits: u32) -> PyResult<u128> {
    let values = offset_values(words.as_slice().map_err(|_| invalid("words", "must be a contiguous uint32 array"))?, ring_bits, bits)?;
    Ok(confide_codec::norm::squared_norm(&values, bits).map_err(NativeError::from)?)
}

/// (commitments, "") of a peer's bound proof message, or (b"", why) when it is refused: "chunk <c>"
/// for a range proof that does not verify, "norm" for a norm proof (expected when `l2` is given)
/// that does not, else what is malformed.
#[pyfunction]
#[pyo3(signature = (context, message, count, bits, check, l2 = None))]
fn bound_verify<'py>(
    py: Python<'py>,
    context: &[u8],
    message: &[u8],
    count: usize,
    bits: u32,
    check: bool,
    l2: Option<u64>,
) -> (Bound<'py, PyBytes>, String) {
    use confide_codec::bound::Refusal;
    let checked = py.detach(|| {
        let (points, used) = confide_codec::bound::verify_prefix(context, message, count, bits, check)?;
        match l2 {
            None if used != message.len() => Err(Refusal::Malformed(format!("{} bytes follow the last proof", message.len() - used))),
            Some(l2) if check => confide_codec::norm::verify(context, &message[used..], &points, count, bits, l2).map(|()| points),
            _ => Ok(points),
        }
    });
    match checked {
        Ok(points) => (PyBytes::new(py, &points), String::new()),
        Err(Refusal::Proof { chunk }) => (PyBytes::new(py, b""), format!("chunk {chunk}")),
        Err(Refusal::Norm) => (PyBytes::new(py, b""), "norm".to_string()),
        Err(Refusal::Malformed(why)) => (PyBytes::new(py, b""), why),
    }
}

/// Positions where the parties' commitments are not those of the decoded sum `sums` (residues mod
/// `2^ring_bits`) of `parties` values offset by `2^(bits - 1)` each. `residual_keys` and
/// `residual_adds`: the pair keys (and signs) whose blindings did not cancel, when a recovered round
/// left parties out.
#[pyfunction]
#[pyo3(signature = (commitments, sums, ring_bits, bits, residual_keys = Vec::new(), residual_adds = Vec::new()))]
fn bound_check_sum(
    py: Python<'_>,
    commitments: Vec<Vec<u8>>,
    sums: PyReadonlyArray1<'_, u32>,
    ring_bits: u32,
    bits: u32,
    residual_keys: Vec<Vec<u8>>,
    residual_adds: Vec<bool>,
) -> PyResult<Vec<usize>> {
    let parties = commitments.len() as i64;
    let offset = 1i64 << (bits.clamp(1, 32) - 1);
    let totals: Vec<i64> =
        offset_values(sums.as_slice().map_err(|_| invalid("sums", "must be a contiguous uint32 array"))?, ring_bits, bits)?
            .into_iter()
            .map(|v| v as i64 + (parties - 1) * offset)
            .collect();
    let views: Vec<&[u8]> = commitments.iter().map(Vec::as_slice).collect();
    let keys = pair_keys(residual_keys)?;
    Ok(py
        .detach(|| {
            let residual = if keys.is_empty() { Vec::new() } else { confide_codec::bound::blindings(&keys, &residual_adds, totals.len())? };
            confide_codec::bound::check_sum(&views, &totals, bits, &residual)
        })
        .map_err(NativeError::from)?)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEncryptionKey>()?;
    m.add_class::<PyDecryptionKey>()?;
    m.add_class::<PyCiphertextVector>()?;
    m.add_function(wrap_pyfunction!(generate_keypair, m)?)?;
    m.add_function(wrap_pyfunction!(daciq_threshold, m)?)?;
    m.add_function(wrap_pyfunction!(daciq_alpha_factor, m)?)?;
    m.add_function(wrap_pyfunction!(codec_layout_of, m)?)?;
    m.add_function(wrap_pyfunction!(verify_integer_tags, m)?)?;
    m.add_function(wrap_pyfunction!(verify_challenge_words, m)?)?;
    m.add_function(wrap_pyfunction!(verify_check_fixed, m)?)?;
    m.add_function(wrap_pyfunction!(verify_check_float, m)?)?;
    m.add_function(wrap_pyfunction!(bound_prove, m)?)?;
    m.add_function(wrap_pyfunction!(batchcrypt_codes, m)?)?;
    m.add_function(wrap_pyfunction!(bound_verify, m)?)?;
    m.add_function(wrap_pyfunction!(bound_squared_norm, m)?)?;
    m.add_function(wrap_pyfunction!(bound_norm_prove, m)?)?;
    m.add_function(wrap_pyfunction!(bound_norm_verify, m)?)?;
    m.add_function(wrap_pyfunction!(bound_check_sum, m)?)?;
    m.add("GMP_VERSION", gmp_version())?;
    m.add_function(wrap_pyfunction!(engine, m)?)?;
    psi::register(m)?;
    lattice::register(m)?;
    agg::register(m)?;
    Ok(())
}

#[allow(unsafe_code)]
fn gmp_version() -> String {
    // SAFETY: gmp_version is a static NUL-terminated string owned by libgmp.
    unsafe { std::ffi::CStr::from_ptr(gmp_mpfr_sys::gmp::version).to_string_lossy().into_owned() }
}
