//! `confide._native.LatticeRing`, `LatticeKey`, `LatticeKeySum`: the key-homomorphic RLWE
//! primitives of `confide-lattice` for `confide.crypto.lattice`. Vectors are uint64 numpy arrays;
//! every bulk call releases the GIL. Keys never leave Rust except as Shamir shares.

use crate::errors::invalid;
use confide_lattice::packed::{fold_words, Packing};
use confide_lattice::shamir::{add_shares, reconstruct_key_sum, share_key, MAX_PARTIES, P};
use confide_lattice::{add_assign, os_rng, KeyNtt, KeySum, LatticeError, Params, Ring, SecretKey};
use numpy::{PyArray1, PyReadonlyArray1, PyReadwriteArray1};
use pyo3::prelude::*;
use std::sync::OnceLock;

/// Adds the lattice classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLatticeRing>()?;
    m.add_class::<PyLatticeKey>()?;
    m.add_class::<PyLatticeKeySum>()
}

fn failed(field: &'static str, error: LatticeError) -> PyErr {
    invalid(field, error.to_string())
}

fn seed_of(seed: &[u8]) -> PyResult<[u8; 32]> {
    seed.try_into().map_err(|_| invalid("seed", format!("must be 32 bytes, got {}", seed.len())))
}

fn contiguous<'a, T: numpy::Element>(field: &'static str, array: &'a PyReadonlyArray1<'_, T>) -> PyResult<&'a [T]> {
    array.as_slice().map_err(|_| invalid(field, "array must be contiguous"))
}

/// The ring `Z_q[X]/(X^n + 1)` with plaintext modulus `2^plaintext_bits`.
#[pyclass(name = "LatticeRing", module = "confide._native", frozen)]
pub struct PyLatticeRing {
    ring: Ring,
}

#[pymethods]
impl PyLatticeRing {
    #[new]
    fn new(n: usize, plaintext_bits: u32) -> PyResult<Self> {
        let params = Params::new(n, plaintext_bits).map_err(|e| failed("params", e))?;
        Ok(Self { ring: Ring::new(params) })
    }

    #[getter]
    fn n(&self) -> usize {
        self.ring.params().n
    }

    #[getter]
    fn plaintext_bits(&self) -> u32 {
        self.ring.params().plaintext_bits
    }

    #[getter]
    fn modulus(&self) -> u64 {
        confide_lattice::Q
    }

    /// The most parties whose summed ciphertexts always decrypt correctly.
    fn max_parties(&self) -> usize {
        self.ring.params().max_parties()
    }

    /// Coefficients a vector of ``length`` values takes on the wire (whole blocks of ``n``).
    fn encrypted_length(&self, length: usize) -> usize {
        self.ring.blocks(length) * self.ring.params().n
    }

    /// A fresh secret key (from the operating system's random source).
    fn new_key(&self) -> PyResult<PyLatticeKey> {
        let mut rng = os_rng().map_err(|e| failed("random", e))?;
        Ok(PyLatticeKey { key: self.ring.secret_key(&mut rng), n: self.ring.params().n, ntt: OnceLock::new() })
    }

