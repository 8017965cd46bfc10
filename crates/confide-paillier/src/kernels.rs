//! Ciphertext kernels of the vertical-FL protocols (SecureBoost, Hetero LR):
//!
//! * [`EncryptionKey::histogram`]: per-feature gradient histograms, the
//!   homomorphic sum of every sample's ciphertext into its bin.
//! * [`EncryptionKey::fold`]: cipher compression, Σ m_j·2^(width·j) from
//!   `per` ciphertexts by Horner's rule (width squarings per step).
//! * [`EncryptionKey::dot_u64`]: encrypted matrix–vector products
//!   Π_i c_i^(A[j, i]) mod n², by Pippenger's bucket method per output.
//!
//! Every result is a product of powers of the inputs modulo n², which has a
//! unique canonical value, so each engine returns the same bytes as the naive
//! definition (the tests check exactly that).
//!
//! # Engines
//! * **8-lane AVX-512 IFMA** (when the CPU has it): the crate's one 8-lane
//!   multiplier (`crate::ifma`: product-scanning almost-Montgomery multiplication,
//!   two columns per pass, one load of a_i for both, b rolled in registers; a
//!   dedicated squaring), which runs at ~90 % of the CPU's `vpmadd52` throughput,
//!   0.44 µs per lane-product at 4096 bits against 2.6 µs for a GMP Montgomery
//!   product. Each lane owns its own
//!   accumulator table, so lanes never collide; an accumulation gathers the
//!   eight lanes' cells, multiplies, and scatters them back.
//!   - histogram: a *pair* of features shares one pass over the samples into
//!     B² cells (b₁, b₂); both histograms are the row and column products of
//!     that table, which halves the main work once the row count is well above
//!     the ~2·B² products of those marginals. Tasks (pairs, or single features)
//!     run eight to a pass, one lane each, every row broadcast to all lanes; the
//!     leftover tasks run lane = sample (8 rows per product, a private table per
//!     lane, merged at the end) unless one shared pass is cheaper (cost model in
//!     `plan_passes`). Shared passes are split by rows across threads.
//!   - fold: lane = output group (Horner in eight groups at once).
//!   - dot: lane = (output row, window) task, the base broadcast to all lanes.
//! * **GMP** `mpn` Montgomery products (fallback; `CONFIDE_DISABLE_IFMA=1`):
//!   the same algorithms one value at a time, accumulators in Montgomery form,
//!   first arrivals copied rather than multiplied.
//!
//! Measured at 2048 bits, one core (two cores), this machine kind: histogram of
//! N = 100k rows × F = 50 features × 32 bins 1.35 s (0.75 s), ~270 ns per
//! (row, feature) against 3.2–3.8 µs for one `add`; fold of 1600 ciphertexts
//! (width 125, 16 per group) 68 ms (37–41 ms); `dot_u64` N = 100k, F = 50, 20-bit
//! exponents 5.3 s (2.9 s), ~60x the per-entry `mul_scalar` route. Memory: the
//! converted rows (histogram) or bases (dot) take 632 B each at 2048 bits,
//! a pair pass 8·B² entries (5.2 MB at B = 32), a dot task group 8·2^c entries.
//!
//! # Security
//! Results are deterministic functions of the inputs and an empty bin is the
//! literal 1, so whoever knows the input ciphertexts (the key holder that sent
//! them) can test which inputs a result combines: re-randomize before sending
//! results back to that party. Memory access follows the bin indices and
//! exponent digits (the computing party's own data), visible only to a cache
//! attacker on the same machine.
#![allow(unsafe_code)]

use crate::error::{invalid, Error, Result};
use crate::keys::EncryptionKey;
use crate::mont::{pad, Montgomery, Scratch};
use crate::ops::Ciphertext;
use rayon::prelude::*;
use rug::integer::Order;
use rug::Integer;

/// Largest bin count of [`EncryptionKey::histogram`] (bins are `u8`).
pub const MAX_HISTOGRAM_BINS: usize = 256;
/// Largest slot width of [`EncryptionKey::fold`].
pub const MAX_FOLD_WIDTH: u32 = 1024;
/// Largest exponent width of [`EncryptionKey::dot_u64`].
pub const MAX_DOT_BITS: u32 = 64;
/// Largest Pippenger window (2^12 buckets per lane: 26 MiB per 8 tasks at 2048 bits).
const MAX_WINDOW: u32 = 12;

/// Which arithmetic runs a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Engine {
    /// GMP `mpn` Montgomery products, one value at a time.
    Gmp,
    /// 8-lane AVX-512 IFMA.
    #[cfg(target_arch = "x86_64")]
    Ifma,
}

impl Engine {
    /// The fastest engine this CPU runs for `modulus`.
    fn pick(modulus: &Integer) -> Engine {
        #[cfg(target_arch = "x86_64")]
        if crate::ifma::available() && lanes::fits(modulus) {
            return Engine::Ifma;
        }
        let _ = modulus;
        Engine::Gmp
    }
}

/// A histogram request, validated.
struct Histogram<'a> {
    bins: &'a [u8],
    samples: usize,
    features: usize,
    rows: &'a [u32],
    n_bins: usize,
}

impl Histogram<'_> {
    fn bin(&self, feature: usize, row: u32) -> usize {
        usize::from(self.bins[feature * self.samples + row as usize])
    }

    /// The accumulator cell of `row` in a task's table (a pair's: b₁·B + b₂).
    fn cell(&self, task: Task, row: u32) -> usize {
        match task {
            Task::Single(f) => self.bin(f, row),
            Task::Pair(f1, f2) => self.bin(f1, row) * self.n_bins + self.bin(f2, row),
        }
    }
}

/// Cells per lane table of a shared pass: B² if it holds a pair, else B.
#[cfg(target_arch = "x86_64")]
fn shared_cells(job: &Histogram<'_>, tasks: &[Task]) -> usize {
    if tasks.iter().any(|t| matches!(t, Task::Pair(..))) {
        job.n_bins * job.n_bins
    } else {
        job.n_bins
    }
}

/// One pass over the selected rows: a single feature, or a pair sharing B² cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Task {
    Single(usize),
    Pair(usize, usize),
}

/// Largest accumulator table of one pair pass (B² cells; 8 copies on IFMA). At
/// 2048 bits this allows pairs up to B = 115 on IFMA (B = 32: 5.2 MB) and any B on GMP.
const MAX_PAIR_TABLE_BYTES: usize = 64 << 20;

/// Features grouped into passes: pairs where the cost model says they pay and the
/// table fits in `MAX_PAIR_TABLE_BYTES` (`modulus_bits`: of n²). `pairs` overrides
/// the cost model (tests).
fn plan_histogram(job: &Histogram<'_>, engine: Engine, modulus_bits: u32, pairs: Option<bool>) -> Vec<Task> {
    let (rows, bins) = (job.rows.len() as f64, job.n_bins as f64);
    let cell_bytes = match engine {
        Engine::Gmp => (modulus_bits as usize).div_ceil(64) * 8,
        #[cfg(target_arch = "x86_64")]
        Engine::Ifma => (modulus_bits as usize + 2).div_ceil(52) * 8 * lanes::LANES,
    };
    let singles: Vec<Task> = (0..job.features).map(Task::Single).collect();
    let mut paired: Vec<Task> = (0..job.features / 2).map(|k| Task::Pair(2 * k, 2 * k + 1)).collect();
    if job.features % 2 == 1 {
        paired.push(Task::Single(job.features - 1));
    }
    let fits = job.n_bins * job.n_bins * cell_bytes <= MAX_PAIR_TABLE_BYTES;
    let pair_pays = pairs.unwrap_or(
        fits && match engine {
            // Per pair: one pass (rows products) + 2·B² marginal products, against two passes.
            Engine::Gmp => rows + 2.0 * bins * bins < 2.0 * rows,
            #[cfg(target_arch = "x86_64")]
            Engine::Ifma => {
                passes_cost(&plan_passes(&paired, rows, bins), rows, bins) < passes_cost(&plan_passes(&singles, rows, bins), rows, bins)
            }
        },
    );
    if pair_pays {
        paired
    } else {
        singles
    }
}

/// How an IFMA histogram pass uses the eight lanes.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Debug, PartialEq)]
enum Pass {
    /// Up to eight tasks side by side, one lane (and table) each, every row
    /// broadcast to all lanes: `rows` products, nothing to merge.
    Lanes(Vec<Task>),
    /// One task, eight rows per product, a private table per lane: `rows`/8
    /// products, then 7 products per 8 cells to merge the lane tables.
    Rows(Task),
}

/// Cost in 8-lane products: the pass itself plus its outputs (marginals for pairs).
#[cfg(target_arch = "x86_64")]
fn passes_cost(passes: &[Pass], rows: f64, bins: f64) -> f64 {
    let groups = (bins / 8.0).ceil();
    let outputs = |task: &Task| match task {
        Task::Single(_) => groups,
        Task::Pair(..) => 2.0 * bins.max(1.0) * groups,
    };
    let cells = |task: &Task| match task {
        Task::Single(_) => bins,
        Task::Pair(..) => bins * bins,
    };
    passes
        .iter()
        .map(|pass| match pass {
            Pass::Lanes(tasks) => rows + tasks.iter().map(outputs).sum::<f64>(),
            Pass::Rows(task) => rows / 8.0 + 7.0 * (cells(task) / 8.0).ceil() + outputs(task),
        })
        .sum()
}

