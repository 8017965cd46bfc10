import hashlib
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confide.crypto.merkle import EMPTY_ROOT, MerkleTree, leaf_data, leaf_hash, merkle_root, node_hash, verify_proof
from confide.errors import InvalidParameterError

names = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
digests = st.binary(min_size=32, max_size=32).map(bytes.hex)
sizes = st.integers(min_value=0, max_value=2**64 - 1)
leaf_maps = st.dictionaries(names, st.tuples(digests, sizes), min_size=1, max_size=24)


def as_leaves(mapping):
    return [(name, digest, size) for name, (digest, size) in mapping.items()]


def digest_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def reference_root(leaves) -> str:
    """RFC 6962 MTH, written independently: split at the largest power of two below n."""

    def mth(hashes):
        if len(hashes) == 1:
            return hashes[0]
        k = 1
        while k * 2 < len(hashes):
            k *= 2
        return hashlib.sha256(b"\x01" + mth(hashes[:k]) + mth(hashes[k:])).digest()

    ordered = sorted(leaves)
    if not ordered:
        return hashlib.sha256(b"").hexdigest()
    return mth([hashlib.sha256(b"\x00" + leaf_data(*leaf)).digest() for leaf in ordered]).hex()


def test_empty_tree_is_hash_of_empty_string():
    assert EMPTY_ROOT == hashlib.sha256(b"").hexdigest()
    assert merkle_root([]) == EMPTY_ROOT
    assert MerkleTree([]).root == EMPTY_ROOT


def test_leaf_data_layout_and_domain_separation():
    digest = digest_of("x")
    data = leaf_data("model.npz", digest, 300)
    name = b"model.npz"
    assert data.endswith(len(name).to_bytes(4, "big") + name + bytes.fromhex(digest) + (300).to_bytes(8, "big"))
    assert leaf_hash("model.npz", digest, 300) == hashlib.sha256(b"\x00" + data).digest()
    assert leaf_data("model.npz", digest.upper(), 300) == data
    # length prefix: moving bytes between name and the rest cannot give the same encoding
    assert leaf_data("ab", digest, 1) != leaf_data("a", digest, 1)


def test_single_leaf_root_is_leaf_hash_and_proof_is_empty():
    tree = MerkleTree([("a", digest_of("a"), 1)])
    assert tree.root == leaf_hash("a", digest_of("a"), 1).hex()
    assert tree.proof("a") == []
    assert verify_proof(tree.root, "a", digest_of("a"), 1, [])


def test_three_leaves_promote_the_odd_node():
    leaves = [("c", digest_of("c"), 3), ("a", digest_of("a"), 1), ("b", digest_of("b"), 2)]
    la, lb, lc = (leaf_hash(n, d, s) for n, d, s in sorted(leaves))
    expected = node_hash(node_hash(la, lb), lc)  # c promoted, not paired with itself
    assert merkle_root(leaves) == expected.hex()
    assert merkle_root(leaves) != node_hash(node_hash(la, lb), node_hash(lc, lc)).hex()
    tree = MerkleTree(leaves)
    assert tree.proof("c") == [("L", node_hash(la, lb).hex())]
    assert tree.proof("a") == [("R", lb.hex()), ("R", lc.hex())]
    assert tree.names == ("a", "b", "c")
    assert len(tree) == 3 and "b" in tree and "d" not in tree


def test_duplicate_names_are_refused_by_name():
    with pytest.raises(InvalidParameterError, match="state.json"):
        MerkleTree([("state.json", digest_of("1"), 1), ("model", digest_of("2"), 2), ("state.json", digest_of("3"), 3)])


@pytest.mark.parametrize(
    "leaf",
    [
        ("", "0" * 64, 1),
        (b"name", "0" * 64, 1),
        ("\ud800", "0" * 64, 1),
        ("n", "0" * 63, 1),
        ("n", "g" * 64, 1),
        ("n", " " + "0" * 63, 1),
        ("n", "0" * 64, -1),
        ("n", "0" * 64, 2**64),
        ("n", "0" * 64, True),
        ("n", "0" * 64, 1.0),
        ("n", "0" * 64),
        "abc",
    ],
)
def test_malformed_leaves_are_refused(leaf):
    with pytest.raises(InvalidParameterError):
        MerkleTree([leaf])