    /// ``values`` (each under `t`) encrypted under ``key``, block `k` with the public polynomial (seed, k).
    fn encrypt<'py>(
        &self,
        py: Python<'py>,
        seed: &[u8],
        key: &PyLatticeKey,
        values: PyReadonlyArray1<'_, u64>,
    ) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let seed = seed_of(seed)?;
        self.check_key(key.n)?;
        let values = contiguous("values", &values)?;
        let out = py
            .detach(|| {
                let mut rng = os_rng()?;
                self.ring.encrypt_vector(&seed, &key.key, values, &mut rng)
            })
            .map_err(|e| failed("values", e))?;
        Ok(PyArray1::from_vec(py, out))
    }

    /// The first ``length`` values of a sum of ciphertexts, decrypted with the sum of their keys.
    fn decrypt<'py>(
        &self,
        py: Python<'py>,
        seed: &[u8],
        key_sum: &PyLatticeKeySum,
        total: PyReadonlyArray1<'_, u64>,
        length: usize,
    ) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let seed = seed_of(seed)?;
        let total = contiguous("total", &total)?;
        let out = py.detach(|| self.ring.decrypt_vector(&seed, &key_sum.sum, total, length)).map_err(|e| failed("total", e))?;
        Ok(PyArray1::from_vec(py, out))
    }

    /// ``values`` (uint32, each under ``2^bits``) encrypted under ``key`` two to a coefficient mod
    /// ``q`` (the lanes sized for the sum of ``parties``): ``ceil(len / 2)`` uint64 words; block `k`
    /// of the slice with the public polynomial ``(seed, (slice << 24) | k)``.
    #[allow(clippy::too_many_arguments)]
    fn encrypt_packed<'py>(
        &self,
        py: Python<'py>,
        seed: &[u8],
        slice: u32,
        key: &PyLatticeKey,
        values: PyReadonlyArray1<'_, u32>,
        bits: u32,
        parties: usize,
    ) -> PyResult<Bound<'py, PyArray1<u64>>> {
        self.check_key(key.n)?;
        let (seed, packing) = self.packed(seed, bits, parties)?;
        let values = contiguous("values", &values)?;
        let out = py
            .detach(|| {
                let mut rng = os_rng()?;
                let ntt = key.ntt.get_or_init(|| self.ring.key_ntt(&key.key));
                self.ring.encrypt_packed(&seed, slice, ntt, values, &packing, &mut rng)
            })
            .map_err(|e| failed("values", e))?;
        Ok(PyArray1::from_vec(py, out))
    }

    /// The first ``length`` values (each mod ``2^bits``) of a sum of slice ``slice``'s packed
    /// ciphertexts, with the sum of their keys; refused where any word's error is past the bound.
    #[allow(clippy::too_many_arguments)]
    fn decrypt_packed<'py>(
        &self,
        py: Python<'py>,
        seed: &[u8],
        slice: u32,
        key_sum: &PyLatticeKeySum,
        total: PyReadonlyArray1<'_, u64>,
        bits: u32,
        parties: usize,
        length: usize,
    ) -> PyResult<Bound<'py, PyArray1<u32>>> {
        let (seed, packing) = self.packed(seed, bits, parties)?;
        let total = contiguous("total", &total)?;
        let out = py
            .detach(|| self.ring.decrypt_packed(&seed, slice, self.sum_ntt(key_sum)?, total, &packing, length))
            .map_err(|e| failed("total", e))?;
        Ok(PyArray1::from_vec(py, out))
    }

    /// How many words of slice ``slice``'s sum decrypt with an error past the parties' bound under
    /// ``key_sum`` (0: the key sum and the sum agree; a wrong share leaves most of them past it).
    #[allow(clippy::too_many_arguments)]
    fn residual_packed(
        &self,
        py: Python<'_>,
        seed: &[u8],
        slice: u32,
        key_sum: &PyLatticeKeySum,
        total: PyReadonlyArray1<'_, u64>,
        bits: u32,
        parties: usize,
        length: usize,
    ) -> PyResult<usize> {
        let (seed, packing) = self.packed(seed, bits, parties)?;
        let total = contiguous("total", &total)?;
        py.detach(|| self.ring.residual_packed(&seed, slice, self.sum_ntt(key_sum)?, total, &packing, length))
            .map_err(|e| failed("total", e))
    }

    /// Public polynomial ``index`` of the packed form, in the NTT domain mod ``q`` (for known-answer tests).
    fn public_poly_packed<'py>(&self, py: Python<'py>, seed: &[u8], index: u64) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let seed = seed_of(seed)?;
        Ok(PyArray1::from_vec(py, self.ring.public_poly_packed(&seed, index)))
    }

    /// The widest values (bits) the packed lanes carry for a sum of ``parties`` (0: none fit).
    fn packed_message_bits(&self, parties: usize) -> u32 {
        Packing::max_bits(parties, self.ring.params().eta)
    }

    /// The aggregator's fold of packed words: ``acc += b (mod q)`` in place; a word of ``b`` outside
    /// ``[0, q)`` is refused by index and nothing is added.
    #[staticmethod]
    fn fold_packed(py: Python<'_>, mut acc: PyReadwriteArray1<'_, u64>, b: PyReadonlyArray1<'_, u64>) -> PyResult<()> {
        let b = contiguous("b", &b)?;
        let acc = acc.as_slice_mut().map_err(|_| invalid("acc", "array must be contiguous and writable"))?;
        if acc.len() != b.len() {
            return Err(invalid("b", format!("has {} words, the sum {}", b.len(), acc.len())));
        }
        let owned: Vec<u8>;
        let bytes: &[u8] = if cfg!(target_endian = "little") {
            bytemuck::cast_slice(b) // the words as they travel, without a copy
        } else {
            owned = b.iter().flat_map(|w| w.to_le_bytes()).collect();
            &owned
        };
        py.detach(|| fold_words(acc, bytes))
            .map_err(|(index, value)| invalid("b", format!("word {index} is {value}, outside [0, q = {})", confide_lattice::Q)))
    }

    /// The aggregator's fold: ``acc += b (mod q)`` in place.
    #[staticmethod]
    fn fold(py: Python<'_>, mut acc: PyReadwriteArray1<'_, u64>, b: PyReadonlyArray1<'_, u64>) -> PyResult<()> {
        let b = contiguous("b", &b)?;
        let acc = acc.as_slice_mut().map_err(|_| invalid("acc", "array must be contiguous and writable"))?;
        if acc.len() != b.len() {
            return Err(invalid("b", format!("has {} coefficients, the sum {}", b.len(), acc.len())));
        }
        py.detach(|| add_assign(acc, b));
        Ok(())
    }
}

