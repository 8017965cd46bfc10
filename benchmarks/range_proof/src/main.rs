//! Seconds a party would spend proving (and a checker verifying) that each value of its update
//! lies in [0, 2^bits), with aggregated Bulletproofs range proofs of `m` values each (the dalek
//! `bulletproofs` crate). One JSON line per (bits, m): the bound-proof records of
//! benchmarks/robust_bench.py. Usage: `range-proof-cost [repeats]`.

use bulletproofs::{BulletproofGens, PedersenGens, RangeProof};
use curve25519_dalek::scalar::Scalar;
use merlin::Transcript;
use std::time::Instant;

fn main() {
    let repeats: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(3);
    let pedersen = PedersenGens::default();
    let mut rng = rand::thread_rng();
    for &(bits, m) in &[(16usize, 64usize), (16, 256), (32, 64)] {
        let generators = BulletproofGens::new(bits, m);
        let values: Vec<u64> = (0..m as u64).map(|i| (i * 7919) % (1u64 << bits)).collect();
        let blindings: Vec<Scalar> = (0..m).map(|_| Scalar::random(&mut rng)).collect();
        let (mut prove, mut verify) = (Vec::new(), Vec::new());
        let mut bytes = 0;
        for _ in 0..repeats {
            let began = Instant::now();
            let mut transcript = Transcript::new(b"confide-bound");
            let (proof, commitments) =
                RangeProof::prove_multiple(&generators, &pedersen, &mut transcript, &values, &blindings, bits)
                    .expect("values are in range");
            prove.push(began.elapsed().as_secs_f64());
            let began = Instant::now();
            let mut transcript = Transcript::new(b"confide-bound");
            proof.verify_multiple(&generators, &pedersen, &mut transcript, &commitments, bits).expect("proof verifies");
            verify.push(began.elapsed().as_secs_f64());
            bytes = proof.to_bytes().len();
        }
        prove.sort_by(f64::total_cmp);
        verify.sort_by(f64::total_cmp);
        let (p, v) = (prove[repeats / 2], verify[repeats / 2]);
        println!(
            "{{\"bits\": {bits}, \"values_per_proof\": {m}, \"prove_s\": {p:.6}, \"verify_s\": {v:.6}, \
             \"proof_bytes\": {bytes}, \"commitment_bytes_per_value\": 32}}"
        );
    }
}
