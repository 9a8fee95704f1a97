"""A test run stopped by SIGTERM still tears its fixtures down (tests/conftest.py), so the
servers they start in process groups of their own do not outlive it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A fixture starting a "server" (a sleep) in a process group of its own, stopped by its group in
# the teardown, and a test that waits long enough to be stopped.
PROBE = """
import os, signal, subprocess, time
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture
def server():
    process = subprocess.Popen(["sleep", "600"], start_new_session=True)
    (HERE / "server.pid").write_text(str(process.pid))
    yield process
    os.killpg(process.pid, signal.SIGTERM)
    process.wait()


def test_waits(server):
    (HERE / "ready").touch()
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _server_left_after_sigterm(folder: Path, *plugins: str) -> bool:
    """Run the probe in a pytest process of its own (with `plugins`), SIGTERM it once its test
    runs; whether the fixture's server outlived it (then stopped here)."""
    folder.mkdir()
    (folder / "test_probe.py").write_text(PROBE)
    options = [arg for plugin in plugins for arg in ("-p", plugin)]
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options, str(folder)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    server = 0
    try:
        deadline = time.monotonic() + 120
        while not (folder / "ready").exists():
            assert run.poll() is None, "the probe's pytest ended before its test ran"
            assert time.monotonic() < deadline, "the probe's test did not start in 120 s"
            time.sleep(0.1)
        server = int((folder / "server.pid").read_text())
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=60)
        time.sleep(0.5)  # the server, reparented once pytest is gone, is reaped by init
        return _alive(server)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        if server:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server, signal.SIGKILL)


def test_sigterm_stops_the_servers_fixtures_started(tmp_path: Path) -> None:
    assert not _server_left_after_sigterm(tmp_path / "with", "tests.conftest")
    # Python's default for SIGTERM: the process ends without any teardown.
    assert _server_left_after_sigterm(tmp_path / "without")
