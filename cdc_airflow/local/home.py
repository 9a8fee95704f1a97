"""The local Airflow's one home, shared by `make airflow` and `cdc demo`, and its lock.

One home, so the runs the demo made are there when `make airflow` starts. One user of it at a
time: its metadata DB is SQLite, which takes one writer, so two schedulers (or a backfill created
beside a running scheduler, Airflow's 503 on SQLite) would stall or fail each other. The lock is
an `flock` on `<home>/cdc-local.lock`, which also names its holder: the kernel releases it when
the holder's process ends, however it ends, so a crash leaves no stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cdc_pipeline.paths import project_root

LOCK_FILE = "cdc-local.lock"


def default_home() -> Path:
    """`AIRFLOW_HOME`, else `airflow_home/` under the project root (the checkout; installed, the
    working directory): the home of `make airflow` and of `cdc demo`."""
    return Path(os.environ.get("AIRFLOW_HOME") or project_root() / "airflow_home")


class HomeInUseError(RuntimeError):
    """Another process of this project runs Airflow on the home: one line naming it and the fix."""


@contextmanager
def claim_home(home: Path, *, by: str) -> Iterator[Path]:
    """Hold the home (created, the owner's only) while the block runs, as `by` (what the error of a
    second claimant names: `make airflow on http://127.0.0.1:8080`); HomeInUseError when another
    process holds it."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = home / LOCK_FILE
    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(descriptor, 500).decode(errors="replace").strip() or "another process"
        os.close(descriptor)
        raise HomeInUseError(
            f"the local Airflow home {home} is in use by {holder}: stop it (Ctrl-C where it "
            "runs) and try again, or give one of them another home (AIRFLOW_HOME=/other/folder)"
        ) from None
    try:
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{by} (pid {os.getpid()})".encode(), 0)
        yield home
    finally:
        os.ftruncate(descriptor, 0)
        os.close(descriptor)  # releases the lock