/// Full groups of eight tasks share passes lane by lane; the rest run lane = row
/// unless one shared pass is cheaper.
#[cfg(target_arch = "x86_64")]
fn plan_passes(tasks: &[Task], rows: f64, bins: f64) -> Vec<Pass> {
    let mut passes: Vec<Pass> = Vec::new();
    for group in tasks.chunks(lanes::LANES) {
        let shared = vec![Pass::Lanes(group.to_vec())];
        let alone: Vec<Pass> = group.iter().map(|&t| Pass::Rows(t)).collect();
        if group.len() == lanes::LANES || passes_cost(&shared, rows, bins) < passes_cost(&alone, rows, bins) {
            passes.extend(shared);
        } else {
            passes.extend(alone);
        }
    }
    passes
}

/// Pippenger window c for `count` bases and `bits`-bit exponents: minimises
/// ⌈bits/c⌉·(count + 2^(c+1)) (bucket products plus running-sum aggregation).
fn dot_window(count: usize, bits: u32) -> u32 {
    let cost = |c: u32| u64::from(bits.div_ceil(c)) * (count as u64 + (2u64 << c));
    (1..=bits.min(MAX_WINDOW)).min_by_key(|&c| (cost(c), c)).unwrap_or(1)
}

/// Exponent matrices of the dot kernels: 1 ≤ bits ≤ 64, shape (rows, columns),
/// every entry below 2^bits (the error names the first entry that is not).
fn check_exponents(matrix: &[u64], rows: usize, columns: usize, bits: u32, what: &'static str) -> Result<()> {
    if !(1..=MAX_DOT_BITS).contains(&bits) {
        return Err(invalid("bits", format!("must be in 1..={MAX_DOT_BITS}, got {bits}")));
    }
    let expected = rows.checked_mul(columns).ok_or_else(|| invalid("matrix", "shape overflows"))?;
    if matrix.len() != expected {
        return Err(Error::LengthMismatch { what, expected, found: matrix.len() });
    }
    if bits < 64 {
        if let Some(position) = matrix.par_iter().position_first(|&v| v >> bits != 0) {
            let (row, column) = (position / columns, position % columns);
            return Err(invalid(
                "matrix",
                format!("matrix[{row}, {column}] = {} must be < 2^bits = 2^{bits} (row {row}, column {column})", matrix[position]),
            ));
        }
    }
    Ok(())
}

/// Straus window for [`EncryptionKey::dot_groups_u64`]: minimises the table
/// products K·(2^c − 2) plus the digit products F·K·⌈bits/c⌉ (squarings do not depend on c).
fn straus_window(group: usize, rows: usize, bits: u32) -> u32 {
    let cost = |c: u32| (group as u64) * ((1u64 << c) - 2) + (rows * group) as u64 * u64::from(bits.div_ceil(c));
    (1..=bits.clamp(1, 8)).min_by_key(|&c| (cost(c), c)).unwrap_or(1)
}

/// Digit `window` (c bits wide) of an exponent.
fn digit(exponent: u64, window: u32, c: u32) -> usize {
    let shift = window * c;
    if shift >= 64 {
        return 0;
    }
    ((exponent >> shift) & ((1u64 << c) - 1)) as usize
}

impl EncryptionKey {
    /// Gradient histograms (SecureBoost): `bins` is a feature-major (F, N) matrix
    /// of bin indices with N = `ciphertexts.len()`; the result has F·`n_bins`
    /// ciphertexts, `out[f·n_bins + b]` = ⊕ of `ciphertexts[r]` over the `rows`
    /// r with `bins[f, r] == b` (a row listed twice counts twice). An empty bin
    /// is the ciphertext 1, a valid encryption of 0. Runs on the current rayon pool.
    ///
    /// # Errors
    /// `InvalidParameter` for `n_bins` outside 1..=256, a row index ≥ N, or a bin
    /// value ≥ `n_bins` (naming the feature and row); `LengthMismatch` when
    /// `bins.len() != features·N`.
    pub fn histogram(
        &self,
        ciphertexts: &[Ciphertext],
        bins: &[u8],
        features: usize,
        rows: &[u32],
        n_bins: usize,
    ) -> Result<Vec<Ciphertext>> {
        self.histogram_on(Engine::pick(self.n_squared()), None, ciphertexts, bins, features, rows, n_bins)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn histogram_on(
        &self,
        engine: Engine,
        pairs: Option<bool>,
        ciphertexts: &[Ciphertext],
        bins: &[u8],
        features: usize,
        rows: &[u32],
        n_bins: usize,
    ) -> Result<Vec<Ciphertext>> {
        if !(1..=MAX_HISTOGRAM_BINS).contains(&n_bins) {
            return Err(invalid("n_bins", format!("must be in 1..={MAX_HISTOGRAM_BINS}, got {n_bins}")));
        }
        let samples = ciphertexts.len();
        let expected = features.checked_mul(samples).ok_or_else(|| invalid("bins", "shape overflows"))?;
        if bins.len() != expected {
            return Err(Error::LengthMismatch { what: "bins (features x ciphertexts)", expected, found: bins.len() });
        }
        if let Some(position) = rows.par_iter().position_first(|&r| r as usize >= samples) {
            return Err(invalid("rows", format!("rows[{position}] = {} must be < {samples} (the number of ciphertexts)", rows[position])));
        }
        let job = Histogram { bins, samples, features, rows, n_bins };
        let bad = (0..features).into_par_iter().find_map_first(|f| rows.iter().find(|&&r| job.bin(f, r) >= n_bins).map(|&r| (f, r)));
        if let Some((feature, row)) = bad {
            return Err(invalid(
                "bins",
                format!("bins[{feature}, {row}] = {} must be < n_bins = {n_bins} (feature {feature}, row {row})", job.bin(feature, row)),
            ));
        }
        let tasks = plan_histogram(&job, engine, self.n_squared().significant_bits(), pairs);
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let results: Vec<Vec<(usize, Vec<Integer>)>> = match engine {
            Engine::Gmp => {
                let mont = self.montgomery();
                let converted = gmp_convert(mont, ciphertexts, rows);
                tasks.par_iter().map(|&task| gmp_histogram_task(mont, &job, &converted, task)).collect()
            }
            #[cfg(target_arch = "x86_64")]
            Engine::Ifma => {
                let amm = lanes::IfmaModulus::new(self.n_squared()).ok_or_else(|| invalid("engine", "modulus too large for IFMA"))?;
                let converted = amm.convert_rows(ciphertexts, rows);
                amm.histogram(&job, &converted, &plan_passes(&tasks, rows.len() as f64, n_bins as f64))
            }
        };
        let mut out = vec![Ciphertext(Integer::from(1)); features * n_bins];
        for (feature, values) in results.into_iter().flatten() {
            for (b, value) in values.into_iter().enumerate() {
                out[feature * n_bins + b] = Ciphertext(value);
            }
        }
        Ok(out)
    }

    /// Cipher compression: each group of `per` consecutive ciphertexts
    /// c_0 … c_{k−1} (the last group may be shorter) becomes one ciphertext of
    /// Σ_j m_j·2^(width·j), c_0 in the least significant slot, computed by Horner:
    /// C = c_{k−1}; C = C^(2^width) ⊕ c_j for j = k−2 … 0. Output length ⌈len/per⌉.
    /// Slots do not carry into each other only if every m_j < 2^width (the caller's bound).
    ///
    /// # Errors
    /// `InvalidParameter` unless 1 ≤ width ≤ 1024, per ≥ 1 and per·width < key bits − 1.
    pub fn fold(&self, ciphertexts: &[Ciphertext], width: u32, per: usize) -> Result<Vec<Ciphertext>> {
        self.fold_on(Engine::pick(self.n_squared()), ciphertexts, width, per)
    }

    pub(crate) fn fold_on(&self, engine: Engine, ciphertexts: &[Ciphertext], width: u32, per: usize) -> Result<Vec<Ciphertext>> {
        if !(1..=MAX_FOLD_WIDTH).contains(&width) {
            return Err(invalid("width", format!("must be in 1..={MAX_FOLD_WIDTH}, got {width}")));
        }
        if per == 0 {
            return Err(invalid("per", "must be at least 1"));
        }
        let limit = u64::from(self.bits()) - 1;
        if (per as u64).saturating_mul(u64::from(width)) >= limit {
            return Err(invalid(
                "per",
                format!("per * width = {per} * {width} must be < key bits - 1 = {limit} (fewer or narrower slots)"),
            ));
        }
        let groups: Vec<&[Ciphertext]> = ciphertexts.chunks(per).collect();
        let values: Vec<Integer> = match engine {
            Engine::Gmp => {
                let mont = self.montgomery();
                groups.par_iter().map(|group| gmp_fold(mont, group, width)).collect()
            }
            #[cfg(target_arch = "x86_64")]
            Engine::Ifma => {
                let amm = lanes::IfmaModulus::new(self.n_squared()).ok_or_else(|| invalid("engine", "modulus too large for IFMA"))?;
                // With fewer than two groups the lanes would idle: GMP is faster for one chain.
                if groups.len() < 2 {
                    let mont = self.montgomery();
                    groups.par_iter().map(|group| gmp_fold(mont, group, width)).collect()
                } else {
                    let chunks: Vec<Vec<Integer>> =
                        groups.par_chunks(lanes::LANES).map(|eight| amm.fold_lanes(eight, per, width)).collect();
                    chunks.into_iter().flatten().collect()
                }
            }
        };
        Ok(values.into_iter().map(Ciphertext).collect())
    }

    /// Encrypted matrix–vector product: `matrix` is a row-major (F, N) matrix of
    /// unsigned exponents below 2^`bits`, N = `ciphertexts.len()`; the result has F
    /// ciphertexts, out[j] = Π_i c_i^(matrix[j, i]) mod n², whose plaintext is
    /// Σ_i matrix[j, i]·m_i mod n. An all-zero row gives the ciphertext 1.
    /// Pippenger's bucket method per output (window from N and `bits`).
    ///
    /// # Errors
    /// `InvalidParameter` unless 1 ≤ bits ≤ 64, or for an entry ≥ 2^bits (naming
    /// its row and column); `LengthMismatch` when `matrix.len() != rows·N`.
    pub fn dot_u64(&self, ciphertexts: &[Ciphertext], matrix: &[u64], rows: usize, bits: u32) -> Result<Vec<Ciphertext>> {
        self.dot_u64_on(Engine::pick(self.n_squared()), ciphertexts, matrix, rows, bits)
    }

    pub(crate) fn dot_u64_on(
        &self,
        engine: Engine,
        ciphertexts: &[Ciphertext],
        matrix: &[u64],
        rows: usize,
        bits: u32,
    ) -> Result<Vec<Ciphertext>> {
        let count = ciphertexts.len();
        check_exponents(matrix, rows, count, bits, "matrix (rows x ciphertexts)")?;
        if count == 0 {
            return Ok(vec![Ciphertext(Integer::from(1)); rows]);
        }
        let window = dot_window(count, bits);
        let values: Vec<Integer> = match engine {
            Engine::Gmp => {
                let mont = self.montgomery();
                let all: Vec<u32> = (0..count as u32).collect();
                let bases = gmp_convert(mont, ciphertexts, &all);
                matrix.par_chunks(count).map(|exponents| gmp_dot_row(mont, &bases, exponents, bits, window)).collect()
            }
            #[cfg(target_arch = "x86_64")]
            Engine::Ifma => {
                let amm = lanes::IfmaModulus::new(self.n_squared()).ok_or_else(|| invalid("engine", "modulus too large for IFMA"))?;
                amm.dot(ciphertexts, matrix, rows, bits, window)
            }
        };
        Ok(values.into_iter().map(Ciphertext).collect())
    }

    /// The same `(F, K)` exponent matrix applied to many groups of K ciphertexts
    /// (`ciphertexts.len()` = G·K): `out[g·F + j]` = Π_k c_(g·K+k)^(matrix[j, k]) mod n².
    /// For small K and many groups, where one Pippenger call per group would pay its
    /// set-up G times (Hetero NN's batch-packed products). Straus per output with
    /// shared digit tables; on IFMA eight groups share each product (lane = group:
    /// the exponent digits are the same in every lane).
    ///
    /// # Errors
    /// As [`EncryptionKey::dot_u64`]; `LengthMismatch` unless K divides the ciphertext count.
    pub fn dot_groups_u64(
        &self,
        ciphertexts: &[Ciphertext],
        group: usize,
        matrix: &[u64],
        rows: usize,
        bits: u32,
    ) -> Result<Vec<Ciphertext>> {
        self.dot_groups_u64_on(Engine::pick(self.n_squared()), ciphertexts, group, matrix, rows, bits)
    }

    pub(crate) fn dot_groups_u64_on(
        &self,
        engine: Engine,
        ciphertexts: &[Ciphertext],
        group: usize,
        matrix: &[u64],
        rows: usize,
        bits: u32,
    ) -> Result<Vec<Ciphertext>> {
        if group == 0 {
            return Err(invalid("group", "must be at least 1"));
        }
        if !ciphertexts.len().is_multiple_of(group) {
            return Err(Error::LengthMismatch {
                what: "ciphertexts (a multiple of the group size)",
                expected: ciphertexts.len().div_ceil(group) * group,
                found: ciphertexts.len(),
            });
        }
        check_exponents(matrix, rows, group, bits, "matrix (rows x group)")?;
        let groups = ciphertexts.len() / group;
        if groups == 0 || rows == 0 {
            return Ok(Vec::new());
        }
        let values: Vec<Integer> = match engine {
            Engine::Gmp => {
                let mont = self.montgomery();
                let window = dot_window(group, bits);
                (0..groups)
                    .into_par_iter()
                    .flat_map_iter(|g| {
                        let ids: Vec<u32> = (g * group..(g + 1) * group).map(|i| i as u32).collect();
                        let bases = gmp_convert(mont, ciphertexts, &ids);
                        matrix.chunks(group).map(|exponents| gmp_dot_row(mont, &bases, exponents, bits, window)).collect::<Vec<_>>()
                    })
                    .collect()
            }
            #[cfg(target_arch = "x86_64")]
            Engine::Ifma => {
                let amm = lanes::IfmaModulus::new(self.n_squared()).ok_or_else(|| invalid("engine", "modulus too large for IFMA"))?;
                amm.dot_groups(ciphertexts, group, matrix, bits, straus_window(group, rows, bits))
            }
        };
        Ok(values.into_iter().map(Ciphertext).collect())
    }
}

// ---------------------------------------------------------------------------
// GMP engine: Montgomery form of n² with `mpn` products.

/// The listed ciphertexts in Montgomery form, `limbs` words each, in `rows` order.
fn gmp_convert(mont: &Montgomery, ciphertexts: &[Ciphertext], rows: &[u32]) -> Vec<u64> {
    let limbs = mont.limbs();
    let mut out = vec![0u64; rows.len() * limbs];
    out.par_chunks_mut(limbs)
        .zip(rows.par_iter())
        .for_each_init(|| mont.scratch(), |scratch, (slot, &r)| mont.to_mont(&ciphertexts[r as usize].0, slot, scratch));
    out
}

/// Montgomery → normal form: a·1·R⁻¹.
fn gmp_leave(mont: &Montgomery, value: &[u64], scratch: &mut Scratch) -> Integer {
    let limbs = mont.limbs();
    let unit = pad(&Integer::from(1), limbs);
    let mut out = vec![0u64; limbs];
    mont.mul(value, &unit, &mut out, scratch);
    Integer::from_digits(&out, Order::Lsf)
}

/// Cells in Montgomery form with "touched" flags: the first value is copied,
/// later ones multiplied in.
struct GmpCells {
    limbs: usize,
    values: Vec<u64>,
    touched: Vec<bool>,
    tmp: Vec<u64>,
}

impl GmpCells {
    fn new(cells: usize, limbs: usize) -> Self {
        GmpCells { limbs, values: vec![0; cells * limbs], touched: vec![false; cells], tmp: vec![0; limbs] }
    }

