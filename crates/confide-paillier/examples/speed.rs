//! Quick per-operation timings of the Rust core (no Python): `cargo run --release --example speed -- 2048 8`.
//! The benchmark of record is benchmarks/crypto_bench.py, which also measures the anchors.
use confide_paillier::{with_threads, DecryptionKey, Integer, Randomizer};
use std::time::Instant;

fn rate(label: &str, count: usize, f: impl FnOnce()) {
    let start = Instant::now();
    f();
    let seconds = start.elapsed().as_secs_f64();
    println!("{label:<32} {:>10.0} ops/s", count as f64 / seconds);
}

fn main() -> confide_paillier::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let bits: u32 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2048);
    let window: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(8);
    let start = Instant::now();
    let key = DecryptionKey::generate(bits)?;
    println!("keygen {bits}: {:.2} s", start.elapsed().as_secs_f64());
    let public = key.encryption_key().with_window(window)?;
    let key = DecryptionKey::from_primes(key.primes().0.clone(), key.primes().1.clone(), Some(public.clone()))?;
    let start = Instant::now();
    let bytes = public.precompute()? + key.precompute()?;
    println!("tables (w={window}): {:.2} s, {:.1} MiB", start.elapsed().as_secs_f64(), bytes as f64 / 1048576.0);
    let plaintexts: Vec<Integer> = (0..400u32).map(|i| Integer::from(i) * 1_000_003u32).collect();
    for threads in [1usize, 2] {
        with_threads(threads, || -> confide_paillier::Result<()> {
            let mut cts = Vec::new();
            rate(&format!("encrypt public t{threads}"), plaintexts.len(), || {
                cts = public.encrypt_many(&plaintexts, Randomizer::FixedBase).unwrap_or_default()
            });
            rate(&format!("encrypt holder t{threads}"), plaintexts.len(), || {
                cts = key.encrypt_many(&plaintexts, Randomizer::FixedBase).unwrap_or_default()
            });
            rate(&format!("encrypt classical t{threads}"), 40, || {
                let _ = public.encrypt_many(&plaintexts[..40], Randomizer::Classical);
            });
            let sub = &cts[..200];
            rate(&format!("decrypt t{threads}"), sub.len(), || {
                let _ = key.decrypt_many(sub);
            });
            let many: Vec<&[confide_paillier::Ciphertext]> = (0..16).map(|_| &cts[..]).collect();
            rate(&format!("add (sum of 16) t{threads}"), cts.len() * 15, || {
                let _ = public.sum_many(&many);
            });
            rate(&format!("add pairwise mpz t{threads}"), cts.len(), || {
                for (a, b) in cts.iter().zip(cts.iter().rev()) {
                    std::hint::black_box(public.add(a, b));
                }
            });
            let scalars: Vec<Integer> = (0..cts.len() as u32).map(|i| Integer::from(731_234u32 + i)).collect();
            rate(&format!("scalar mul 20-bit t{threads}"), cts.len(), || {
                let _ = public.mul_scalar_many(&cts, &scalars);
            });
            Ok(())
        })??;
    }
    Ok(())
}
