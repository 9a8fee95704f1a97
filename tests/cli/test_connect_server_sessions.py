"""The Spark Connect server the launcher starts: client sessions share the code Spark generated
and compiled (each Airflow task opens a session of its own), and its driver program leaves no
process behind when the JVM dies."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from cdc_airflow.local import connect_server

pytestmark = [pytest.mark.cli, pytest.mark.slow]


def _compilations(ui_port: int) -> int:
    """Classes Spark's code generator compiled so far (its metrics, from the server's UI)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/metrics/json/", timeout=30) as page:
        metrics = json.load(page)
    (count,) = [
        v["count"] for k, v in metrics["histograms"].items() if k.endswith("compilationTime")
    ]
    return int(count)


def _query(url: str, factor: int) -> list[tuple[Any, ...]]:
    """An aggregation in a new client session (as a task runs its step), then closed."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession.builder.remote(url).create()
    try:
        frame = session.range(0, 1000, 1, 2).selectExpr("id % 7 AS k", f"id * {factor} AS v")
        rows = frame.groupBy("k").sum("v").orderBy("k").collect()
        return [tuple(r) for r in rows]
    finally:
        session.stop()


def _driver_programs(jvm: int) -> list[int]:
    """Pids of the processes of `jvm`'s group (the JVM aside) running the driver program."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == jvm:
            continue  # the JVM's own command line names the program too
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            group = os.getpgid(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
        if group == jvm and any(part.endswith(b"connect_driver.py") for part in command):
            found.append(int(entry.name))
    return found


def test_sessions_share_compiled_code_and_the_driver_program_dies_with_the_jvm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CDC_SPARK_DRIVER_MEMORY", raising=False)
    ui_port = connect_server.free_port()
    server = connect_server.start(
        master="local[1]",
        conf={"spark.ui.enabled": "true", "spark.ui.port": str(ui_port)},
        log_path=tmp_path / "server.log",
    )
    try:
        # A factor no other query used: the first session's plan is new code.
        factor = 1000 + os.getpid() % 1000
        expected = [(k, sum(i * factor for i in range(1000) if i % 7 == k)) for k in range(7)]
        before = _compilations(ui_port)
        assert _query(server.url, factor) == expected
        first = _compilations(ui_port)
        assert _query(server.url, factor) == expected
        second = _compilations(ui_port)
        assert first > before  # the first session compiled its query's code
        # Spark's own server class compiles it all again for every new session.
        assert second == first, f"a second session compiled {second - first} classes again"
        # Its heap: the server's default (it keeps every table's cached state), not Spark's 1g.
        command = Path(f"/proc/{server.pid}/cmdline").read_bytes().split(b"\0")
        assert f"-Xmx{connect_server.CONNECT_SERVER_MEMORY}".encode() in command
        programs = _driver_programs(server.pid)
        assert len(programs) == 1, programs
        os.kill(server.pid, signal.SIGKILL)  # the JVM dies (an OOM kill, a crash)
        server.process.wait(timeout=30)
        deadline = time.monotonic() + 15
        while _driver_programs(server.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _driver_programs(server.pid) == []
    finally:
        server.stop()
