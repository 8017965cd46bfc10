//! Two-level slice routing (algorithms.md §6.2).
//!
//! * Level 1, between aggregator nodes: `node = (mix64(session ^ layer) + slice_index) mod nodes`,
//!   so consecutive slices of one layer go round-robin over the nodes (R1) and every
//!   participant's copy of a slice reaches the same node (R2).
//! * Level 2, inside a node: `worker = mix64(session ^ index) mod workers`, so one
//!   index of a session always reaches the same worker queue (no shared state
//!   between workers); the round does not change the worker.

/// The splitmix64 finalizer: a bijective 64-bit mix.
pub fn mix64(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Level 2: the worker (queue) of slice `index` of a session; 0 if `workers` is 0.
pub fn worker_for(session_hash: u64, index: u32, workers: usize) -> usize {
    if workers == 0 {
        return 0;
    }
    (mix64(session_hash ^ u64::from(index)) % workers as u64) as usize
}

/// Level 1: the node of slice `slice_index` of layer `layer_id`; 0 if `nodes` is 0.
pub fn node_for(session_hash: u64, layer_id: u32, slice_index: u32, nodes: u32) -> u32 {
    if nodes == 0 {
        return 0;
    }
    let nodes = u64::from(nodes);
    ((mix64(session_hash ^ u64::from(layer_id)) % nodes + u64::from(slice_index) % nodes) % nodes) as u32
}

/// The routing key of a session (job id): the first 8 bytes of SHA-256(session), big-endian.
pub fn session_hash(session: &str) -> u64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(session.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_reference() {
        // splitmix64 seeded with 0 yields mix64(0x9E3779B97F4A7C15) first.
        assert_eq!(mix64(0x9E37_79B9_7F4A_7C15), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn layer_slices_round_robin_and_stable() {
        let session = mix64(42);
        for nodes in [1u32, 3, 4, 7] {
            for layer in 0..5 {
                let first = node_for(session, layer, 0, nodes);
                for index in 0..50 {
                    let node = node_for(session, layer, index, nodes);
                    assert_eq!(node, (first + index) % nodes, "consecutive slices go round-robin");
                    assert_eq!(node, node_for(session, layer, index, nodes), "same (layer, index), same node");
                }
                let mut counts = vec![0u32; nodes as usize];
                for index in 0..nodes * 10 {
                    counts[node_for(session, layer, index, nodes) as usize] += 1;
                }
                assert!(counts.iter().all(|&c| c == 10), "even spread: {counts:?}");
            }
        }
    }

    #[test]
    fn workers_stable() {
        for index in 0..100 {
            assert_eq!(worker_for(7, index, 4), worker_for(7, index, 4));
            assert!(worker_for(7, index, 4) < 4);
        }
        assert_eq!(worker_for(7, 3, 0), 0);
    }
}