    fn clear(&mut self) {
        self.touched.fill(false);
    }

    fn add(&mut self, mont: &Montgomery, cell: usize, value: &[u64], scratch: &mut Scratch) {
        let slot = &mut self.values[cell * self.limbs..(cell + 1) * self.limbs];
        if self.touched[cell] {
            mont.mul(slot, value, &mut self.tmp, scratch);
            slot.copy_from_slice(&self.tmp);
        } else {
            slot.copy_from_slice(value);
            self.touched[cell] = true;
        }
    }

    fn get(&self, cell: usize) -> Option<&[u64]> {
        self.touched[cell].then(|| &self.values[cell * self.limbs..(cell + 1) * self.limbs])
    }
}

/// Running product of Montgomery values; `None` = empty (the value 1).
struct GmpProduct {
    value: Option<Vec<u64>>,
    tmp: Vec<u64>,
}

impl GmpProduct {
    fn new(limbs: usize) -> Self {
        GmpProduct { value: None, tmp: vec![0; limbs] }
    }

    fn mul(&mut self, mont: &Montgomery, factor: &[u64], scratch: &mut Scratch) {
        match &mut self.value {
            Some(value) => {
                mont.mul(value, factor, &mut self.tmp, scratch);
                std::mem::swap(value, &mut self.tmp);
            }
            None => self.value = Some(factor.to_vec()),
        }
    }

    fn square(&mut self, mont: &Montgomery, scratch: &mut Scratch) {
        if let Some(value) = &mut self.value {
            mont.mul(value, value, &mut self.tmp, scratch);
            std::mem::swap(value, &mut self.tmp);
        }
    }

