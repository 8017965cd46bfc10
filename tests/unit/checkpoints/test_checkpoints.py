import hashlib
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confide import checkpoints
from confide.checkpoints import (
    CheckpointError,
    combine,
    compare,
    file_sha256,
    latest,
    manifest,
    root_of,
    round_name,
    verify,
    write_checkpoint,
)
from confide.crypto.merkle import EMPTY_ROOT, MerkleTree, merkle_root, verify_proof
from confide.errors import ConfideError, InvalidParameterError

FILES = {"model.npz": b"\x93NUMPY weights", "state.json": b'{"round": 12}', "extra/opt.bin": b"\x00" * 10}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def leftovers(parent: Path) -> list[str]:
    return sorted(path.name for path in parent.iterdir()) if parent.exists() else []


def can_symlink(tmp_path: Path) -> bool:
    try:
        os.symlink(tmp_path / "nowhere", tmp_path / ".probe")
    except (OSError, NotImplementedError):
        return False
    os.unlink(tmp_path / ".probe")
    return True


def test_error_is_a_confide_error():
    assert issubclass(CheckpointError, ConfideError)
    assert CheckpointError("x").problems == []


def test_file_sha256_streams_large_files(tmp_path):
    data = os.urandom((1 << 20) * 2 + 12345)
    (tmp_path / "big").write_bytes(data)
    (tmp_path / "empty").write_bytes(b"")
    assert file_sha256(tmp_path / "big") == sha(data)
    assert file_sha256(str(tmp_path / "empty")) == sha(b"")
    with pytest.raises(CheckpointError, match="absent"):
        file_sha256(tmp_path / "absent")


def test_manifest_lists_regular_files_recursively_sorted(tmp_path):
    root = tmp_path / "round-000001"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "empty-dir").mkdir()
    (root / "b.txt").write_bytes(b"bb")
    (root / "a.txt").write_bytes(b"a")
    (root / "sub" / "deeper" / "c.bin").write_bytes(b"ccc")
    assert manifest(root) == [
        {"name": "a.txt", "sha256": sha(b"a"), "size": 1},
        {"name": "b.txt", "sha256": sha(b"bb"), "size": 2},
        {"name": "sub/deeper/c.bin", "sha256": sha(b"ccc"), "size": 3},
    ]
    assert [leaf["name"] for leaf in manifest(root, prefix="round-000001/")] == [
        "round-000001/a.txt",
        "round-000001/b.txt",
        "round-000001/sub/deeper/c.bin",
    ]


def test_manifest_of_missing_directory_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="nope"):
        manifest(tmp_path / "nope")


def test_symlinks_are_refused_by_path(tmp_path):
    if not can_symlink(tmp_path):
        pytest.skip("symlinks not available")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"s")
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "real").write_bytes(b"r")
    os.symlink(outside / "secret", root / "link-to-file")
    with pytest.raises(CheckpointError, match="link-to-file") as caught:
        manifest(root)
    assert [problem["name"] for problem in caught.value.problems] == ["link-to-file"]
    os.unlink(root / "link-to-file")
    os.symlink(outside, root / "link-to-dir", target_is_directory=True)
    with pytest.raises(CheckpointError, match="link-to-dir"):
        manifest(root)


def test_write_checkpoint_is_complete_and_matches_manifest(tmp_path):
    target = tmp_path / "checkpoints" / "round-000012"
    leaves = write_checkpoint(target, FILES)
    assert leaves == manifest(target)
    assert [leaf["name"] for leaf in leaves] == ["extra/opt.bin", "model.npz", "state.json"]
    assert (target / "state.json").read_bytes() == FILES["state.json"]
    assert leftovers(target.parent) == ["round-000012"]
    verify(target, leaves)


def test_write_checkpoint_accepts_bytearray_and_memoryview(tmp_path):
    leaves = write_checkpoint(tmp_path / "c", {"a": bytearray(b"xy"), "b": memoryview(b"xyz"), "e": b""})
    assert leaves == manifest(tmp_path / "c")
    assert [leaf["size"] for leaf in leaves] == [2, 3, 0]


