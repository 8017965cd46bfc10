"""``confide stop`` and ``--pid-file`` (confide.cli.stop): what is signalled, and what never is."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from confide.cli.main import main
from confide.cli.stop import stop
from confide.errors import InvalidParameterError, MissingFileError


def _spawn(*extra: str) -> subprocess.Popen:
    # The last argument makes /proc/<pid>/cmdline name confide, as `confide controller` does.
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *extra])


def test_stop_ends_the_process_a_pid_file_names_and_removes_the_file(tmp_path):
    process = _spawn("confide")
    (tmp_path / "run").mkdir()
    pid_file = tmp_path / "run" / "controller.pid"
    pid_file.write_text(f"{process.pid}\n")
    try:
        assert main(["stop", str(tmp_path / "run")]) == 0
        assert process.wait(timeout=5) == -15  # SIGTERM
        assert not pid_file.exists()
    finally:
        process.kill()
        process.wait()


def test_a_pid_file_of_a_process_that_is_gone_or_not_confide_signals_nothing(tmp_path):
    gone = _spawn("confide")
    gone.kill()
    gone.wait()
    other = _spawn()  # a reused number: a process that is not a confide command
    try:
        (tmp_path / "gone.pid").write_text(str(gone.pid))
        (tmp_path / "other.pid").write_text(str(other.pid))
        lines = stop([str(tmp_path)])
        assert lines == [
            f"{tmp_path / 'gone.pid'}: process {gone.pid} was not running (file removed)",
            f"{tmp_path / 'other.pid'}: process {other.pid} is not a confide command (file removed, nothing signalled)",
        ]
        time.sleep(0.2)
        assert other.poll() is None  # never signalled
        assert not list(tmp_path.glob("*.pid"))
    finally:
        other.kill()
        other.wait()


def test_pid_file_is_written_while_the_command_runs_and_removed_when_it_exits(tmp_path):
    pid_file = tmp_path / "deep" / "agent.pid"
    code = (
        "import os, sys; from confide.cli.stop import write_pid_file; write_pid_file(sys.argv[1]); "
        "print(open(sys.argv[1]).read().strip() == str(os.getpid()))"
    )
    done = subprocess.run([sys.executable, "-c", code, str(pid_file)], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True"
    assert not pid_file.exists()


def test_bad_input_names_the_path_or_the_limit(tmp_path):
    with pytest.raises(MissingFileError, match="nothing.pid does not exist"):
        stop([str(tmp_path / "nothing.pid")])
    (tmp_path / "junk.pid").write_text("not a number")
    with pytest.raises(InvalidParameterError, match="junk.pid does not hold a process id"):
        stop([str(tmp_path / "junk.pid")])
    with pytest.raises(InvalidParameterError, match="--timeout must be > 0"):
        stop([str(tmp_path)], timeout=0)