    fn finish(&self, mont: &Montgomery, scratch: &mut Scratch) -> Integer {
        self.value.as_ref().map_or_else(|| Integer::from(1), |v| gmp_leave(mont, v, scratch))
    }
}

fn gmp_histogram_task(mont: &Montgomery, job: &Histogram<'_>, converted: &[u64], task: Task) -> Vec<(usize, Vec<Integer>)> {
    let limbs = mont.limbs();
    let mut scratch = mont.scratch();
    let b = job.n_bins;
    match task {
        Task::Single(f) => {
            let mut cells = GmpCells::new(b, limbs);
            for (position, &r) in job.rows.iter().enumerate() {
                cells.add(mont, job.bin(f, r), &converted[position * limbs..(position + 1) * limbs], &mut scratch);
            }
            let values =
                (0..b).map(|cell| cells.get(cell).map_or_else(|| Integer::from(1), |v| gmp_leave(mont, v, &mut scratch))).collect();
            vec![(f, values)]
        }
        Task::Pair(f1, f2) => {
            let mut cells = GmpCells::new(b * b, limbs);
            for (position, &r) in job.rows.iter().enumerate() {
                let cell = job.cell(task, r);
                cells.add(mont, cell, &converted[position * limbs..(position + 1) * limbs], &mut scratch);
            }
            let marginal = |scratch: &mut Scratch, cell_of: &dyn Fn(usize, usize) -> usize| -> Vec<Integer> {
                (0..b)
                    .map(|outer| {
                        let mut product = GmpProduct::new(limbs);
                        for inner in 0..b {
                            if let Some(v) = cells.get(cell_of(outer, inner)) {
                                product.mul(mont, v, scratch);
                            }
                        }
                        product.finish(mont, scratch)
                    })
                    .collect()
            };
            let first = marginal(&mut scratch, &|b1, b2| b1 * b + b2);
            let second = marginal(&mut scratch, &|b2, b1| b1 * b + b2);
            vec![(f1, first), (f2, second)]
        }
    }
}

fn gmp_fold(mont: &Montgomery, group: &[Ciphertext], width: u32) -> Integer {
    let limbs = mont.limbs();
    let mut scratch = mont.scratch();
    let mut element = vec![0u64; limbs];
    let mut acc = GmpProduct::new(limbs);
    for (j, c) in group.iter().enumerate().rev() {
        if j + 1 < group.len() {
            for _ in 0..width {
                acc.square(mont, &mut scratch);
            }
        }
        mont.to_mont(&c.0, &mut element, &mut scratch);
        acc.mul(mont, &element, &mut scratch);
    }
    acc.finish(mont, &mut scratch)
}

/// One output of the bucket method: for each c-bit window (most significant
/// first), bucket the bases by digit, aggregate Π_d B_d^d by running products,
/// and combine windows by Horner (c squarings each).
fn gmp_dot_row(mont: &Montgomery, bases: &[u64], exponents: &[u64], bits: u32, c: u32) -> Integer {
    let limbs = mont.limbs();
    let mut scratch = mont.scratch();
    let buckets = 1usize << c;
    let mut cells = GmpCells::new(buckets, limbs);
    let mut result = GmpProduct::new(limbs);
    for window in (0..bits.div_ceil(c)).rev() {
        for _ in 0..c {
            result.square(mont, &mut scratch);
        }
        cells.clear();
        for (i, &e) in exponents.iter().enumerate() {
            let d = digit(e, window, c);
            if d != 0 {
                cells.add(mont, d, &bases[i * limbs..(i + 1) * limbs], &mut scratch);
            }
        }
        let mut running = GmpProduct::new(limbs);
        let mut total = GmpProduct::new(limbs);
        for d in (1..buckets).rev() {
            if let Some(v) = cells.get(d) {
                running.mul(mont, v, &mut scratch);
            }
            if let Some(r) = &running.value {
                let r = r.clone();
                total.mul(mont, &r, &mut scratch);
            }
        }
        if let Some(t) = &total.value {
            let t = t.clone();
            result.mul(mont, &t, &mut scratch);
        }
    }
    result.finish(mont, &mut scratch)
}

// ---------------------------------------------------------------------------
// IFMA engine.

#[cfg(target_arch = "x86_64")]
mod lanes {
    //! The kernels on the 8-lane almost-Montgomery arithmetic of `crate::ifma`
    //! (radix 2^52, digit-interleaved: vector i holds digit i of the eight lanes;
    //! R = 2^(52·D) > 4M, values in [0, 2M)).

    use super::{digit, shared_cells, Histogram, Pass, Task};
    pub(super) use crate::ifma::{fits, IfmaModulus, LANES};
    use crate::ops::Ciphertext;
    use rayon::prelude::*;
    use rug::Integer;

    /// The kernels, on the crate's one 8-lane multiplier (`crate::ifma`).
    impl IfmaModulus {
        /// A table of `cells` D-digit entries per lane, every entry one.
        fn lane_tables(&self, cells: usize) -> Vec<u64> {
            let mut table = Vec::with_capacity(LANES * cells * self.digits);
            for _ in 0..LANES * cells {
                table.extend_from_slice(&self.one);
            }
            table
        }

        /// The selected rows in Montgomery form, eight per interleaved group, in
        /// `rows` order (a short last group is padded with one).
        pub(super) fn convert_rows(&self, ciphertexts: &[Ciphertext], rows: &[u32]) -> Vec<u64> {
            let width = self.width();
            let mut out = vec![0u64; rows.len().div_ceil(LANES) * width];
            out.par_chunks_mut(width).zip(rows.par_chunks(LANES)).for_each(|(slot, group)| {
                let values: Vec<&Integer> = group.iter().map(|&r| &ciphertexts[r as usize].0).collect();
                self.enter(&values, slot);
            });
            out
        }

        /// Product over the eight lane tables of `cells` cells; calls `emit` per
        /// group of eight consecutive cells with the interleaved products.
        fn merge_lanes(&self, table: &[u64], cells: usize, mut emit: impl FnMut(usize, &[u64])) {
            let d = self.digits;
            let mut acc = self.zero_lanes();
            let mut operand = self.zero_lanes();
            let mut tmp = self.zero_lanes();
            for first in (0..cells).step_by(LANES) {
                let source = |lane_table: usize, k: usize| -> &[u64] {
                    let cell = first + k;
                    if cell < cells {
                        let offset = (lane_table * cells + cell) * d;
                        &table[offset..offset + d]
                    } else {
                        &self.one
                    }
                };
                self.gather(std::array::from_fn(|k| source(0, k)), &mut acc);
                for lane_table in 1..LANES {
                    self.gather(std::array::from_fn(|k| source(lane_table, k)), &mut operand);
                    self.mul(&acc, &operand, &mut tmp);
                    std::mem::swap(&mut acc, &mut tmp);
                }
                emit(first, &acc);
            }
        }

        /// Runs the planned passes. A shared (lane = task) pass is split into row
        /// ranges so that two units per thread exist; their tables are multiplied
        /// together cell by cell afterwards.
        pub(super) fn histogram(&self, job: &Histogram<'_>, converted: &[u64], passes: &[Pass]) -> Vec<Vec<(usize, Vec<Integer>)>> {
            let shared: Vec<&[Task]> = passes.iter().filter_map(|p| if let Pass::Lanes(t) = p { Some(&t[..]) } else { None }).collect();
            let alone: Vec<Task> = passes.iter().filter_map(|p| if let Pass::Rows(t) = p { Some(*t) } else { None }).collect();
            let rows = job.rows.len();
            let splits =
                if shared.is_empty() { 1 } else { (2 * rayon::current_num_threads()).div_ceil(shared.len()).min(rows / 4096).max(1) };
            let chunk = rows.div_ceil(splits).max(1);
            enum Unit {
                Shared(usize, std::ops::Range<usize>),
                Alone(Task),
            }
            enum Done {
                Table(usize, Vec<u64>),
                Outputs(Vec<(usize, Vec<Integer>)>),
            }
            let mut units: Vec<Unit> = Vec::new();
            for (g, _) in shared.iter().enumerate() {
                units.extend((0..splits).map(|s| Unit::Shared(g, (s * chunk).min(rows)..((s + 1) * chunk).min(rows))));
            }
            units.extend(alone.iter().map(|&t| Unit::Alone(t)));
            let done: Vec<Done> = units
                .into_par_iter()
                .map(|unit| match unit {
                    Unit::Shared(g, range) => Done::Table(g, self.shared_pass(job, converted, shared[g], range)),
                    Unit::Alone(task) => Done::Outputs(self.histogram_task(job, converted, task)),
                })
                .collect();
            let mut tables: Vec<Vec<Vec<u64>>> = vec![Vec::new(); shared.len()];
            let mut out = Vec::new();
            for item in done {
                match item {
                    Done::Table(g, table) => tables[g].push(table),
                    Done::Outputs(outputs) => out.push(outputs),
                }
            }
            let shared_out: Vec<Vec<(usize, Vec<Integer>)>> = tables
                .into_par_iter()
                .zip(shared.par_iter())
                .map(|(parts, tasks)| {
                    let cells = shared_cells(job, tasks);
                    let mut parts = parts.into_iter();
                    let mut table = parts.next().unwrap_or_else(|| self.lane_tables(cells));
                    for part in parts {
                        self.multiply_tables(&mut table, &part, cells);
                    }
                    self.shared_outputs(job, tasks, &table, cells)
                })
                .collect();
            out.extend(shared_out);
            out
        }

        /// Rows `range` of a shared pass: lane l accumulates task l into its own
        /// table, the row's value broadcast to all lanes (padding lanes: cell 0).
        fn shared_pass(&self, job: &Histogram<'_>, converted: &[u64], tasks: &[Task], range: std::ops::Range<usize>) -> Vec<u64> {
            let d = self.digits;
            let width = self.width();
            let cells = shared_cells(job, tasks);
            let mut table = self.lane_tables(cells);
            let mut gathered = self.zero_lanes();
            let mut product = self.zero_lanes();
            let offsets_of = |position: usize| -> [usize; LANES] {
                let r = job.rows[position];
                std::array::from_fn(|lane| (lane * cells + tasks.get(lane).map_or(0, |&t| job.cell(t, r))) * d)
            };
            let mut next = (!range.is_empty()).then(|| offsets_of(range.start));
            for position in range.clone() {
                let Some(offsets) = next else { break };
                next = (position + 1 < range.end).then(|| offsets_of(position + 1));
                if let Some(ahead) = &next {
                    self.prefetch(&table, ahead);
                }
                self.gather(std::array::from_fn(|lane| &table[offsets[lane]..offsets[lane] + d]), &mut gathered);
                let block = &converted[(position / LANES) * width..(position / LANES + 1) * width];
                self.mul_broadcast_lane(&gathered, block, position % LANES, &mut product);
                self.scatter(&product, &mut table, &offsets);
            }
            table
        }

        /// table[l][c] ← table[l][c]·other[l][c] for every lane and cell.
        fn multiply_tables(&self, table: &mut [u64], other: &[u64], cells: usize) {
            let d = self.digits;
            let mut left = self.zero_lanes();
            let mut right = self.zero_lanes();
            let mut product = self.zero_lanes();
            for cell in 0..cells {
                let offsets: [usize; LANES] = std::array::from_fn(|lane| (lane * cells + cell) * d);
                self.gather(std::array::from_fn(|lane| &table[offsets[lane]..offsets[lane] + d]), &mut left);
                self.gather(std::array::from_fn(|lane| &other[offsets[lane]..offsets[lane] + d]), &mut right);
                self.mul(&left, &right, &mut product);
                self.scatter(&product, table, &offsets);
            }
        }