def test_write_checkpoint_refuses_existing_directory(tmp_path):
    target = tmp_path / "round-000003"
    target.mkdir()
    with pytest.raises(CheckpointError, match="round-000003"):
        write_checkpoint(target, FILES)
    assert leftovers(tmp_path) == ["round-000003"]
    assert leftovers(target) == []


@pytest.mark.parametrize(
    "files",
    [
        {"../escape": b"x"},
        {"/abs": b"x"},
        {"a//b": b"x"},
        {"./a": b"x"},
        {"a\\b": b"x"},
        {"": b"x"},
        {"a": b"x", "a/b": b"y"},
        {"a": "not bytes"},
        {"a": None},
    ],
)
def test_write_checkpoint_refuses_bad_files_before_writing(tmp_path, files):
    with pytest.raises(InvalidParameterError):
        write_checkpoint(tmp_path / "round-000001", files)
    assert leftovers(tmp_path) == []


def test_a_streamed_file_gets_the_manifest_its_bytes_would(tmp_path):
    streamed = {name: (lambda file, data=data: file.write(data)) for name, data in FILES.items()}
    leaves = write_checkpoint(tmp_path / "round-000002", streamed)
    assert leaves == write_checkpoint(tmp_path / "round-000003", FILES)
    assert leaves == manifest(tmp_path / "round-000002")
    verify(tmp_path / "round-000002", leaves)
    with pytest.raises(InvalidParameterError, match=r"files\['x'\] must be bytes or a function writing a file"):
        write_checkpoint(tmp_path / "round-000004", {"x": 3})


def test_failed_write_leaves_no_partial_directory(tmp_path, monkeypatch):
    real_write = checkpoints._write_file
    calls = []

    def failing_write(path, data):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_write(path, data)

    monkeypatch.setattr(checkpoints, "_write_file", failing_write)
    with pytest.raises(CheckpointError, match="No space left"):
        write_checkpoint(tmp_path / "round-000004", FILES)
    assert len(calls) == 2
    assert leftovers(tmp_path) == []


def test_failed_rename_leaves_no_partial_directory(tmp_path, monkeypatch):
    def failing_rename(source, target):
        raise OSError(5, "I/O error")

    monkeypatch.setattr(checkpoints.os, "rename", failing_rename)
    with pytest.raises(CheckpointError, match="round-000005"):
        write_checkpoint(tmp_path / "round-000005", FILES)
    assert leftovers(tmp_path) == []


def test_interrupted_write_leaves_no_partial_directory(tmp_path, monkeypatch):
    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoints, "_fsync_directory", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(tmp_path / "round-000006", FILES)
    assert leftovers(tmp_path) == []


def test_verify_names_every_problem(tmp_path):
    target = tmp_path / "round-000007"
    expected = write_checkpoint(target, FILES)
    (target / "state.json").write_bytes(b'{"round": 13, "tampered": true}')
    (target / "extra" / "opt.bin").unlink()
    (target / "intruder.py").write_bytes(b"print()")
    with pytest.raises(CheckpointError) as caught:
        verify(target, expected)
    message = str(caught.value)
    assert "extra/opt.bin: missing" in message
    assert "intruder.py: unexpected extra file" in message
    assert "state.json: changed" in message
    assert sha(FILES["state.json"])[:12] in message
    assert file_sha256(target / "state.json")[:12] in message
    assert f"({len(FILES['state.json'])} bytes)" in message
    assert "3 problems" in message
    assert caught.value.problems == [
        {"name": "extra/opt.bin", "problem": "missing"},
        {"name": "intruder.py", "problem": "unexpected extra file"},
        {"name": "state.json", "problem": caught.value.problems[2]["problem"]},
    ]
    assert caught.value.problems[2]["problem"].startswith("changed")


def test_verify_with_prefix_and_missing_directory(tmp_path):
    target = tmp_path / "round-000008"
    expected = write_checkpoint(target, {"m": b"1"})
    prefixed = [dict(leaf, name="round-000008/" + leaf["name"]) for leaf in expected]
    verify(target, prefixed, prefix="round-000008/")
    with pytest.raises(CheckpointError, match="unexpected extra file"):
        verify(target, prefixed)
    with pytest.raises(CheckpointError, match="does not exist") as caught:
        verify(tmp_path / "gone", expected)
    assert caught.value.problems == [{"name": "m", "problem": "missing"}]