def test_proof_of_unknown_name_is_refused():
    with pytest.raises(InvalidParameterError, match="missing.bin"):
        MerkleTree([("a", digest_of("a"), 1)]).proof("missing.bin")


@pytest.mark.parametrize(
    "proof",
    [
        "L" + "0" * 64,
        [("X", "0" * 64)],
        [("L", "zz")],
        [("L",)],
        [("L", "0" * 64, "extra")],
        [("L", b"\x00" * 32)],
        None,
    ],
)
def test_malformed_proofs_are_false(proof):
    tree = MerkleTree([("a", digest_of("a"), 1), ("b", digest_of("b"), 2)])
    assert not verify_proof(tree.root, "a", digest_of("a"), 1, proof)


def test_malformed_root_is_false():
    tree = MerkleTree([("a", digest_of("a"), 1), ("b", digest_of("b"), 2)])
    proof = tree.proof("a")
    assert not verify_proof("nothex", "a", digest_of("a"), 1, proof)
    assert not verify_proof(tree.root[:-2], "a", digest_of("a"), 1, proof)
    assert MerkleTree.verify_proof(tree.root.upper(), "a", digest_of("a"), 1, proof)


@settings(max_examples=60, deadline=None)
@given(leaf_maps, st.randoms(use_true_random=False))
def test_root_is_independent_of_input_order_and_matches_rfc6962(mapping, rnd):
    leaves = as_leaves(mapping)
    shuffled = list(leaves)
    rnd.shuffle(shuffled)
    assert merkle_root(shuffled) == merkle_root(leaves) == reference_root(leaves)


@settings(max_examples=60, deadline=None)
@given(leaf_maps, st.data())
def test_any_single_change_changes_the_root(mapping, data):
    leaves = sorted(as_leaves(mapping))
    root = merkle_root(leaves)
    index = data.draw(st.integers(0, len(leaves) - 1))
    name, digest, size = leaves[index]
    changed = list(leaves)

    kind = data.draw(st.sampled_from(["byte", "size", "rename", "remove", "add"]))
    if kind == "byte":
        raw = bytearray.fromhex(digest)
        position = data.draw(st.integers(0, 31))
        raw[position] ^= data.draw(st.integers(1, 255))
        changed[index] = (name, raw.hex(), size)
    elif kind == "size":
        new_size = data.draw(sizes.filter(lambda value: value != size))
        changed[index] = (name, digest, new_size)
    elif kind == "rename":
        new_name = data.draw(names.filter(lambda value: value not in mapping))
        changed[index] = (new_name, digest, size)
    elif kind == "remove":
        del changed[index]
    else:
        new_name = data.draw(names.filter(lambda value: value not in mapping))
        changed.append((new_name, data.draw(digests), data.draw(sizes)))
    assert merkle_root(changed) != root


@settings(max_examples=40, deadline=None)
@given(leaf_maps, st.data())
def test_proofs_verify_for_every_leaf_and_fail_when_wrong(mapping, data):
    leaves = as_leaves(mapping)
    tree = MerkleTree(leaves)
    for name, digest, size in leaves:
        proof = tree.proof(name)
        assert len(proof) <= max(0, (len(leaves) - 1).bit_length())
        assert verify_proof(tree.root, name, digest, size, proof)
        assert verify_proof(tree.root, name, digest, size, json.loads(json.dumps(proof)))
        wrong = data.draw(digests.filter(lambda value, digest=digest: value != digest))
        assert not verify_proof(tree.root, name, wrong, size, proof)
        assert not verify_proof(tree.root, name, digest, size ^ 1, proof)
        assert not verify_proof(tree.root, name + "x", digest, size, proof)
        if proof:
            side, sibling = proof[0]
            flipped = [("R" if side == "L" else "L", sibling)] + proof[1:]
            assert not verify_proof(tree.root, name, digest, size, flipped)
            assert not verify_proof(tree.root, name, digest, size, proof[:-1])


def test_proof_for_other_leaf_does_not_verify():
    leaves = [(f"f{i}", digest_of(str(i)), i) for i in range(7)]
    tree = MerkleTree(leaves)
    rng = random.Random(0)
    for name, digest, size in leaves:
        other = rng.choice([leaf for leaf in leaves if leaf[0] != name])
        assert not verify_proof(tree.root, name, digest, size, tree.proof(other[0]))