        /// Histograms of a shared pass: lane l's table is task l's (pair: B² cells).
        fn shared_outputs(&self, job: &Histogram<'_>, tasks: &[Task], table: &[u64], cells: usize) -> Vec<(usize, Vec<Integer>)> {
            let (d, b) = (self.digits, job.n_bins);
            let mut out = Vec::new();
            for (lane, &task) in tasks.iter().enumerate() {
                let cell = |index: usize| &table[(lane * cells + index) * d..(lane * cells + index + 1) * d];
                match task {
                    Task::Single(f) => out.push((f, self.marginal(b, 1, &|outer, _| cell(outer)))),
                    Task::Pair(f1, f2) => {
                        out.push((f1, self.marginal(b, b, &|outer, inner| cell(outer * b + inner))));
                        out.push((f2, self.marginal(b, b, &|outer, inner| cell(inner * b + outer))));
                    }
                }
            }
            out
        }

        /// One histogram pass (lane = sample, a private table per lane).
        pub(super) fn histogram_task(&self, job: &Histogram<'_>, converted: &[u64], task: Task) -> Vec<(usize, Vec<Integer>)> {
            let d = self.digits;
            let b = job.n_bins;
            let cells = match task {
                Task::Single(_) => b,
                Task::Pair(..) => b * b,
            };
            let cell_of = |r: u32| job.cell(task, r);
            let mut table = self.lane_tables(cells);
            let mut gathered = self.zero_lanes();
            let mut product = self.zero_lanes();
            // Padding lanes multiply cell 0 by one.
            let offsets_of = |group: &[u32]| -> [usize; LANES] {
                std::array::from_fn(|lane| (lane * cells + group.get(lane).map_or(0, |&r| cell_of(r))) * d)
            };
            let mut groups = job.rows.chunks(LANES).zip(converted.chunks(self.width())).peekable();
            while let Some((group, x)) = groups.next() {
                let offsets = offsets_of(group);
                // The tables outgrow L2 (pairs: 8·B² cells): fetch the next cells during this product.
                if let Some((next, _)) = groups.peek() {
                    self.prefetch(&table, &offsets_of(next));
                }
                self.gather(std::array::from_fn(|lane| &table[offsets[lane]..offsets[lane] + d]), &mut gathered);
                self.mul(&gathered, x, &mut product);
                self.scatter(&product, &mut table, &offsets);
            }
            match task {
                Task::Single(f) => {
                    let mut values = Vec::with_capacity(b);
                    self.merge_lanes(&table, cells, |first, lanes| values.extend(self.leave(lanes, b - first)));
                    vec![(f, values)]
                }
                Task::Pair(f1, f2) => {
                    let mut merged = vec![0u64; cells * d];
                    self.merge_lanes(&table, cells, |first, lanes| {
                        for k in 0..LANES.min(cells - first) {
                            for i in 0..d {
                                merged[(first + k) * d + i] = lanes[i * LANES + k];
                            }
                        }
                    });
                    let cell = |index: usize| &merged[index * d..(index + 1) * d];
                    let first = self.marginal(b, b, &|outer, inner| cell(outer * b + inner));
                    let second = self.marginal(b, b, &|outer, inner| cell(inner * b + outer));
                    vec![(f1, first), (f2, second)]
                }
            }
        }

        /// out[outer] = Π_{inner < inners} source(outer, inner) for outer < b, eight
        /// outers per product, out of Montgomery form.
        fn marginal<'a>(&'a self, b: usize, inners: usize, source: &dyn Fn(usize, usize) -> &'a [u64]) -> Vec<Integer> {
            let mut acc = self.zero_lanes();
            let mut operand = self.zero_lanes();
            let mut tmp = self.zero_lanes();
            let mut out = Vec::with_capacity(b);
            for first in (0..b).step_by(LANES) {
                let pick = |inner: usize| -> [&[u64]; LANES] {
                    std::array::from_fn(|k| if first + k < b { source(first + k, inner) } else { &self.one[..] })
                };
                self.gather(pick(0), &mut acc);
                for inner in 1..inners {
                    self.gather(pick(inner), &mut operand);
                    self.mul(&acc, &operand, &mut tmp);
                    std::mem::swap(&mut acc, &mut tmp);
                }
                out.extend(self.leave(&acc, b - first));
            }
            out
        }

        /// Horner folds of up to eight groups at once (lane = group; a missing
        /// element is one, so shorter groups come out right).
        pub(super) fn fold_lanes(&self, groups: &[&[Ciphertext]], per: usize, width: u32) -> Vec<Integer> {
            let one = Integer::from(1);
            let mut acc = self.one_lanes.clone();
            let mut element = self.zero_lanes();
            let mut tmp = self.zero_lanes();
            let mut started = false;
            for j in (0..per).rev() {
                let values: Vec<&Integer> = groups.iter().map(|g| g.get(j).map_or(&one, |c| &c.0)).collect();
                if !started {
                    // Slots above every group's length: acc is still one in every lane.
                    if groups.iter().all(|g| g.len() <= j) {
                        continue;
                    }
                    self.enter(&values, &mut acc);
                    started = true;
                    continue;
                }
                for _ in 0..width {
                    self.square(&acc, &mut tmp);
                    std::mem::swap(&mut acc, &mut tmp);
                }
                self.enter(&values, &mut element);
                self.mul(&acc, &element, &mut tmp);
                std::mem::swap(&mut acc, &mut tmp);
            }
            self.leave(&acc, groups.len())
        }

        /// Bucket-method products of `rows` outputs (see `EncryptionKey::dot_u64`).
        /// Lane = (row, window) task; each lane buckets into its own table, the base
        /// broadcast to all lanes; bucket 0 takes zero digits and is never read.
        pub(super) fn dot(&self, ciphertexts: &[Ciphertext], matrix: &[u64], rows: usize, bits: u32, c: u32) -> Vec<Integer> {
            let d = self.digits;
            let count = ciphertexts.len();
            let windows = bits.div_ceil(c) as usize;
            // Bases in Montgomery form, one D-digit run each.
            let mut bases = vec![0u64; count * d];
            bases.par_chunks_mut(LANES * d).zip(ciphertexts.par_chunks(LANES)).for_each(|(slot, group)| {
                let mut lanes = self.zero_lanes();
                self.enter(&group.iter().map(|c| &c.0).collect::<Vec<_>>(), &mut lanes);
                for (k, base) in slot.chunks_mut(d).enumerate() {
                    for (i, digit) in base.iter_mut().enumerate() {
                        *digit = lanes[i * LANES + k];
                    }
                }
            });
            let tasks: Vec<(usize, usize)> = (0..rows).flat_map(|j| (0..windows).map(move |w| (j, w))).collect();
            let buckets = 1usize << c;
            // Per task: Π_d B_d^d in Montgomery form.
            let sums: Vec<Vec<u64>> = tasks
                .par_chunks(LANES)
                .flat_map_iter(|group| {
                    let mut table = self.lane_tables(buckets);
                    let mut gathered = self.zero_lanes();
                    let mut product = self.zero_lanes();
                    let offsets_of = |i: usize| -> [usize; LANES] {
                        std::array::from_fn(|lane| {
                            let bucket = group.get(lane).map_or(0, |&(j, w)| digit(matrix[j * count + i], w as u32, c));
                            (lane * buckets + bucket) * d
                        })
                    };
                    let mut next = offsets_of(0);
                    for i in 0..count {
                        let offsets = next;
                        if i + 1 < count {
                            next = offsets_of(i + 1);
                            self.prefetch(&table, &next);
                        }
                        // Every lane on bucket 0 (all digits zero): nothing to add.
                        if offsets.iter().enumerate().all(|(lane, &o)| o == lane * buckets * d) {
                            continue;
                        }
                        self.gather(std::array::from_fn(|lane| &table[offsets[lane]..offsets[lane] + d]), &mut gathered);
                        self.mul_broadcast(&gathered, &bases[i * d..(i + 1) * d], &mut product);
                        self.scatter(&product, &mut table, &offsets);
                    }
                    // Running sums: S = Π_{d' ≥ d} B_d', T = Π_d S_d = Π_d B_d^d.
                    let mut running = self.one_lanes.clone();
                    let mut total = self.one_lanes.clone();
                    let mut tmp = self.zero_lanes();
                    for bucket in (1..buckets).rev() {
                        self.gather(
                            std::array::from_fn(|lane| &table[(lane * buckets + bucket) * d..(lane * buckets + bucket + 1) * d]),
                            &mut gathered,
                        );
                        self.mul(&running, &gathered, &mut tmp);
                        std::mem::swap(&mut running, &mut tmp);
                        self.mul(&total, &running, &mut tmp);
                        std::mem::swap(&mut total, &mut tmp);
                    }
                    (0..group.len()).map(move |lane| (0..d).map(|i| total[i * LANES + lane]).collect::<Vec<u64>>())
                })
                .collect();
            // Horner across windows, eight rows per product.
            let row_ids: Vec<usize> = (0..rows).collect();
            let chunks: Vec<Vec<Integer>> = row_ids
                .par_chunks(LANES)
                .map(|group| {
                    let pick = |w: usize| -> [&[u64]; LANES] {
                        std::array::from_fn(|k| group.get(k).map_or(&self.one[..], |&j| &sums[j * windows + w][..]))
                    };
                    let mut acc = self.zero_lanes();
                    let mut operand = self.zero_lanes();
                    let mut tmp = self.zero_lanes();
                    self.gather(pick(windows - 1), &mut acc);
                    for w in (0..windows - 1).rev() {
                        for _ in 0..c {
                            self.square(&acc, &mut tmp);
                            std::mem::swap(&mut acc, &mut tmp);
                        }
                        self.gather(pick(w), &mut operand);
                        self.mul(&acc, &operand, &mut tmp);
                        std::mem::swap(&mut acc, &mut tmp);
                    }
                    self.leave(&acc, group.len())
                })
                .collect();
            chunks.into_iter().flatten().collect()
        }

