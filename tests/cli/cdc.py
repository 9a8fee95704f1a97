"""Running the real `cdc` command in its own process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import Workspace

CDC = Path(sys.executable).parent / "cdc"


def environment(workspace: Workspace, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CDC_CONFIG=str(workspace.config_path),
        CDC_LANDING=str(workspace.landing),
        CDC_WAREHOUSE=str(workspace.warehouse),
        CDC_SPARK_MASTER="local[1]",
        CDC_SHUFFLE_PARTITIONS="2",
        SPARK_LOCAL_IP="127.0.0.1",
    )
    env.update(extra)
    return env


def cdc(
    workspace: Workspace, *args: str, timeout: int = 600, cwd: str | None = None, **extra: str
) -> subprocess.CompletedProcess[str]:
    """Run `cdc ARGS` to completion (in `cwd`, default this process's)."""
    return subprocess.run(
        [str(CDC), *args],
        cwd=cwd,
        env=environment(workspace, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start(workspace: Workspace, *args: str, **extra: str) -> subprocess.Popen[str]:
    """Start `cdc ARGS` in its own process group (stopped by its own pid in the tests)."""
    return subprocess.Popen(
        [str(CDC), *args],
        env=environment(workspace, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def summary(result: subprocess.CompletedProcess[str] | tuple[str, str]) -> dict[str, str]:
    """The key=value pairs of the one summary line on stdout."""
    stdout = result[0] if isinstance(result, tuple) else result.stdout
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert len(lines) == 1, stdout
    _, _, values = lines[0].partition(": ")
    return dict(pair.split("=", 1) for pair in values.split())
