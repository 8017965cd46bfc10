"""Write the fuzzers' seed corpora (fuzz/corpus/<target>/) with the project's real encoders.

Seeds are small valid messages and files, plus a few near-valid ones, so the fuzzers start past
the first checks (magic, lengths, key id) instead of rediscovering the formats. The files are
committed; run this again after a format changes (``.venv/bin/python fuzz/make_corpus.py``).

Ciphertext blocks are made under one fixed 2048-bit Paillier key, kept in fuzz/fixtures/ (made
on the first run, then reused, so seeds stay stable): the Rust and Python block targets parse
under it. It is a test key and protects nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import sys
import tempfile
import threading
import zipfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "python"))

from _common import FIXTURES, framed  # noqa: E402

from confide import _native  # noqa: E402
from confide.crypto import BatchCryptCodec, DecryptionKey, FLBoosterCodec, encrypt_packed  # noqa: E402
from confide.crypto.threshold import PartialDecryption, ThresholdPublicKey  # noqa: E402
from confide.ml.homo_lr import HomoLR  # noqa: E402
from confide.ml.strategies import make_strategy  # noqa: E402
from confide.party import checkpointing  # noqa: E402
from confide.protect import threshold  # noqa: E402
from confide.protect.base import pack_parts  # noqa: E402
from confide.protect.keys import GroupCipher, PeerKeys, encode_fields  # noqa: E402
from confide.protect.verify import pack_tags  # noqa: E402
from confide.transport.certs import Identity, init_federation  # noqa: E402
from confide.v1 import runtime_pb2 as pb  # noqa: E402
from confide.vertical import psi, wire  # noqa: E402
from confide.vertical.channel import LocalChannel  # noqa: E402

CORPUS = HERE / "corpus"


def fixture_key() -> DecryptionKey:
    """The fixed test key (made once with OpenSSL's RSA primes, then read back)."""
    secret = FIXTURES / "paillier_secret_key.bin"
    if not secret.exists():
        from cryptography.hazmat.primitives.asymmetric import rsa

        numbers = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_numbers()
        key = DecryptionKey.from_primes(numbers.p, numbers.q)
        FIXTURES.mkdir(parents=True, exist_ok=True)
        secret.write_bytes(key.export_secret())
        (FIXTURES / "paillier_public_key.bin").write_bytes(key.encryption_key.to_bytes())
    return DecryptionKey.import_secret(secret.read_bytes())


def write(target: str, seeds: list[bytes]) -> None:
    """Replace ``fuzz/corpus/<target>/`` with ``seeds``, each named by its SHA-1 (as libFuzzer does)."""
    folder = CORPUS / target
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for seed in seeds:
        (folder / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    print(f"{target}: {len(seeds)} seeds, {sum(map(len, seeds))} bytes")


def near(seed: bytes) -> list[bytes]:
    """Near-valid variants: truncated by one byte, one byte flipped in the middle, one byte more."""
    middle = len(seed) // 2
    flipped = seed[:middle] + bytes([seed[middle] ^ 0x40]) + seed[middle + 1 :] if seed else b""
    return [seed[:-1], flipped, seed + b"\x00"]


def blocks(key: DecryptionKey) -> list[bytes]:
    """A raw, a BatchCrypt-packed and an FLBooster-packed ciphertext block under the fixture key."""
    public = key.encryption_key
    values = np.array([0.5, -0.25, 0.125, 1.0, -1.0], dtype=np.float32)
    return [
        public.encrypt(np.array([1, -2, 3])).to_bytes(),
        encrypt_packed(values, BatchCryptCodec(bits=8, max_parties=4), public).to_bytes(),
        encrypt_packed(values, FLBoosterCodec(bits=16, max_parties=4), public).to_bytes(),
    ]


def codec_params(block: bytes) -> bytes:
    """The TLV parameters of a block (magic 4, key id 16, count 4, elem_len 2, encoding 1, then u16 length)."""
    length = int.from_bytes(block[27:29], "big")
    return block[29 : 29 + length]


def header(kind: int, key: bytes = b"", **overrides) -> pb.RoundHeader:
    """A round header of two participants, ``a`` first, three slices of four values."""
    fields = dict(
        job_id="fuzz",
        round=1,
        attempt=0,
        party_id="a",
        participants=["a", "b"],
        kind=kind,
        num_slices=3,
        slice_length=4,
        vector_length=10,
        routing=pb.RESULT_ROUTING_ALL,
        mode="plain",
        encryption_key=key,
    )
    fields.update(overrides)
    return pb.RoundHeader(**fields)


def push_streams(key: DecryptionKey) -> list[bytes]:
    """PushSlices streams: plain float32 slices (one at a time and batched), masked words, ciphertexts."""
    floats = [np.arange(n, dtype="<f4").tobytes() for n in (4, 4, 2)]
    plain = pb.PushMessage(header=header(pb.AGGREGATION_KIND_FLOAT32_SUM)).SerializeToString()
    single = [pb.PushMessage(slice=pb.Slice(index=i, n_valid=len(p) // 4, payload=p)) for i, p in enumerate(floats)]
    batch = pb.PushMessage(
        batch=pb.SliceBatch(
            indices=[0, 1, 2], n_valid=[4, 4, 2], lengths=[len(p) for p in floats], payload=b"".join(floats)
        )
    )
    masked = pb.PushMessage(header=header(pb.AGGREGATION_KIND_UINT32_SUM, mode="secagg")).SerializeToString()
    public = key.encryption_key
    ciphertexts = [public.encrypt(np.array([i, i + 1])).to_bytes() for i in range(3)]
    paillier = pb.PushMessage(
        header=header(pb.AGGREGATION_KIND_PAILLIER_PRODUCT, public.to_bytes(), mode="paillier")
    ).SerializeToString()
    encrypted = pb.PushMessage(
        batch=pb.SliceBatch(
            indices=[0, 1, 2], n_valid=[4, 4, 2], lengths=[len(c) for c in ciphertexts], payload=b"".join(ciphertexts)
        )
    )
    # Lattice words (two values a word mod q): all under q, and one at q (refused, nothing kept).
    lattice = pb.PushMessage(header=header(pb.AGGREGATION_KIND_RLWE_SUM, mode="lattice")).SerializeToString()
    q = 0x3FFF_FFEE_0000_0001
    words = [np.array([1, q - 1], dtype="<u8"), np.array([2, 3], dtype="<u8"), np.array([q - 2], dtype="<u8")]

    def rlwe_batch(words: list[np.ndarray]) -> bytes:
        payloads = [w.tobytes() for w in words]
        return pb.PushMessage(
            batch=pb.SliceBatch(
                indices=[0, 1, 2], n_valid=[4, 4, 2], lengths=[len(p) for p in payloads], payload=b"".join(payloads)
            )
        ).SerializeToString()

    return [
        framed(lattice, rlwe_batch(words)),
        framed(lattice, rlwe_batch([words[0], np.array([4, q], dtype="<u8"), words[2]])),
        framed(plain, *(m.SerializeToString() for m in single)),
        framed(plain, batch.SerializeToString()),
        framed(plain, batch.SerializeToString(), batch.SerializeToString()),
        framed(masked, batch.SerializeToString()),
        framed(paillier, encrypted.SerializeToString()),
        framed(plain),
    ]


def store_files(key: DecryptionKey) -> list[bytes]:
    """A completed round and a job key as a restarted aggregator reads them back."""
    from confide.aggregator.store import ResultStore

    with tempfile.TemporaryDirectory() as directory:
        store = ResultStore(directory)
        store.save(header(pb.AGGREGATION_KIND_FLOAT32_SUM), {0: b"\x00" * 16, 1: b"\x01" * 16, 2: b"\x02" * 8})
        store.save_key("fuzz", key.encryption_key.to_bytes())
        job = Path(directory) / "fuzz"
        stored = (job / "round-1-0.bin").read_bytes(), (job / "encryption_key.bin").read_bytes()
    return [framed(*stored), framed(stored[0]), *(framed(variant, stored[1]) for variant in near(stored[0]))]


def psi_transcripts() -> tuple[list[bytes], list[bytes]]:
    """A real intersection's messages: (what the host received, what the guest received), framed."""
    channels = LocalChannel.group(["g", "h"])
    ids = {"g": ["r1", "r2", "r3"], "h": ["r2", "r3", "r4"]}
    roles = {"g": "guest", "h": "host"}
    threads = [
        threading.Thread(
            target=psi.intersect,
            args=(channels[p], ids[p]),
            kwargs=dict(role=roles[p], guest="g", hosts=["h"], session="fuzz", threads=1),
        )
        for p in ("g", "h")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    received: dict[str, list[bytes]] = {"g": [], "h": []}
    for _sender, recipients, _key, payload in channels["g"].transcript:
        for recipient in recipients:
            received[recipient].append(payload)
    return [b"\x00" + framed(*received["h"])], [b"\x01" + framed(*received["g"])]


def checkpoint_files() -> list[bytes]:
    """A real format-2 checkpoint written by the runner, and a format-1 one (flat weights.npy)."""
    import party_checkpoint

    seeds = []
    with tempfile.TemporaryDirectory() as directory:
        model, layout = party_checkpoint.model_and_layout()
        model.set_weights({"lr/coef": np.arange(4.0), "lr/intercept": np.array([0.5])})
        strategy = make_strategy("fedadam")
        strategy.load_state({"m": np.zeros(5), "v": np.ones(5)})
        checkpointing.write_checkpoint(Path(directory), party_checkpoint.ROUND, model, layout, strategy, ["a", "b"])
        target = Path(directory) / f"round-{party_checkpoint.ROUND:06d}"
        seeds.append(framed(*((target / name).read_bytes() for name in party_checkpoint.FILES[:4])))
    flat = io.BytesIO()
    np.save(flat, np.arange(5.0))
    state = json.dumps({"round": party_checkpoint.ROUND}).encode()
    seeds.append(framed(state, b"", b"", b"", flat.getvalue()))
    return seeds


def model_files() -> list[bytes]:
    """A model artifact (.model.zip) as a party writes one, and a saved Homo LR model."""
    weights = io.BytesIO()
    np.savez(weights, **{"lr/coef": np.arange(4.0), "lr/intercept": np.array([0.5])})
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as out:
        out.writestr("manifest.json", json.dumps({"format": "confide.model", "version": 1, "party": "a"}))
        out.writestr("weights.npz", weights.getvalue())
    stored = io.BytesIO()
    with zipfile.ZipFile(stored, "w", compression=zipfile.ZIP_STORED) as out:
        out.writestr("manifest.json", "[]")
        out.writestr("weights.npz", weights.getvalue())
    model = HomoLR()
    model.set_weights(np.array([0.1, 0.2, 0.3]))
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "model.npz"
        model.save(path)
        saved = path.read_bytes()
    return [b"\x00" + archive.getvalue(), b"\x00" + stored.getvalue(), b"\x01" + saved]


def recovery_messages() -> list[bytes]:
    """A SecAgg recovery reveal (own seed, shares of two secrets) and a share message, and near misses."""
    from confide.crypto import shamir

    first = shamir.split(bytes(range(32)), [1, 2, 3], 2)
    second = shamir.split(b"\x07" * 32, [1, 2, 3], 2)
    reveal = encode_fields(**{"self/b": b"\x01" * 32, "b/site-2": first[1], "k/site-2/site-3": second[1]})
    shares = encode_fields(b=first[2], **{"k/site-3": second[2]})
    return [reveal, shares, encode_fields(b=first[3]), *near(reveal)]


def bound_messages() -> list[bytes]:
    """A bound proof message of 3 values (one chunk) and of 65 (two), one with a norm proof, and near-valid variants."""
    context = b"confide-bound-v1 fuzz"
    values = np.array([5, 2**32 - 3, 7], dtype=np.uint32)
    small = _native.bound_prove(context, values, 32, 16, [bytes(16)], [True])
    normed = _native.bound_prove(context, values, 32, 16, [bytes(16)], [True], 10)
    words = np.arange(65, dtype=np.uint32)
    large = _native.bound_prove(context, words, 32, 8, [bytes(range(16))], [False])
    return [small, large, normed, *near(small), *near(normed)[:2]]


def main() -> None:
    """Write every target's seeds."""
    key = fixture_key()
    public = key.encryption_key
    n = public.n
    vector_blocks = blocks(key)
    message = {"protocol": "x", "points": b"\x01" * 64, "array": np.arange(6, dtype="<i8").reshape(2, 3)}
    message.update({"nested": {"list": [1, 2.5, None, "s", True]}, "nan": float("nan")})
    encoded = [wire.encode(message), wire.encode({"a": 1}), wire.encode({"e": np.zeros(0, dtype="<f4")})]
    write("vertical_wire", encoded + near(encoded[0]))
    fields = encode_fields(public=b"\x02" * 32, certificate=b"-----BEGIN CERTIFICATE-----", signature=b"\x30\x00")
    write("key_fields", [fields, encode_fields(public="text", n=3), *near(fields)])
    parts = pack_parts({0: np.arange(3, dtype="<f4"), 3: np.ones(2, dtype="<f4")})
    write("decrypted_shares", [parts, pack_parts({}), *near(parts)])
    one_tag = pack_tags([(bytes(range(16)), [1, 2**64 - 1])], 2)
    tags = pack_tags([(bytes([i]) * 16, [i, i * 7, 2**31 - 2, 5]) for i in range(3)], 4)
    write("verify_tags", [one_tag, tags, pack_tags([], 2), *near(tags)])
    write("bound_proofs", bound_messages())
    write("secagg_recovery", recovery_messages())
    with tempfile.TemporaryDirectory() as directory:
        init_federation(directory, parties=["a", "b"])
        announcement = PeerKeys(Identity.load(directory, "b"), "fuzz-job").announcement()
    sealed = GroupCipher(bytes(range(32)), "fuzz-job").seal("fuzz/tag", "b", b"hello")
    write("sealed_messages", [b"\x00" + sealed, b"\x01" + announcement, b"\x01" + fields])
    write(
        "native_keys", [b"\x00" + public.to_bytes(), b"\x01" + key.export_secret(), *near(b"\x00" + public.to_bytes())]
    )
    write("encrypted_vector", vector_blocks + near(vector_blocks[1]))
    threshold_public = ThresholdPublicKey(n, 3, 2, 12345, 4, (5, 6, 7), False).to_bytes()
    partial = PartialDecryption(1, (2, n * n - 1), 99, -5).to_bytes(n)
    dealt = encode_fields(public=threshold_public, share=b"\x01\x02")
    write(
        "threshold_messages",
        [b"\x00" + threshold_public, b"\x01" + partial, b"\x02" + threshold._pack_blobs({0: partial}), b"\x03" + dealt],
    )
    host_seeds, guest_seeds = psi_transcripts()
    write("psi_messages", host_seeds + guest_seeds)
    write("push_stream", push_streams(key))
    envelope = pb.Envelope(job_id="fuzz", round=2, tag="t", sender="a", recipients=["b"], payload=b"x")
    fetch = pb.FetchRequest(job_id="fuzz", round=1, attempt=0, indices=[0, 1])
    write("aggregator_requests", [b"\x00" + envelope.SerializeToString(), b"\x01" + fetch.SerializeToString()])
    write("aggregator_store", store_files(key))
    leaves = [
        {"name": "model.npz", "sha256": "ab" * 32, "size": 10},
        {"name": "state.json", "sha256": "0" * 64, "size": 0},
    ]
    write("checkpoint_manifest", [json.dumps({"a": leaves}).encode(), json.dumps(leaves).encode()])
    write("party_checkpoint", checkpoint_files())
    write("model_artifact", model_files())
    # Rust targets (fuzz/rust/fuzz_targets/).
    write("paillier_public_key", [public.to_bytes()])
    write("paillier_secret_key", [key.export_secret()])
    write("ciphertext_block", vector_blocks)
    write("codec_params", [b"\x01" + codec_params(vector_blocks[1]), b"\x00" + codec_params(vector_blocks[2])])
    stream = push_streams(key)[1]
    write("slice_batch", _frames(stream))
    psi_key = _native.PsiKey.generate()
    ids = b"r1r2r3"
    points = psi_key.hash_and_blind(b"confide-psi-v1|fuzz|str", ids, np.array([0, 2, 4, 6], dtype=np.uint64), 1)
    write("psi_points", [b"\x00" + points, b"\x01" + _native.PsiKey.tags(points, 1) * 2])
    # flags (1: words reduced under q, 2: but one raw, 4: a byte short), length (u16), raw index (u16), bytes
    write("rlwe_fold", [bytes([1, 16, 0, 0, 0]) + bytes(range(64)), bytes([3, 0, 9, 0x10, 8]) + bytes(range(200, 256))])


def _frames(data: bytes) -> list[bytes]:
    from _common import frames

    return list(frames(data))


if __name__ == "__main__":
    main()