        /// Grouped products (see `EncryptionKey::dot_groups_u64`): lane = group, Straus
        /// with a table of the 2^c − 1 digit powers of each base; outputs group-major.
        pub(super) fn dot_groups(&self, ciphertexts: &[Ciphertext], group: usize, matrix: &[u64], bits: u32, c: u32) -> Vec<Integer> {
            let groups = ciphertexts.len() / group;
            let entries = 1usize << c;
            let windows = bits.div_ceil(c);
            let ids: Vec<usize> = (0..groups).collect();
            let chunks: Vec<Vec<Integer>> = ids
                .par_chunks(LANES)
                .map(|gs| {
                    let mut tables: Vec<Vec<u64>> = Vec::with_capacity(group * entries);
                    for k in 0..group {
                        let values: Vec<&Integer> = gs.iter().map(|&g| &ciphertexts[g * group + k].0).collect();
                        let mut base = self.zero_lanes();
                        self.enter(&values, &mut base);
                        tables.push(self.one_lanes.clone());
                        tables.push(base.clone());
                        for d in 2..entries {
                            let mut next = self.zero_lanes();
                            self.mul(&tables[k * entries + d - 1], &base, &mut next);
                            tables.push(next);
                        }
                    }
                    let mut per_row: Vec<Vec<Integer>> = Vec::new();
                    let mut tmp = self.zero_lanes();
                    for exponents in matrix.chunks(group) {
                        let mut acc = self.one_lanes.clone();
                        let mut started = false;
                        for w in (0..windows).rev() {
                            if started {
                                for _ in 0..c {
                                    self.square(&acc, &mut tmp);
                                    std::mem::swap(&mut acc, &mut tmp);
                                }
                            }
                            for (k, &e) in exponents.iter().enumerate() {
                                let d = digit(e, w, c);
                                if d != 0 {
                                    self.mul(&acc, &tables[k * entries + d], &mut tmp);
                                    std::mem::swap(&mut acc, &mut tmp);
                                    started = true;
                                }
                            }
                        }
                        per_row.push(self.leave(&acc, gs.len()));
                    }
                    (0..gs.len()).flat_map(|lane| per_row.iter().map(move |row| row[lane].clone())).collect()
                })
                .collect();
            chunks.into_iter().flatten().collect()
        }
    }

    #[cfg(test)]
    impl IfmaModulus {
        pub(super) fn enter_for_test(&self, values: &[Integer]) -> Vec<u64> {
            let mut out = self.zero_lanes();
            self.enter(&values.iter().collect::<Vec<_>>(), &mut out);
            out
        }
        pub(super) fn leave_for_test(&self, lanes: &[u64]) -> Vec<Integer> {
            self.leave(lanes, LANES)
        }
        pub(super) fn digits_for_test(&self) -> usize {
            self.digits
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::DecryptionKey;
    use crate::ops::Randomizer;
    use proptest::prelude::*;
    use std::sync::OnceLock;

    fn key() -> &'static DecryptionKey {
        static KEY: OnceLock<DecryptionKey> = OnceLock::new();
        KEY.get_or_init(|| {
            let key = DecryptionKey::generate(2048).unwrap();
            // A small window keeps the test table tiny; the arithmetic is the same.
            let public = key.encryption_key().with_window(4).unwrap();
            DecryptionKey::from_primes(key.primes().0.clone(), key.primes().1.clone(), Some(public)).unwrap()
        })
    }

    fn public() -> &'static EncryptionKey {
        key().encryption_key()
    }

    #[test]
    fn pow_shared_many_matches_gmp_for_either_sign_and_both_paths() {
        let key = public();
        let plaintexts: Vec<Integer> = (0..11).map(|i| Integer::from(1000 + i)).collect();
        let cts = key.encrypt_many(&plaintexts, Randomizer::FixedBase).unwrap();
        // A 4,400-bit exponent, as a threshold share 2·Δ·d_j has.
        let exponent = (Integer::from(1) << 4400u32) - Integer::from(12345);
        for e in [exponent.clone(), -exponent] {
            // 11 ciphertexts: a full batch of 8 on IFMA plus a partial one; 1 takes the GMP path.
            for take in [11usize, 1] {
                let out = key.pow_shared_many(&cts[..take], &e).unwrap();
                for (c, o) in cts[..take].iter().zip(&out) {
                    let expected = c.as_integer().clone().pow_mod(&e, key.n_squared()).unwrap();
                    assert_eq!(*o.as_integer(), expected);
                }
            }
        }
        let zero = key.pow_shared_many(&cts[..3], &Integer::new()).unwrap();
        assert!(zero.iter().all(|c| *c.as_integer() == 1));
    }

    /// Engines this CPU runs.
    fn engines() -> Vec<Engine> {
        let mut out = vec![Engine::Gmp];
        #[cfg(target_arch = "x86_64")]
        if crate::ifma::available() {
            out.push(Engine::Ifma);
        }
        out
    }

