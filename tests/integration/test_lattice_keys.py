"""The aggregator of a ``lattice`` job never holds key material: a byte search of its memory and disk.

Three parties hold after round 4 of 5 with the round's key material at hand (their own Shamir share of
their round key, and the summed key shares, any two of which rebuild the key sum that decrypts
the round's sum); each writes it to a file (tests/fixtures/faults.py, ``CONFIDE_FAULT_KEY_DUMP``).
While they hold, the test reads every readable mapping of the aggregator process
(``/proc/<pid>/mem``) and every file under its state folder, and searches them for a 32-byte
window of every share. Shares are uniform in ``F_65521``: a window turns up by chance with
probability about ``2^-256``. The key shares travel through the aggregator sealed pairwise (X25519
pair keys), so it relays them without a readable copy. The control: the same search finds the
shares in a party's own memory, so a search that finds nothing is not a blind one. And a party
pools the lattice messages of the last two rounds only, not of the whole job.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.fixtures.faults import confide_processes, with_faults
from tests.fixtures.federation import run_local
from tests.integration.conftest import make_spec

SHARE_BYTES = 2 * 4096
WINDOW = 32


def _windows(dump: Path) -> list[bytes]:
    data = dump.read_bytes()
    assert data and len(data) % SHARE_BYTES == 0, f"{dump} holds {len(data)} bytes, not whole shares"
    return [data[i + 4096 : i + 4096 + WINDOW] for i in range(0, len(data), SHARE_BYTES)]


def _memory(pid: int):
    """Every readable mapping of process ``pid``, region by region."""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                yield mem.read(end - start)
            except (OSError, ValueError, OverflowError):
                continue  # [vvar] and the like


def _files(folder: Path):
    for path in folder.rglob("*"):
        if path.is_file():
            yield path.read_bytes()


def _found(chunks, windows: list[bytes]) -> int:
    return sum(1 for chunk in chunks for window in windows if window in chunk)


def _pid(workdir: Path, command: str, *words: str) -> int:
    """The one ``confide <command>`` process under ``workdir`` whose command line has ``words``."""
    processes = confide_processes(workdir)
    found = [
        pid
        for pid, argv in processes.items()
        if argv[argv.index("confide") + 1 :][:1] == [command] and all(w in argv for w in words)
    ]
    assert len(found) == 1, f"expected one 'confide {command}' {words} under {workdir}: {processes}"
    return found[0]


def test_the_aggregator_memory_and_disk_hold_no_key_share(tmp_path):
    if not Path("/proc/self/mem").exists():
        pytest.skip("no /proc/<pid>/mem to search on this host")
    dumps, release = tmp_path / "keys", tmp_path / "release"
    dumps.mkdir()
    parties = ["hospital-a", "hospital-b", "hospital-c"]
    spec = make_spec(job_id="lattice-keys", parties=parties, rounds=5, protection={"mode": "lattice"})
    env = {p: with_faults(hold_round=4, hold_until=release, key_dump=dumps) for p in parties}
    workdir = tmp_path / "job"
    seen: dict[str, object] = {}

    def search() -> None:
        try:
            deadline = time.monotonic() + 100
            while len(list(dumps.glob("*.bin"))) < len(parties) and time.monotonic() < deadline:
                time.sleep(0.2)
            windows = [w for dump in sorted(dumps.glob("*.bin")) for w in _windows(dump)]
            seen["windows"] = len(windows)
            aggregator = _pid(workdir, "aggregator")
            seen["aggregator_memory"] = _found(_memory(aggregator), windows)
            state = [p for p in workdir.iterdir() if p.is_dir() and p.name != "parties"]
            seen["aggregator_disk"] = _found((c for folder in state for c in _files(folder)), windows)
            party = _pid(workdir, "party", "hospital-a")
            seen["party_memory"] = _found(_memory(party), windows)
        except Exception as error:  # reported by the test, not lost in the thread
            seen["error"] = repr(error)
        finally:
            release.touch()

    searcher = threading.Thread(target=search, daemon=True)
    searcher.start()
    report = run_local(spec, workdir, progress=False, echo=lambda *_: None, party_env=env)
    searcher.join(timeout=60)
    assert "error" not in seen, seen
    assert report["mode"] == "lattice" and len(report["rounds"]) == 5
    assert {dump.read_text() for dump in dumps.glob("*.rounds")} == {"3 4"}, "rounds 1 and 2 were dropped"
    # 3 parties: each its own share and the 2 summed shares it used (its own and one received)
    assert seen["windows"] >= 3 * 2, seen
    assert seen["aggregator_memory"] == 0 and seen["aggregator_disk"] == 0, seen
    assert seen["party_memory"] >= 1, f"the control found nothing in a party's memory: {seen}"
