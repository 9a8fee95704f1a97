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

from cdc_airflow.local import connect_server, warm_up

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


def _databases(url: str, name: str) -> list[str]:
    """The catalog databases named `name` at the server at `url`."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession.builder.remote(url).create()
    try:
        return [row[0] for row in session.sql(f"SHOW DATABASES LIKE '{name}'").collect()]
    finally:
        session.stop()


def _driver_programs(jvm: int) -> list[int]:
    """Pids of the processes of `jvm`'s group (the JVM aside) running the driver program."""
    return _programs(jvm, b"connect_driver.py")


def _programs(jvm: int, program: bytes) -> list[int]:
    """Pids of the processes of `jvm`'s group (the JVM aside) whose command ends in `program`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == jvm:
            continue  # the JVM's own command line names the program too
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            group = os.getpgid(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
        if group == jvm and any(part.endswith(program) for part in command):
            found.append(int(entry.name))
    return found


def test_sessions_share_compiled_code_and_the_driver_program_dies_with_the_jvm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CDC_SPARK_DRIVER_MEMORY", raising=False)
    ui_port = connect_server.free_port()
    server = connect_server.start(
        master="local[1]",
        # Without the warm-up, which would compile classes of its own meanwhile.
        conf={
            "spark.ui.enabled": "true",
            "spark.ui.port": str(ui_port),
            "spark.cdc.warmUp": "false",
        },
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
        # Switched off: no warm-up started (one starts as soon as the server serves).
        assert _programs(server.pid, b"cdc_airflow.local.warm_up") == []
        assert "cdc warm-up" not in (tmp_path / "server.log").read_text(errors="replace")
        os.kill(server.pid, signal.SIGKILL)  # the JVM dies (an OOM kill, a crash)
        server.process.wait(timeout=30)
        deadline = time.monotonic() + 15
        while _driver_programs(server.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _driver_programs(server.pid) == []
    finally:
        server.stop()


def _log_line(log: Path, start: str, timeout: float) -> str:
    """The first line of `log` starting with `start`, once written."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [
            line for line in log.read_text(errors="replace").splitlines() if line.startswith(start)
        ]
        if found:
            return found[0]
        time.sleep(0.5)
    raise AssertionError(f"no {start!r} line in {log} within {timeout} s")


def test_a_local_server_warms_itself_up_and_a_killed_one_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm-up stages and overwrites its made-up tables (it checks their rows itself: a
    wrong count reports "failed"), then exits and removes its folder, and the folder of a
    warm-up killed outright before; the warm-up of a server whose JVM is killed dies with it,
    its folder removed too."""
    temporary = tmp_path / "tmp"
    orphan = temporary / f"cdc-warm-up-{2**22 + 1}-x1y2"  # no such process (above pid_max)
    (orphan / "landing").mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(temporary))  # the server's, so the warm-up's, folders
    monkeypatch.delenv(connect_server.WARM_UP_ENV)  # the tests' own servers skip it (conftest)
    for kill in (False, True):
        log = tmp_path / f"server-{kill}.log"
        server = connect_server.start(master="local[2]", log_path=log)
        try:
            deadline = time.monotonic() + 20  # started once the server serves
            while not _programs(server.pid, b"cdc_airflow.local.warm_up"):
                assert time.monotonic() < deadline, "no warm-up started"
                time.sleep(0.2)
            assert len(_programs(server.pid, b"cdc_airflow.local.warm_up")) == 1
            if kill:
                os.kill(server.pid, signal.SIGKILL)
                server.process.wait(timeout=30)
            else:
                line = _log_line(log, "cdc warm-up:", timeout=240)
                assert line.startswith("cdc warm-up: done in "), line
                assert not orphan.exists()
                # Its made-up tables' catalog entries went with their folders.
                assert _databases(server.url, warm_up.DATABASE) == []
            deadline = time.monotonic() + 20
            while (
                _programs(server.pid, b"cdc_airflow.local.warm_up") and time.monotonic() < deadline
            ):
                time.sleep(0.2)
            assert _programs(server.pid, b"cdc_airflow.local.warm_up") == []
            assert not list(temporary.glob("cdc-warm-up-*")), list(temporary.iterdir())
        finally:
            server.stop()
