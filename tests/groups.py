"""Which test files run apart from the parallel run, and why: `make test`'s phases 2 and 3.

tests/conftest.py marks their tests ``serial`` or ``exclusive``. `make test` hands each phase its
files (``python tests/groups.py serial``), so it collects those files only, not the 1,600 tests
of the whole tree (about 8 s a phase on two cores).
"""

from __future__ import annotations

import sys

#: Test files that run after the parallel run (`make test`), two at a time: each paces rounds against
#: timeouts or bounds a wall-clock time, so a CPU-bound neighbour (a multi-process training job on
#: the other core) would turn its margin into a flake. Beside each other they mostly wait: this
#: phase kept the CPU 31% busy when its files ran one at a time. The reason is next to each one.
SERIAL_FILES = {
    "integration/test_cluster.py": "times how fast a lost node is noticed",
    "integration/test_supervision.py": "paced rounds against restart and rejoin deadlines",
    "integration/test_revocation.py": "revokes in the middle of paced rounds",
    "integration/test_hospitals.py": "paced rounds against a stop grace period",
    "integration/test_walkthrough.py": "the README's fixed ports (8443, 50051, 50052), kept out of the parallel run",
    # tests/integration/test_compute.py stops its Ray clusters with `ray stop --force`, which stops
    # every Ray cluster on the machine: no other Ray test may run beside it.
    "unit/compute/test_ray.py": "its Ray cluster would be stopped by test_compute.py's teardown on the other worker",
}

#: Test files that run last, alone: they measure time against time (a throughput, GIL ticks,
#: pipelined against serial), own a fixed network resource, or bound a wait at about a second.
EXCLUSIVE_FILES = {
    "integration/test_wan.py": "one fixed subnet and namespaces; measures shaped-link throughput",
    "integration/test_containers.py": "the containers' fixed host ports (8443, 50051, 9100...) and podman's state",
    # These two failed beside two serial files at once (-n 3): a resume refused, an upload's
    # slices not delivered within 20 s. They passed beside one, but they are kept alone.
    "integration/test_upload_resets.py": "times uploads across connection resets",
    "e2e/test_console.py": "a browser watching paced rounds and a resume",
    "unit/runtime/test_pool.py": "bounds how long a pool waits",
    "unit/runtime/test_rejoin.py": "bounds how long a rejoin waits",
    "unit/runtime/test_slicing.py": "threads given fixed sleeps to reach a state; pipelined against serial time",
    "unit/crypto/test_native_boundary.py": "counts GIL ticks while native code runs",
    "unit/transport/test_revocation.py": "a refusal within 1 s of revocation",
}

#: Files in which single tests carry ``@pytest.mark.exclusive`` themselves (phase 3 collects them).
EXCLUSIVE_IN_PLACE = {
    "unit/runtime/test_paillier.py": "20 keys generated within 60 s: a bound on wall-clock time",
}


def files(phase: str) -> list[str]:
    """The test files of ``phase`` (``serial`` or ``exclusive``), as paths from the checkout."""
    if phase == "serial":
        chosen = list(SERIAL_FILES)
    elif phase == "exclusive":
        chosen = [*EXCLUSIVE_FILES, *EXCLUSIVE_IN_PLACE]
    else:
        raise SystemExit(f"phase must be 'serial' or 'exclusive', got {phase!r}")
    return [f"tests/{name}" for name in chosen]


if __name__ == "__main__":
    print(" ".join(files(sys.argv[1] if len(sys.argv) > 1 else "")))
