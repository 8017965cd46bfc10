//! The Confide aggregation data plane (algorithms.md §6).
//!
//! # What Jupiter does
//! Jupiter (S000) aggregates FedAvg updates in an SGX aggregator cluster. Parties
//! cut their parameters into fixed-size slices (64 KiB); a two-level router sends
//! every copy of a slice to one node (spreading a layer's slices over nodes) and,
//! inside the node, to one worker's queue, so no state is shared across cores.
//! Each worker, an enclave thread, keeps a state tracker: per slice index the
//! running weighted sum and weight, folded in place by an AVX2 multiply-add as
//! slices arrive, emitted and freed as soon as every party has arrived; missing
//! slices are checkpointed out of enclave memory.
//!
//! # What this crate does
//! * [`kernels`]: the primitive `acc += w·x` with AVX-512F / AVX2+FMA / scalar
//!   run-time dispatch (bit-identical across levels), plus `acc = w·x`, a finite
//!   check and a wrapping u32 add, all reading payload bytes in place.
//! * [`tracker`]: one [`Tracker`] per worker: entries per (round, index) with
//!   accumulator, weight sum, seen bitmap; duplicate and late detection; f32
//!   sum/mean, wrapping u32 sums (masked integers) and Paillier products; a cap
//!   on staged bytes enforced by spilling the oldest incomplete entry; versioned,
//!   checksummed round checkpoints with missing-participant reports.
//! * [`node`]: [`DataPlane`], one worker thread per core with a bounded queue
//!   each (back-pressure), a message wall of open rounds, level-2 routing and a
//!   synchronous `push` for many concurrent callers.
//! * [`routing`]: splitmix64 mixing, level-1 node and level-2 worker choice.
//! * [`enclave`]: the `tee` kinds behind one narrow [`Enclave`] trait (the
//!   "ecalls"). Slices arrive AES-256-GCM sealed under a per-session key that a
//!   party wraps to the enclave's X25519 key; the enclave decrypts, folds into
//!   trackers it owns and seals the result; for a robust round ([`robust`]) it seals
//!   the robust estimate of the stacked updates instead.
//!
//! # The tee mode is a simulation
//! There is no SGX on this machine. [`SimulatedEnclave`] runs as ordinary code in
//! the aggregator process: the interface, the key handling and the wire formats
//! are those an enclave would use, but nothing isolates its memory from the host,
//! there is no remote attestation, and its report says so
//! (`hardware_isolation: false`). It protects slices in transit and at rest in
//! queues and checkpoints, not against the operator of the aggregator.
#![cfg_attr(not(target_endian = "little"), allow(unused))]

#[cfg(not(target_endian = "little"))]
compile_error!("confide-agg assumes a little-endian target (payload words are little-endian)");

mod bytes;
pub mod enclave;
mod error;
pub mod kernels;
pub mod node;
pub mod robust;
pub mod routing;
#[cfg(target_arch = "x86_64")]
mod simd;
pub mod tracker;
pub mod wire;

pub use enclave::{Enclave, EnclaveReport, SimulatedEnclave};
pub use error::{Error, Result};
pub use kernels::{accumulate_f32, accumulate_u32, all_finite_f32, bench_primitive, scale_into_f32, simd_level, Level};
pub use node::{DataPlane, PushResult, Stats};
pub use robust::Rule as RobustRule;
pub use routing::{mix64, node_for, session_hash, worker_for};
pub use tracker::{Kind, Outcome, RoundCheckpoint, RoundSpec, TeeRound, Tracker, TrackerStats, MAX_PARTICIPANTS};
pub use wire::{parse_batch, parse_push, BatchView, PushBody};