def test_verify_reports_symlink_with_other_problems(tmp_path):
    if not can_symlink(tmp_path):
        pytest.skip("symlinks not available")
    target = tmp_path / "round-000009"
    expected = write_checkpoint(target, {"model": b"m", "state": b"s"})
    (target / "state").unlink()
    os.symlink(tmp_path, target / "state")
    (target / "model").write_bytes(b"M")
    with pytest.raises(CheckpointError) as caught:
        verify(target, expected)
    problems = {problem["name"]: problem["problem"] for problem in caught.value.problems}
    assert problems["model"].startswith("changed")
    assert problems["state"].startswith("symlink refused")


def test_compare_matches_and_reports():
    leaves = [{"name": "a", "sha256": sha(b"a"), "size": 1}, {"name": "b", "sha256": sha(b"b"), "size": 1}]
    assert compare(leaves, list(reversed(leaves))) == []
    assert compare(leaves, [dict(leaves[0], sha256=leaves[0]["sha256"].upper()), leaves[1]]) == []
    resized = [leaves[0], dict(leaves[1], size=2)]
    (problem,) = compare(leaves, resized)
    assert problem["name"] == "b" and "(1 bytes)" in problem["problem"] and "(2 bytes)" in problem["problem"]
    assert compare(leaves, leaves + [leaves[0]]) == [{"name": "a", "problem": "duplicate name in actual_leaves"}]
    assert compare([], leaves) == [
        {"name": "a", "problem": "unexpected extra file"},
        {"name": "b", "problem": "unexpected extra file"},
    ]


@pytest.mark.parametrize(
    "bad",
    [
        [{"name": "a", "sha256": "xyz", "size": 1}],
        [{"name": "a", "sha256": "0" * 64}],
        [{"name": "a", "sha256": "0" * 64, "size": -1}],
        [{"name": "", "sha256": "0" * 64, "size": 1}],
        ["a"],
        {"name": "a", "sha256": "0" * 64, "size": 1},
    ],
)
def test_compare_refuses_malformed_leaves(bad):
    with pytest.raises(InvalidParameterError):
        compare(bad, [])


def test_root_of_covers_all_owners(tmp_path):
    write_checkpoint(tmp_path / "a" / "round-000012", {"model.npz": b"A"})
    write_checkpoint(tmp_path / "agg" / "round-000012", {"model.npz": b"G", "state.json": b"{}"})
    party = manifest(tmp_path / "a" / "round-000012", prefix="round-000012/")
    aggregator = manifest(tmp_path / "agg" / "round-000012", prefix="round-000012/")
    manifests = {"hospital-a": party, "aggregator": aggregator}
    union = combine(manifests)
    assert [leaf["name"] for leaf in union] == [
        "aggregator/round-000012/model.npz",
        "aggregator/round-000012/state.json",
        "hospital-a/round-000012/model.npz",
    ]
    root = root_of(manifests)
    assert root == merkle_root([(leaf["name"], leaf["sha256"], leaf["size"]) for leaf in union])
    assert root == root_of(dict(reversed(list(manifests.items()))))
    tree = MerkleTree([(leaf["name"], leaf["sha256"], leaf["size"]) for leaf in union])
    assert verify_proof(root, "hospital-a/round-000012/model.npz", sha(b"A"), 1, tree.proof(union[2]["name"]))
    # the same files under another owner give another root
    assert root_of({"hospital-b": party, "aggregator": aggregator}) != root
    assert root_of({}) == EMPTY_ROOT == root_of({"x": []})


@pytest.mark.parametrize("owner", ["", "a/b", 3])
def test_root_of_refuses_bad_owners(owner):
    with pytest.raises(InvalidParameterError):
        root_of({owner: [{"name": "m", "sha256": "0" * 64, "size": 1}]})


