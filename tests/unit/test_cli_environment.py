"""The ``confide`` command settles the numeric libraries' threads before numpy loads."""

from __future__ import annotations

import os
import subprocess
import sys

from confide.cli.main import NUMERIC_ENVIRONMENT, settle_numeric_threads


def test_defaults_fill_only_what_the_operator_left_unset():
    environ = {"OPENBLAS_THREAD_TIMEOUT": "12"}
    settle_numeric_threads(environ)
    assert environ["OPENBLAS_THREAD_TIMEOUT"] == "12"
    empty: dict[str, str] = {}
    settle_numeric_threads(empty)
    assert empty == NUMERIC_ENVIRONMENT


def test_every_confide_process_sets_them_before_numpy_is_imported():
    probe = (
        "import os, sys\n"
        "from confide.cli.main import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'), 'numpy' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in NUMERIC_ENVIRONMENT}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-2:] == [NUMERIC_ENVIRONMENT["OPENBLAS_THREAD_TIMEOUT"], "False"]


def test_data_list_names_each_datasets_columns_and_types():
    from confide.cli.controller import _columns_line

    schema = [
        {"name": "age", "dtype": "float", "missing": True},
        {"name": "sex", "dtype": "str", "missing": False, "categories": ["F", "M"]},
        {"name": "ward", "dtype": "str", "categories": [f"w{i}" for i in range(12)]},
        {"name": "death", "dtype": "int"},
    ]
    assert _columns_line(schema) == (
        "age float (gaps), sex str [F, M], ward str [w0, w1, w2, w3, w4, w5, w6, w7, ... 12 in all], death int"
    )
    assert _columns_line([]) == "(no columns published)"


def test_json_log_lines_on_request_and_a_bad_format_refused(tmp_path):
    import json
    import time

    from confide.transport.certs import init_federation

    init_federation(tmp_path / "certs", parties=["a"])
    port_file = tmp_path / "port"
    env = {**os.environ, "CONFIDE_LOG_FORMAT": "json"}
    command = [sys.executable, "-m", "confide", "aggregator", "--certs", str(tmp_path / "certs")]
    command += ["--listen", "127.0.0.1:0", "--port-file", str(port_file)]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]  # every line is one JSON object
    started = [e for e in lines if "listening on port" in e["message"]]
    assert started and set(started[0]) == {"time", "level", "logger", "message", "pid"}
    assert started[0]["level"] == "INFO" and started[0]["logger"] == "confide.aggregator"
    refused = subprocess.run(
        [sys.executable, "-m", "confide", "--help"],
        env={**os.environ, "CONFIDE_LOG_FORMAT": "yaml"},
        capture_output=True,
    )
    assert refused.returncode == 0  # --help exits before the check; a command does not
    refused = subprocess.run(
        [sys.executable, "-m", "confide", "certs", "crl", "--dir", str(tmp_path / "certs")],
        env={**os.environ, "CONFIDE_LOG_FORMAT": "yaml"},
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "CONFIDE_LOG_FORMAT must be text or json, got 'yaml'" in refused.stderr
