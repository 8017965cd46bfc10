"""Threshold Paillier with distributed key generation: t of m parties decrypt, no one holds the key.

The key is made by the m parties together (no dealer), as a protocol over an abstract
:class:`Channel`, so the same code runs in a test harness and over the aggregator's relay.
Numbered steps follow algorithms.md §1.12; every step is semi-honest (a party that deviates
during key generation is caught only where a check below says so), and every partial
decryption after it carries a proof, so a party that lies at decryption time is named.

1. **Modulus** (Boneh-Franklin, batched, with distributed sieving). Each party draws random units
   a_i of Z_M, M the product of the primes above m while it fits in half of p's bits (~70
   primes, 5 to ~350, at k = 2048); BGW over Z_M (every prime factor of M exceeds m, so the
   points' differences invert) multiplies them and turns the product a into additive shares
   b_i mod M (in residues modulo each prime of M, numpy arithmetic). Party i's share of p is
   4 (b_i / 4 mod M) + 4 M r_i, party 1 adding the constant that is 3 mod 4, cancels its
   offset mod M and fixes the top two bits: so p = a (mod M) has
   no prime factor of M, is 3 mod 4, and N = pq has exactly k bits. BGW over a prime field
   P > 2^k with polynomials of degree d = floor((m-1)/2), plus a random sharing of zero of
   degree 2d, reveals N = pq and nothing else (honest majority: privacy against d colluders).
   Public N are trial-divided by the primes below 2^18; survivors get the Boneh-Franklin
   biprimality test with public-coin g (Jacobi(g|N) = 1): party 1 publishes
   g^((N - p_1 - q_1 + 1)/4), the others g^((p_i + q_i)/4), and N passes when the quotient is
   +-1 mod N, 40 times. The expected number of candidates is (ln 2^(k/2) prod(1 - 1/r) / 2)^2
   over the primes r of M: ~10,000 at k = 2048 and m = 3, against ~126,000 without sieving
   (:func:`.keygen.expected_candidates`), which is why candidates still travel in batches.
2. **Secret** s = beta * phi(N), with phi(N) = N - sum(p_i + q_i) + 1 additively shared and
   beta = sum beta_i random: the cross products beta_i * phi_j are computed pairwise with a
   throw-away Paillier key of party i (Gilboa-style: j answers E_i(beta_i)^phi_j * E_i(r) and
   keeps -r, r statistically hiding by 128 bits), giving integer additive shares s_i of s.
   theta = s mod N is revealed through pairwise-cancelling masks, so only the sum is seen.
3. **Threshold sharing.** Each party shares s_i with an integer polynomial of degree t-1
   (coefficients 128 bits above the secret's size) and publishes Feldman commitments
   v^coefficient mod N^2 for a public-coin square v. A received share that does not match its
   commitments names the sender. d_j = sum_i f_i(j); every verification key
   v_j = v^(Delta * d_j) (Delta = m!) is computed from the commitments, so no party can lie
   about its own.

Decryption of c: party j sends c_j = c^(2 Delta d_j) mod N^2 with a proof (Fiat-Shamir,
batched over a vector with 128-bit random coefficients) that log_(C^4) C_j^2 = log_v v_j; any t
partials combine with integer Lagrange coefficients lambda_j = Delta * prod j'/(j'-j) to
c^(4 Delta^2 s) = 1 + 4 Delta^2 theta m N mod N^2, so m = L(.) / (4 Delta^2 theta) mod N.

Costs on this 2-core AVX-512 IFMA host (2048-bit N): a partial decryption raises a ciphertext
to a ~4,400-bit exponent mod N^2 (no CRT: nobody knows p and q), eight ciphertexts per
IFMA exponentiation: 1.6 ms per ciphertext against 0.24 ms for the CRT decryption of
``paillier``, 1.9 ms with the proof (Pippenger's multi-exponentiation for the batch weights);
checking a proof costs 0.3 ms per ciphertext. benchmarks/threshold_bench.py measures rounds
and key generation.

Modules: :mod:`.channel` (how parties talk; which (t, m) can run), :mod:`.keys` (keys,
constants, encodings), :mod:`.keygen` (steps 1-3, and a dealer), :mod:`.decryption` (partial
decryptions, proofs, combination).
"""

from __future__ import annotations

from confide.crypto.threshold.channel import Channel, CheatingPartyError, LocalChannels, check_threshold
from confide.crypto.threshold.decryption import (
    PartialDecryption,
    combine_partials,
    decrypt_packed_threshold,
    partial_decrypt,
    verify_partial,
)
from confide.crypto.threshold.keygen import (
    deal_threshold_keys,
    encrypt_integers,
    generate_locally,
    generate_threshold_key,
)
from confide.crypto.threshold.keys import ThresholdKey, ThresholdPublicKey

__all__ = [
    "Channel",
    "CheatingPartyError",
    "LocalChannels",
    "PartialDecryption",
    "ThresholdKey",
    "ThresholdPublicKey",
    "check_threshold",
    "combine_partials",
    "deal_threshold_keys",
    "decrypt_packed_threshold",
    "encrypt_integers",
    "generate_locally",
    "generate_threshold_key",
    "partial_decrypt",
    "verify_partial",
]
