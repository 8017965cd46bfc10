"""Slice generator for benchmarks/dataplane_bench.py: a separate process, like Jupiter's.

It plays every participant of one round: one mutual-TLS connection and one PushSlices stream
per participant (200 of them by default), with the slices of a VGG-19-shaped update sent in a
"synchronized" order (every participant sends slice k before anyone sends slice k+1) or an
"asynchronized" one with tolerance distance d (participant p lags o_p ~ U{0..d} slices behind
the leader, so at any moment participants are at most d slices apart). Every message is built
and serialized before the clock starts (tee: every slice sealed for the enclave), so the
figure is the aggregator node's, not the generator's Python. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

import grpc
import numpy as np

from confide.transport.certs import Identity
from confide.v1 import runtime_pb2 as pb

SLICE_VALUES = 16_384  # 64 KiB of float32
# VGG-19 (ImageNet): weight and bias sizes of its 16 conv and 3 dense layers, 143.7M parameters.
VGG19 = [
    (3 * 64 * 9, 64), (64 * 64 * 9, 64),
    (64 * 128 * 9, 128), (128 * 128 * 9, 128),
    (128 * 256 * 9, 256), *[(256 * 256 * 9, 256)] * 3,
    (256 * 512 * 9, 512), *[(512 * 512 * 9, 512)] * 3,
    *[(512 * 512 * 9, 512)] * 4,
    (25088 * 4096, 4096), (4096 * 4096, 4096), (4096 * 1000, 1000),
]  # fmt: skip


def vgg19_layout(scale: float) -> list[int]:
    """Slices per layer of VGG-19 (weights and biases as separate layers), scaled down by ``scale``."""
    layers = [size for pair in VGG19 for size in pair]
    return [max(1, round(-(-size // SLICE_VALUES) * scale)) for size in layers]


def schedule(participants: int, slices: int, batch: int, tolerance: int, seed: int) -> list[tuple[int, int]]:
    """(participant, first slice of batch) in sending order."""
    rng = random.Random(seed)
    lag = [0 if tolerance == 0 else rng.randint(0, tolerance) for _ in range(participants)]
    items = [(start + lag[p], rng.random(), p, start) for p in range(participants) for start in range(0, slices, batch)]
    items.sort()
    return [(p, start) for _, _, p, start in items]


def build(args, identities, header_base):
    """Serialized PushMessages: per participant, its header and its batches."""
    from confide.crypto import BatchCryptCodec, DecryptionKey, encrypt_packed
    from confide.protect.tee import seal_slice, slice_aad, wrap_session_key

    rng = np.random.default_rng(7)
    n = args.slices
    headers, batches = [], []
    if args.mode == "paillier":
        key = DecryptionKey.generate(2048)
        codec = BatchCryptCodec(bits=16, max_parties=args.participants, alpha=1.0)
        # Values per slice such that one slice is 128 ciphertexts of 512 B (64 KiB, algorithms.md §6.2).
        slice_values = 128 * codec.layout(2048)[1]
        pool = [encrypt_packed(rng.uniform(-0.5, 0.5, slice_values), codec, key).to_bytes() for _ in range(8)]
        header_base.encryption_key = key.encryption_key.to_bytes()
    else:
        slice_values = SLICE_VALUES
        pool = [rng.standard_normal(SLICE_VALUES).astype("<f4") for _ in range(16)]
    header_base.slice_length = slice_values
    header_base.vector_length = slice_values * n
    header_base.num_slices = n
    aead = None
    if args.mode == "tee":
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        session_key = os.urandom(32)
        header_base.encryption_key = wrap_session_key(session_key, bytes.fromhex(args.enclave_key), args.job)
        aead = AESGCM(session_key)
    for p, identity in enumerate(identities):
        header = pb.RoundHeader()
        header.CopyFrom(header_base)
        header.party_id = identity.name
        headers.append(pb.PushMessage(header=header).SerializeToString())
        mine = []
        for start in range(0, n, args.batch):
            indices = list(range(start, min(n, start + args.batch)))
            if args.mode == "tee":
                payloads = [
                    seal_slice(aead, slice_aad(args.job, 1, 0, p, i), pool[(p + i) % len(pool)]) for i in indices
                ]
            elif args.mode == "paillier":
                payloads = [pool[(p + i) % len(pool)] for i in indices]
            else:
                payloads = [pool[(p + i) % len(pool)].tobytes() for i in indices]
            batch = pb.SliceBatch(
                indices=indices,
                n_valid=[slice_values] * len(indices),
                lengths=[len(x) for x in payloads],
                payload=b"".join(payloads),
            )
            mine.append(pb.PushMessage(batch=batch).SerializeToString())
        batches.append(mine)
    return headers, batches, slice_values


def build_unbatched(batches_one: list[bytes]) -> list[bytes]:
    """The same slices, one per message (the path before batching)."""
    out = []
    for raw in batches_one:
        batch = pb.PushMessage.FromString(raw).batch
        offset = 0
        for index, n_valid, length in zip(batch.indices, batch.n_valid, batch.lengths, strict=True):
            out.append(
                pb.PushMessage(
                    slice=pb.Slice(index=index, n_valid=n_valid, payload=batch.payload[offset : offset + length])
                ).SerializeToString()
            )
            offset += length
    return out


async def run(args) -> dict:
    names = [f"p{p:03d}" for p in range(args.participants)]
    identities = [Identity.load(args.certs, name) for name in names]
    kinds = {
        "plain": pb.AGGREGATION_KIND_FLOAT32_MEAN,
        "tee": pb.AGGREGATION_KIND_TEE_FLOAT32_MEAN,
        "paillier": pb.AGGREGATION_KIND_PAILLIER_PRODUCT,
    }
    header_base = pb.RoundHeader(
        job_id=args.job,
        round=1,
        attempt=0,
        participants=names,
        kind=kinds[args.mode],
        routing=pb.RESULT_ROUTING_ROUND_ROBIN,
        mode=args.mode,
    )
    if args.mode != "paillier":
        header_base.weights.extend([float(1 + p % 7) for p in range(args.participants)])
    began = time.perf_counter()
    headers, batches, slice_values = build(args, identities, header_base)
    if args.unbatched:
        batches = [build_unbatched(b) for b in batches]
        order = schedule(args.participants, args.slices, 1, args.tolerance, args.seed)
        order = [(p, s) for p, s in order]
        per_message = 1
    else:
        order = schedule(args.participants, args.slices, args.batch, args.tolerance, args.seed)
        per_message = args.batch
    payload_bytes = sum(len(m) for b in batches for m in b)
    build_s = time.perf_counter() - began

    channels, calls = [], []
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    for identity in identities:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=identity.ca_pem, private_key=identity.key_pem, certificate_chain=identity.cert_pem
        )
        channel = grpc.aio.secure_channel(args.target, credentials, options=options)
        channels.append(channel)
    for channel in channels:
        await channel.channel_ready()
    push = [
        ch.stream_unary(
            "/confide.v1.Aggregation/PushSlices",
            request_serializer=lambda raw: raw,
            response_deserializer=pb.PushReply.FromString,
        )
        for ch in channels
    ]
    calls = [method() for method in push]
    for call, header in zip(calls, headers, strict=True):
        await call.write(header)
    started = time.perf_counter()
    cpu_started = time.process_time()
    for p, start in order:
        await calls[p].write(batches[p][start // per_message])
    for call in calls:
        await call.done_writing()
    replies = [await call for call in calls]
    seconds = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    for channel in channels:
        await channel.close()
    accepted = sum(r.accepted for r in replies)
    return {
        "mode": args.mode,
        "tolerance": args.tolerance,
        "participants": args.participants,
        "slices": args.slices,
        "slice_values": slice_values,
        "batch": 1 if args.unbatched else args.batch,
        "accepted": accepted,
        "expected": args.participants * args.slices,
        "round_complete": any(r.round_complete for r in replies),  # the last stream to end sees it
        "seconds": seconds,
        "wire_bytes": payload_bytes,
        "mbps": payload_bytes / seconds / 1e6,
        "aggregations_per_s": accepted / seconds,
        "build_s": build_s,
        "generator_cpu_s": cpu_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", required=True)
    parser.add_argument("--certs", required=True)
    parser.add_argument("--job", default="dataplane-bench")
    parser.add_argument("--mode", choices=["plain", "tee", "paillier"], default="plain")
    parser.add_argument("--participants", type=int, default=200)
    parser.add_argument("--slices", type=int, default=80)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tolerance", type=int, default=0)
    parser.add_argument("--unbatched", action="store_true")
    parser.add_argument("--enclave-key", default="")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result), flush=True)
    return 0 if result["accepted"] == result["expected"] and result["round_complete"] else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
