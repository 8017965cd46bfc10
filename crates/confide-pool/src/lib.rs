//! The one registry of rayon thread pools in the workspace.
//!
//! [`with_threads`] runs work on a pool of the requested size, built once per size and reused.
//! Every crate that parallelises (`confide-paillier`'s vector forms, `confide-psi`'s blinding)
//! calls it, so a process that encrypts and blinds at the same time shares one pool per size
//! instead of stacking a pool per crate on the same cores.
//!
//! Pools are keyed by process id (after `fork()` the child has none of the parent's worker
//! threads, so a parent pool would block forever) and, for one-thread requests, by the calling
//! thread: callers that each ask for one core (slices encoded side by side, parties simulated
//! in one process) must not queue behind each other on a shared single thread.

use rayon::{ThreadPool, ThreadPoolBuilder};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

/// Largest thread count accepted by [`with_threads`].
pub const MAX_THREADS: usize = 256;

/// Why a pool could not be had; the calling crate maps it into its own error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolError(pub String);

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PoolError {}

type Key = (u32, usize, Option<std::thread::ThreadId>);

/// Runs `work` on a rayon pool of `threads` threads (0 = one per core).
///
/// # Errors
/// A [`PoolError`] if `threads` > [`MAX_THREADS`] or the pool cannot start.
pub fn with_threads<R: Send>(threads: usize, work: impl FnOnce() -> R + Send) -> Result<R, PoolError> {
    Ok(pool(threads)?.install(work))
}

/// The shared pool of `threads` threads (0 = one per core) for this process and caller.
///
/// # Errors
/// As [`with_threads`].
pub fn pool(threads: usize) -> Result<Arc<ThreadPool>, PoolError> {
    if threads > MAX_THREADS {
        return Err(PoolError(format!("must be at most {MAX_THREADS}, got {threads}")));
    }
    let threads = if threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { threads };
    static POOLS: OnceLock<Mutex<HashMap<Key, Arc<ThreadPool>>>> = OnceLock::new();
    let caller = (threads == 1).then(|| std::thread::current().id());
    let key = (std::process::id(), threads, caller);
    let mut pools = POOLS.get_or_init(Default::default).lock().map_err(|_| PoolError("thread pool registry poisoned".into()))?;
    if let Some(pool) = pools.get(&key) {
        return Ok(Arc::clone(pool));
    }
    let pool = Arc::new(
        ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("confide-{i}"))
            .build()
            .map_err(|e| PoolError(e.to_string()))?,
    );
    pools.insert(key, Arc::clone(&pool));
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_are_shared_by_size_and_bounded() {
        let a = pool(3).unwrap_or_else(|e| unreachable!("{e}"));
        let b = pool(3).unwrap_or_else(|e| unreachable!("{e}"));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(with_threads(3, rayon::current_num_threads), Ok(3));
        assert!(with_threads(MAX_THREADS + 1, || ()).is_err());
    }

    #[test]
    fn one_thread_pools_are_per_caller() {
        let here = pool(1).unwrap_or_else(|e| unreachable!("{e}"));
        let there = std::thread::spawn(|| pool(1).map(|p| Arc::as_ptr(&p) as usize)).join();
        assert!(matches!(there, Ok(Ok(ptr)) if ptr != Arc::as_ptr(&here) as usize));
    }
}