    /// Deterministic pseudo-random numbers (splitmix64).
    struct Mix(u64);
    impl Mix {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, bound: u64) -> u64 {
            self.next() % bound
        }
    }

    fn encrypt(values: &[u64]) -> Vec<Ciphertext> {
        let plaintexts: Vec<Integer> = values.iter().map(|&v| Integer::from(v)).collect();
        public().encrypt_many(&plaintexts, Randomizer::FixedBase).unwrap()
    }

    fn one() -> Ciphertext {
        Ciphertext(Integer::from(1))
    }

    fn naive_histogram(cts: &[Ciphertext], bins: &[u8], features: usize, rows: &[u32], n_bins: usize) -> Vec<Ciphertext> {
        let k = public();
        let n = cts.len();
        let mut out = vec![one(); features * n_bins];
        for f in 0..features {
            for &r in rows {
                let cell = f * n_bins + usize::from(bins[f * n + r as usize]);
                out[cell] = k.add(&out[cell], &cts[r as usize]);
            }
        }
        out
    }

    fn naive_fold(cts: &[Ciphertext], width: u32, per: usize) -> Vec<Ciphertext> {
        let k = public();
        let shift = Integer::from(1) << width;
        cts.chunks(per)
            .map(|group| {
                let mut acc = group[group.len() - 1].clone();
                for c in group[..group.len() - 1].iter().rev() {
                    acc = k.add(&k.mul_scalar(&acc, &shift).unwrap(), c);
                }
                acc
            })
            .collect()
    }

    fn naive_dot(cts: &[Ciphertext], matrix: &[u64], rows: usize) -> Vec<Ciphertext> {
        let k = public();
        let n = cts.len();
        (0..rows)
            .map(|j| {
                let mut acc = one();
                for (i, c) in cts.iter().enumerate() {
                    acc = k.add(&acc, &k.mul_scalar(c, &Integer::from(matrix[j * n + i])).unwrap());
                }
                acc
            })
            .collect()
    }

    #[test]
    fn histogram_matches_naive_on_every_engine_and_plan() {
        let mut rng = Mix(1);
        let n = 70;
        let cts = encrypt(&(0..n as u64).map(|_| rng.below(1 << 40)).collect::<Vec<_>>());
        // 17 and 16 features: full groups of eight tasks run lane = task (shared passes).
        for (features, n_bins) in [(5usize, 7usize), (4, 1), (3, 16), (1, 3), (2, 256), (17, 4), (16, 2)] {
            let bins: Vec<u8> = (0..features * n).map(|_| rng.below(n_bins as u64) as u8).collect();
            // A subset with a duplicate, out of order.
            let mut rows: Vec<u32> = (0..n as u32).filter(|_| rng.below(4) != 0).collect();
            rows.reverse();
            rows.push(rows[0]);
            let expected = naive_histogram(&cts, &bins, features, &rows, n_bins);
            for engine in engines() {
                for pairs in [Some(false), Some(true), None] {
                    let got = public().histogram_on(engine, pairs, &cts, &bins, features, &rows, n_bins).unwrap();
                    assert_eq!(got, expected, "{engine:?} pairs {pairs:?} F {features} B {n_bins}");
                }
            }
        }
        // The public entry point, and no rows at all: every bin is the ciphertext 1.
        let bins = vec![0u8; 2 * n];
        assert_eq!(public().histogram(&cts, &bins, 2, &[], 4).unwrap(), vec![one(); 8]);
    }

    /// Enough rows that a shared pass is split over two threads and its tables multiplied.
    #[test]
    fn histogram_split_shared_passes_match_naive() {
        let mut rng = Mix(9);
        let n = 9000;
        let cts: Vec<Ciphertext> = (0..n)
            .map(|_| {
                let limbs: Vec<u64> = (0..64).map(|_| rng.next()).collect();
                Ciphertext(Integer::from_digits(&limbs, Order::Lsf) % public().n_squared() + 1u32)
            })
            .collect();
        let (features, n_bins) = (16usize, 3usize);
        let bins: Vec<u8> = (0..features * n).map(|_| rng.below(n_bins as u64) as u8).collect();
        let rows: Vec<u32> = (0..n as u32).collect();
        let expected = naive_histogram(&cts, &bins, features, &rows, n_bins);
        for engine in engines() {
            let got = crate::vector::with_threads(2, || public().histogram_on(engine, None, &cts, &bins, features, &rows, n_bins));
            assert_eq!(got.unwrap().unwrap(), expected, "{engine:?}");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn shared_passes_take_full_groups_of_eight() {
        let pairs: Vec<Task> = (0..25).map(|k| Task::Pair(2 * k, 2 * k + 1)).collect();
        let passes = plan_passes(&pairs, 100_000.0, 32.0);
        assert_eq!(passes.len(), 4);
        assert!(passes[..3].iter().all(|p| matches!(p, Pass::Lanes(t) if t.len() == 8)));
        assert_eq!(passes[3], Pass::Rows(Task::Pair(48, 49)));
        // Seven leftover singles over few rows: one shared pass is cheaper than seven.
        let singles: Vec<Task> = (0..7).map(Task::Single).collect();
        assert!(matches!(&plan_passes(&singles, 100.0, 4.0)[..], [Pass::Lanes(t)] if t.len() == 7));
    }

    #[test]
    fn histogram_decrypts_to_bin_sums() {
        let mut rng = Mix(2);
        let n = 40;
        let values: Vec<u64> = (0..n).map(|_| rng.below(1 << 30)).collect();
        let cts = encrypt(&values);
        let (features, n_bins) = (3, 4);
        let bins: Vec<u8> = (0..features * n).map(|_| rng.below(n_bins as u64) as u8).collect();
        let rows: Vec<u32> = (0..n as u32).step_by(3).collect();
        let got = key().decrypt_many(&public().histogram(&cts, &bins, features, &rows, n_bins).unwrap()).unwrap();
        for f in 0..features {
            for b in 0..n_bins {
                let sum: u64 = rows.iter().filter(|&&r| usize::from(bins[f * n + r as usize]) == b).map(|&r| values[r as usize]).sum();
                assert_eq!(got[f * n_bins + b], sum, "feature {f} bin {b}");
            }
        }
    }

    #[test]
    fn histogram_errors_name_the_field() {
        let cts = encrypt(&[1, 2, 3]);
        let k = public();
        let err = |r: Result<Vec<Ciphertext>>| r.unwrap_err().to_string();
        assert!(err(k.histogram(&cts, &[0; 6], 2, &[0], 0)).contains("n_bins"));
        assert!(err(k.histogram(&cts, &[0; 6], 2, &[0], 257)).contains("n_bins"));
        assert!(err(k.histogram(&cts, &[0; 5], 2, &[0], 4)).contains("bins"));
        assert!(err(k.histogram(&cts, &[0; 6], 2, &[0, 3], 4)).contains("rows[1] = 3"));
        let message = err(k.histogram(&cts, &[0, 0, 0, 0, 9, 0], 2, &[0, 1, 2], 4));
        assert!(message.contains("feature 1, row 1") && message.contains("n_bins = 4"), "{message}");
        // A bad bin in a row that is not selected is never read.
        assert!(k.histogram(&cts, &[0, 0, 0, 0, 9, 0], 2, &[0, 2], 4).is_ok());
    }

    #[test]
    fn fold_packs_slots_and_matches_naive() {
        let mut rng = Mix(3);
        for (len, width, per) in [(37usize, 64u32, 8usize), (16, 125, 16), (5, 20, 1), (3, 100, 16), (9, 200, 4)] {
            let values: Vec<u64> = (0..len).map(|_| rng.below(1u64 << (width.min(64) - 8).min(56))).collect();
            let cts = encrypt(&values);
            let expected = naive_fold(&cts, width, per);
            for engine in engines() {
                let got = public().fold_on(engine, &cts, width, per).unwrap();
                assert_eq!(got, expected, "{engine:?} len {len} width {width} per {per}");
            }
            let plain = key().decrypt_many(&public().fold(&cts, width, per).unwrap()).unwrap();
            for (g, group) in values.chunks(per).enumerate() {
                let mut want = Integer::new();
                for (j, &v) in group.iter().enumerate() {
                    want += Integer::from(v) << (width * j as u32);
                }
                assert_eq!(plain[g], want, "group {g}");
            }
        }
        assert!(public().fold(&[], 8, 4).unwrap().is_empty());
    }

    #[test]
    fn fold_errors_name_the_field() {
        let cts = encrypt(&[1]);
        let k = public();
        assert!(k.fold(&cts, 0, 4).unwrap_err().to_string().contains("width"));
        assert!(k.fold(&cts, 1025, 1).unwrap_err().to_string().contains("width"));
        assert!(k.fold(&cts, 8, 0).unwrap_err().to_string().contains("per"));
        let message = k.fold(&cts, 128, 16).unwrap_err().to_string();
        assert!(message.contains("16 * 128") && message.contains("2047"), "{message}");
        assert!(k.fold(&cts, 127, 16).is_ok());
    }

    #[test]
    fn dot_matches_naive_and_decrypts() {
        let mut rng = Mix(4);
        let n = 23;
        let values: Vec<u64> = (0..n).map(|_| rng.below(1 << 20)).collect();
        let cts = encrypt(&values);
        for (rows, bits) in [(3usize, 20u32), (9, 1), (2, 64), (1, 7), (10, 33)] {
            let mut matrix: Vec<u64> =
                (0..rows * n).map(|_| if bits == 64 { rng.next() } else { rng.next() & ((1u64 << bits) - 1) }).collect();
            matrix[..n].fill(0); // an all-zero row
            if rows > 1 {
                matrix[n + 3] = 0;
                matrix[n + 4] = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
            }
            let expected = naive_dot(&cts, &matrix, rows);
            assert_eq!(expected[0], one());
            for engine in engines() {
                let got = public().dot_u64_on(engine, &cts, &matrix, rows, bits).unwrap();
                assert_eq!(got, expected, "{engine:?} rows {rows} bits {bits}");
            }
            let plain = key().decrypt_many(&expected).unwrap();
            for j in 0..rows {
                let mut want = Integer::new();
                for i in 0..n {
                    want += Integer::from(matrix[j * n + i]) * values[i];
                }
                assert_eq!(plain[j], want % public().n(), "row {j}");
            }
        }
        assert_eq!(public().dot_u64(&[], &[], 3, 8).unwrap(), vec![one(); 3]);
        assert!(public().dot_u64(&cts, &[], 0, 8).unwrap().is_empty());
    }

    #[test]
    fn dot_groups_match_naive_per_group() {
        let mut rng = Mix(9);
        let group = 3;
        let values: Vec<u64> = (0..group * 11).map(|_| rng.below(1 << 20)).collect();
        let cts = encrypt(&values);
        for (rows, bits) in [(2usize, 64u32), (4, 17), (1, 1)] {
            let mut matrix: Vec<u64> =
                (0..rows * group).map(|_| if bits == 64 { rng.next() } else { rng.next() & ((1u64 << bits) - 1) }).collect();
            matrix[0] = 0;
            let mut expected = Vec::new();
            for g in 0..11 {
                expected.extend(naive_dot(&cts[g * group..(g + 1) * group], &matrix, rows));
            }
            for engine in engines() {
                let got = public().dot_groups_u64_on(engine, &cts, group, &matrix, rows, bits).unwrap();
                assert_eq!(got, expected, "{engine:?} rows {rows} bits {bits}");
            }
        }
        let k = public();
        assert!(k.dot_groups_u64(&cts, 0, &[], 0, 8).unwrap_err().to_string().contains("group"));
        assert!(k.dot_groups_u64(&cts, 2, &[1, 2], 1, 8).unwrap_err().to_string().contains("multiple"));
        assert!(k.dot_groups_u64(&cts, 3, &[1, 2], 1, 8).unwrap_err().to_string().contains("matrix"));
        assert!(k.dot_groups_u64(&cts, 3, &[1, 2, 300], 1, 8).unwrap_err().to_string().contains("2^8"));
    }

    #[test]
    fn dot_errors_name_the_field() {
        let cts = encrypt(&[1, 2]);
        let k = public();
        assert!(k.dot_u64(&cts, &[1, 2], 1, 0).unwrap_err().to_string().contains("bits"));
        assert!(k.dot_u64(&cts, &[1, 2], 1, 65).unwrap_err().to_string().contains("bits"));
        assert!(k.dot_u64(&cts, &[1, 2, 3], 1, 8).unwrap_err().to_string().contains("matrix"));
        let message = k.dot_u64(&cts, &[1, 2, 3, 256], 2, 8).unwrap_err().to_string();
        assert!(message.contains("row 1, column 1") && message.contains("2^8"), "{message}");
    }

    #[test]
    fn window_choice_follows_the_cost_model() {
        assert_eq!(dot_window(100_000, 20), 10);
        assert_eq!(dot_window(100_000, 24), 12);
        assert_eq!(dot_window(100_000, 16), 8);
        assert_eq!(dot_window(10, 1), 1);
        assert!(dot_window(1_000_000, 64) <= MAX_WINDOW);
    }

    #[test]
    fn pairing_is_chosen_only_when_it_pays() {
        let bins = vec![0u8; 3 * 20_000];
        let many: Vec<u32> = (0..20_000).collect();
        let big = Histogram { bins: &bins, samples: 20_000, features: 3, rows: &many, n_bins: 32 };
        let small = Histogram { bins: &bins, samples: 20_000, features: 3, rows: &many[..500], n_bins: 32 };
        for engine in engines() {
            assert!(matches!(plan_histogram(&big, engine, 4096, None)[..], [Task::Pair(0, 1), Task::Single(2)]), "{engine:?}");
            assert!(plan_histogram(&small, engine, 4096, None).iter().all(|t| matches!(t, Task::Single(_))), "{engine:?}");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn lane_products_match_gmp() {
        if !crate::ifma::available() {
            return;
        }
        let mut rng = Mix(5);
        for bits in [256u32, 1024, 2048, 4096, 6144, 8190] {
            let modulus = (Integer::from(1) << (bits - 1)) + Integer::from(rng.next() | 1);
            let amm = lanes::IfmaModulus::new(&modulus).unwrap();
            let random = |rng: &mut Mix| -> Integer {
                let limbs: Vec<u64> = (0..bits.div_ceil(64)).map(|_| rng.next()).collect();
                Integer::from_digits(&limbs, Order::Lsf) % &modulus
            };
            let mut a: Vec<Integer> = (0..8).map(|_| random(&mut rng)).collect();
            a[0] = Integer::from(&modulus - 1u32);
            a[1] = Integer::from(1);
            let b: Vec<Integer> = (0..8).map(|_| random(&mut rng)).collect();
            let (am, bm) = (amm.enter_for_test(&a), amm.enter_for_test(&b));
            let mut out = vec![0u64; am.len()];
            amm.mul(&am, &bm, &mut out);
            let product = amm.leave_for_test(&out);
            amm.square(&am, &mut out);
            let square = amm.leave_for_test(&out);
            let digits = amm.digits_for_test();
            let broadcast: Vec<u64> = (0..digits).map(|i| bm[i * 8 + 5]).collect();
            amm.mul_broadcast(&am, &broadcast, &mut out);
            let by_one = amm.leave_for_test(&out);
            for l in 0..8 {
                assert_eq!(product[l], Integer::from(&a[l] * &b[l]) % &modulus, "mul bits {bits} lane {l}");
                assert_eq!(square[l], Integer::from(&a[l] * &a[l]) % &modulus, "square bits {bits} lane {l}");
                assert_eq!(by_one[l], Integer::from(&a[l] * &b[5]) % &modulus, "broadcast bits {bits} lane {l}");
            }
            // Long chains stay in [0, 2M): 200 squarings against pow_mod.
            let mut acc = am.clone();
            for _ in 0..200 {
                amm.square(&acc, &mut out);
                std::mem::swap(&mut acc, &mut out);
            }
            let chained = amm.leave_for_test(&acc);
            let exponent = Integer::from(1) << 200u32;
            for l in 0..8 {
                assert_eq!(chained[l], a[l].clone().pow_mod(&exponent, &modulus).unwrap(), "chain bits {bits} lane {l}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]

        #[test]
        fn histogram_any_shape(n in 1usize..30, features in 0usize..5, n_bins in 1usize..12, seed in any::<u64>()) {
            let mut rng = Mix(seed);
            let cts: Vec<Ciphertext> = (0..n).map(|_| {
                let limbs: Vec<u64> = (0..64).map(|_| rng.next()).collect();
                Ciphertext(Integer::from_digits(&limbs, Order::Lsf) % public().n_squared() + 1u32)
            }).collect();
            let bins: Vec<u8> = (0..features * n).map(|_| rng.below(n_bins as u64) as u8).collect();
            let rows: Vec<u32> = (0..rng.below(2 * n as u64 + 1)).map(|_| rng.below(n as u64) as u32).collect();
            let expected = naive_histogram(&cts, &bins, features, &rows, n_bins);
            for engine in engines() {
                for pairs in [Some(false), Some(true)] {
                    prop_assert_eq!(&public().histogram_on(engine, pairs, &cts, &bins, features, &rows, n_bins).unwrap(), &expected);
                }
            }
        }

        #[test]
        fn dot_any_shape(n in 1usize..20, rows in 1usize..11, bits in 1u32..=64, seed in any::<u64>()) {
            let mut rng = Mix(seed);
            let cts: Vec<Ciphertext> = (0..n).map(|_| {
                let limbs: Vec<u64> = (0..64).map(|_| rng.next()).collect();
                Ciphertext(Integer::from_digits(&limbs, Order::Lsf) % public().n_squared() + 1u32)
            }).collect();
            let matrix: Vec<u64> = (0..rows * n).map(|_| {
                let v = if bits == 64 { rng.next() } else { rng.next() & ((1u64 << bits) - 1) };
                if rng.below(4) == 0 { 0 } else { v }
            }).collect();
            let expected = naive_dot(&cts, &matrix, rows);
            for engine in engines() {
                prop_assert_eq!(&public().dot_u64_on(engine, &cts, &matrix, rows, bits).unwrap(), &expected);
            }
        }
    }
}

#[cfg(test)]
mod timing {
    //! Timings: `cargo test -p confide-paillier --release --lib kernels::timing --
    //! --ignored --nocapture --test-threads=1` (set CONFIDE_DISABLE_IFMA=1 for GMP).
    //! Inputs are random units below n² of a real 2048-bit key: the arithmetic costs
    //! the same as on real ciphertexts, without 100k encryptions first.
    use super::*;
    use crate::keys::DecryptionKey;
    use crate::vector::with_threads;
    use std::time::Instant;

    fn setup(count: usize) -> (EncryptionKey, Vec<Ciphertext>) {
        let key = DecryptionKey::generate(2048).unwrap().encryption_key().clone();
        let mut state = 0x1234_5678u64;
        let cts = (0..count)
            .map(|_| {
                let limbs: Vec<u64> = (0..64)
                    .map(|_| {
                        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                        state ^ (state >> 29)
                    })
                    .collect();
                Ciphertext(Integer::from_digits(&limbs, Order::Lsf) % key.n_squared() + 1u32)
            })
            .collect();
        (key, cts)
    }

    fn engine_name() -> &'static str {
        if crate::ifma_available() {
            "avx512-ifma"
        } else {
            "gmp"
        }
    }

    #[test]
    #[ignore = "timing: cargo test --release --lib kernels::timing -- --ignored --nocapture"]
    fn histogram_100k_50_32() {
        let (n, features, n_bins) = (100_000usize, 50usize, 32usize);
        let (key, cts) = setup(n);
        let mut state = 7u64;
        let bins: Vec<u8> = (0..features * n)
            .map(|_| {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                ((state >> 33) % n_bins as u64) as u8
            })
            .collect();
        let rows: Vec<u32> = (0..n as u32).collect();
        for threads in [1usize, 2] {
            let start = Instant::now();
            let out = with_threads(threads, || key.histogram(&cts, &bins, features, &rows, n_bins)).unwrap().unwrap();
            let seconds = start.elapsed().as_secs_f64();
            println!(
                "histogram {} N={n} F={features} B={n_bins} threads={threads}: {seconds:.2} s, {:.1} ns per (row, feature) [{} outputs]",
                engine_name(),
                seconds / (n * features) as f64 * 1e9,
                out.len()
            );
        }
        // The naive way for one feature: one mpz product and reduction per row (key.add).
        let start = Instant::now();
        let mut cells = vec![Ciphertext(Integer::from(1)); n_bins];
        for &r in &rows {
            let b = usize::from(bins[r as usize]);
            cells[b] = key.add(&cells[b], &cts[r as usize]);
        }
        let seconds = start.elapsed().as_secs_f64();
        println!("  naive key.add, one feature, threads=1: {:.1} ns per (row, feature)", seconds / n as f64 * 1e9);
        let start = Instant::now();
        let _ = with_threads(1, || key.histogram_on(Engine::pick(key.n_squared()), Some(false), &cts, &bins, features, &rows, n_bins));
        let seconds = start.elapsed().as_secs_f64();
        println!(
            "  {} without pairing, threads=1: {seconds:.2} s, {:.1} ns per (row, feature)",
            engine_name(),
            seconds / (n * features) as f64 * 1e9
        );
    }

    #[test]
    #[ignore = "timing: cargo test --release --lib kernels::timing -- --ignored --nocapture"]
    fn fold_1600_125_16() {
        let (key, cts) = setup(1600);
        for threads in [1usize, 2] {
            let start = Instant::now();
            let out = with_threads(threads, || key.fold(&cts, 125, 16)).unwrap().unwrap();
            let seconds = start.elapsed().as_secs_f64();
            println!(
                "fold {} 1600 ciphertexts width=125 per=16 threads={threads}: {:.1} ms, {:.1} us per input ciphertext [{} outputs]",
                engine_name(),
                seconds * 1e3,
                seconds / 1600.0 * 1e6,
                out.len()
            );
        }
    }

    #[test]
    #[ignore = "timing: cargo test --release --lib kernels::timing -- --ignored --nocapture"]
    fn dot_100k_50_20() {
        let (n, rows, bits) = (100_000usize, 50usize, 20u32);
        let (key, cts) = setup(n);
        let mut state = 11u64;
        let matrix: Vec<u64> = (0..rows * n)
            .map(|_| {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                (state >> 20) & ((1 << bits) - 1)
            })
            .collect();
        for threads in [1usize, 2] {
            let start = Instant::now();
            let out = with_threads(threads, || key.dot_u64(&cts, &matrix, rows, bits)).unwrap().unwrap();
            let seconds = start.elapsed().as_secs_f64();
            println!(
                "dot_u64 {} N={n} F={rows} bits={bits} (window {}) threads={threads}: {seconds:.2} s, {:.1} ns per (row, column) [{} outputs]",
                engine_name(),
                dot_window(n, bits),
                seconds / (n * rows) as f64 * 1e9,
                out.len()
            );
        }
        // The naive way: one mul_scalar per entry, then sums (sampled, extrapolated to F·N).
        let sample = 4000usize;
        let scalars: Vec<Integer> = matrix[..sample].iter().map(|&v| Integer::from(v)).collect();
        for threads in [1usize, 2] {
            let start = Instant::now();
            let powers = with_threads(threads, || key.mul_scalar_many(&cts[..sample], &scalars)).unwrap().unwrap();
            let halves: Vec<&[Ciphertext]> = vec![&powers[..sample / 2], &powers[sample / 2..]];
            let _ = with_threads(threads, || key.sum_many(&halves)).unwrap().unwrap();
            let per = start.elapsed().as_secs_f64() / sample as f64;
            println!(
                "  naive mul_scalar + sum threads={threads}: {:.1} us per entry, {:.0} s extrapolated to F*N = {}",
                per * 1e6,
                per * (rows * n) as f64,
                rows * n
            );
        }
    }
}