impl PyLatticeRing {
    /// The key sum's NTT, computed once (a key sum of another ring's dimension is refused).
    fn sum_ntt<'a>(&self, key_sum: &'a PyLatticeKeySum) -> Result<&'a KeyNtt, LatticeError> {
        let (got, expected) = (key_sum.sum.coefficients().len(), self.ring.params().n);
        if got != expected {
            return Err(LatticeError::Length { what: "the key sum", got, expected });
        }
        Ok(key_sum.ntt.get_or_init(|| self.ring.key_sum_ntt(&key_sum.sum)))
    }

    /// A packed call's seed and lanes, each refused by name.
    fn packed(&self, seed: &[u8], bits: u32, parties: usize) -> PyResult<([u8; 32], Packing)> {
        let seed = seed_of(seed)?;
        Ok((seed, Packing::new(bits, parties, self.ring.params().eta).map_err(|e| failed("bits", e))?))
    }

    fn check_key(&self, n: usize) -> PyResult<()> {
        if n != self.ring.params().n {
            return Err(invalid("key", format!("belongs to a ring of {n}, this one is {}", self.ring.params().n)));
        }
        Ok(())
    }
}

/// One party's round key: it leaves Rust only as Shamir shares. Not picklable, never printed.
#[pyclass(name = "LatticeKey", module = "confide._native", frozen)]
pub struct PyLatticeKey {
    key: SecretKey,
    n: usize,
    /// Its NTT, computed at the first packed encryption and kept for the round's other slices.
    ntt: OnceLock<KeyNtt>,
}

#[pymethods]
impl PyLatticeKey {
    /// Shares for the points 1..=parties, any ``threshold`` of which rebuild the key (uint16 arrays, in F_65521).
    fn shares<'py>(&self, py: Python<'py>, threshold: usize, parties: usize) -> PyResult<Vec<Bound<'py, PyArray1<u16>>>> {
        let shares = py
            .detach(|| {
                let mut rng = os_rng()?;
                share_key(&self.key, threshold, parties, &mut rng)
            })
            .map_err(|e| failed("threshold", e))?;
        Ok(shares.into_iter().map(|s| PyArray1::from_vec(py, s)).collect())
    }

    fn __repr__(&self) -> String {
        format!("LatticeKey(n={}, secret)", self.n)
    }
}

/// The sum of some parties' round keys, rebuilt from summed shares: it decrypts their summed vector.
#[pyclass(name = "LatticeKeySum", module = "confide._native", frozen)]
pub struct PyLatticeKeySum {
    sum: KeySum,
    /// Its NTT, computed at the first packed decryption and kept for the other slices.
    ntt: OnceLock<KeyNtt>,
}

#[pymethods]
impl PyLatticeKeySum {
    /// From the summed shares of the points ``points`` (1-based, at least the threshold), for ``parties`` keys.
    #[staticmethod]
    fn reconstruct(points: Vec<u64>, shares: Vec<PyReadonlyArray1<'_, u16>>, parties: usize) -> PyResult<Self> {
        let slices = shares.iter().map(|s| contiguous("shares", s)).collect::<PyResult<Vec<&[u16]>>>()?;
        let sum = reconstruct_key_sum(&points, &slices, parties).map_err(|e| failed("shares", e))?;
        Ok(Self { sum, ntt: OnceLock::new() })
    }

    /// ``total += share`` in the share field (a party's share of the key sum), in place.
    #[staticmethod]
    fn add_shares(mut total: PyReadwriteArray1<'_, u16>, share: PyReadonlyArray1<'_, u16>) -> PyResult<()> {
        let share = contiguous("share", &share)?;
        let total = total.as_slice_mut().map_err(|_| invalid("total", "array must be contiguous and writable"))?;
        add_shares(total, share).map_err(|e| failed("share", e))
    }

    /// The share field's prime and the most parties one key sum covers.
    #[classattr]
    const SHARE_PRIME: u32 = P;
    #[classattr]
    const MAX_PARTIES: usize = MAX_PARTIES;

    #[getter]
    fn parties(&self) -> usize {
        self.sum.parties()
    }

    fn __repr__(&self) -> String {
        format!("LatticeKeySum(parties={}, secret)", self.sum.parties())
    }
}