def test_root_of_refuses_duplicate_leaves():
    leaf = {"name": "m", "sha256": "0" * 64, "size": 1}
    with pytest.raises(InvalidParameterError, match="a/m"):
        root_of({"a": [leaf, leaf]})


@settings(max_examples=15, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["m.npz", "s.json", "d/x", "d/y"]), st.binary(max_size=64), min_size=1),
    st.data(),
)
def test_any_change_on_disk_changes_root_of(files, data):
    with tempfile.TemporaryDirectory() as base:
        target = Path(base) / "round-000001"
        recorded = write_checkpoint(target, files)
        root = root_of({"p": recorded})
        name = data.draw(st.sampled_from(sorted(files)))
        content = files[name]
        kind = data.draw(st.sampled_from(["byte", "append", "remove", "add", "rename"]))
        path = target / name
        if kind == "byte" and content:
            position = data.draw(st.integers(0, len(content) - 1))
            changed = bytearray(content)
            changed[position] ^= data.draw(st.integers(1, 255))
            path.write_bytes(bytes(changed))
        elif kind in ("byte", "append"):
            path.write_bytes(content + b"\x00")
        elif kind == "remove":
            path.unlink()
        elif kind == "add":
            (target / "new.bin").write_bytes(b"")
        else:
            path.rename(target / (path.name + ".renamed"))
        assert root_of({"p": manifest(target)}) != root
        with pytest.raises(CheckpointError):
            verify(target, recorded)


def test_latest_picks_highest_round(tmp_path):
    assert latest(tmp_path / "missing") is None
    assert latest(tmp_path) is None
    for index in (2, 10, 9):
        (tmp_path / round_name(index)).mkdir()
    (tmp_path / "round-000011.tmp-deadbeef").mkdir()
    (tmp_path / "round-000099").write_bytes(b"a file, not a checkpoint")
    (tmp_path / "round-x").mkdir()
    (tmp_path / "notes").mkdir()
    assert latest(tmp_path) == tmp_path / "round-000010"
    (tmp_path / round_name(1234567)).mkdir()
    assert latest(str(tmp_path)) == tmp_path / "round-1234567"
    if can_symlink(tmp_path):
        os.symlink(tmp_path / "round-000002", tmp_path / "round-9999999", target_is_directory=True)
        assert latest(tmp_path) == tmp_path / "round-1234567"


def test_round_name():
    assert round_name(12) == "round-000012"
    assert round_name(1234567) == "round-1234567"
    with pytest.raises(InvalidParameterError):
        round_name(-1)


def test_unreadable_file_is_reported_with_other_problems(tmp_path, monkeypatch):
    target = tmp_path / "round-000010"
    expected = write_checkpoint(target, {"model": b"m", "state": b"s"})
    real_sha256 = checkpoints.file_sha256

    def unreadable_state(path):
        if Path(path).name == "state":
            raise CheckpointError(f"cannot read {path}: Permission denied")
        return real_sha256(path)

    monkeypatch.setattr(checkpoints, "file_sha256", unreadable_state)
    (target / "model").unlink()
    with pytest.raises(CheckpointError) as caught:
        verify(target, expected)
    problems = {problem["name"]: problem["problem"] for problem in caught.value.problems}
    assert problems == {"model": "missing", "state": problems["state"]}
    assert problems["state"].startswith("unreadable") and "Permission denied" in problems["state"]
    with pytest.raises(CheckpointError, match="state"):
        manifest(target)


def test_round_of_reads_only_round_directories_and_drop_after_removes_later_and_partial_ones(tmp_path):
    from confide.checkpoints import drop_after, round_of

    assert [round_of(n) for n in ("round-000012", "round-7", "round-000012.tmp", "rounds", "x")] == [
        12,
        7,
        None,
        None,
        None,
    ]
    for name in ("round-000001", "round-000002", "round-000003", "round-000003.partial", "round-0000x", "notes"):
        (tmp_path / name).mkdir()
    drop_after(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "round-000001", "round-000002", "round-0000x"]
    drop_after(tmp_path / "missing", 0)  # nothing to drop
