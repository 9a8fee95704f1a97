"""A Spark Connect server that is not there, or dies during a step: the `cdc` client fails within
its bounded wait with one line naming the server, and exits; final keeps its last commit."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from cdc_airflow.local import connect_server
from tests.cli.cdc import cdc, start
from tests.helpers import Workspace

pytestmark = [pytest.mark.cli, pytest.mark.slow]

TABLE = {
    "name": "t",
    "file_format": "csv",
    "columns": {"ID": "bigint", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
}
HOUR = ("--start", "2024-01-01T00:00:00Z", "--end", "2024-01-01T01:00:00Z")


def test_a_closed_port_fails_at_once_naming_the_server(workspace: Workspace) -> None:
    workspace.configure(TABLE)
    workspace.land("t", "2024-01-01T00", "a.csv", [{"FLAG": "I", "ID": 1, "TS": "2024-01-01"}])
    url = f"sc://127.0.0.1:{connect_server.free_port()}"
    started = time.monotonic()
    result = cdc(workspace, "run", "t", *HOUR, CDC_SPARK_REMOTE=url, timeout=120)
    assert time.monotonic() - started < 60
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: run t: Spark Connect server {url} is not reachable (Connection refused): start "
        "it (`make airflow` starts one) or fix CDC_SPARK_REMOTE"
    )


def test_a_server_killed_during_a_step_fails_it_within_the_bound(
    workspace: Workspace, tmp_path: Path
) -> None:
    workspace.configure(TABLE)
    workspace.land("t", "2024-01-01T00", "a.csv", [{"FLAG": "I", "ID": 1, "TS": "2024-01-01"}])
    server = connect_server.start(master="local[1]", log_path=tmp_path / "server.log")
    barrier = tmp_path / "barrier"
    try:
        process = start(
            workspace,
            "run",
            "t",
            *HOUR,
            CDC_SPARK_REMOTE=server.url,
            CDC_SPARK_CONNECT_TIMEOUT="10",
            CDC_BARRIER=f"stage:before_first_write|{barrier}|2",
        )
        deadline = time.monotonic() + 180
        while not (barrier.exists() and any(barrier.iterdir())) and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(server.pid, signal.SIGKILL)  # the server dies mid-step (its own group)
        (barrier / "test").touch()
        released = time.monotonic()
        try:
            out, err = process.communicate(timeout=180)
        except BaseException:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    finally:
        server.stop()
    assert time.monotonic() - released < 90  # PySpark's own policy retried for over 10 minutes
    assert process.returncode == 1, out + err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"error: run t: Spark Connect server {server.url} stopped answering (")
    assert not (workspace.paths("t").final / "_delta_log").exists()
