"""Test hooks at named points of a step (crash and race tests); inert unless asked for."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

_barriers_passed: set[str] = set()


def inject_fault(point: str) -> None:
    """Test hooks at named points of a step; inert unless the environment asks for them.

    CDC_FAULT=<point> kills the process with SIGKILL there (crash tests). CDC_BARRIER=
    <point>|<folder>|<n> makes the first arrival of each process wait until n processes have
    arrived, so concurrency tests commit from the same snapshot instead of by luck.
    """
    if os.environ.get("CDC_FAULT") == point:
        os.kill(os.getpid(), signal.SIGKILL)
    barrier = os.environ.get("CDC_BARRIER", "")
    if barrier.startswith(point + "|") and point not in _barriers_passed:
        _barriers_passed.add(point)
        _, folder, count = barrier.split("|")
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / str(os.getpid())).touch()
        deadline = time.monotonic() + 120
        while len(list(Path(folder).iterdir())) < int(count) and time.monotonic() < deadline:
            time.sleep(0.05)
