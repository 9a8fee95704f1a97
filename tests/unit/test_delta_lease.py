"""The lease that keeps two optimizes of one table apart: one holder at a time, a live holder
waited for (then a clear error), a dead one of this machine taken over, an ended one free."""

from __future__ import annotations

import multiprocessing
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from cdc_pipeline.errors import ConcurrentWriteError
from spark_jobs.delta.lease import LEASE_KEY, _commit, _open, holding


def claim_by(path: Path, holder: str, until: float) -> None:
    """A claim as another process would have committed it."""
    assert _commit(
        _open(path), {LEASE_KEY: "optimize", "holder": holder, "until": str(int(until * 1000))}
    )


def _hold_and_log(path: str, log: str, barrier: str, processes: int) -> None:
    """A process that meets the others at `barrier`, then holds the lease for 0.2 s, logging
    when it enters and leaves."""
    Path(barrier, str(os.getpid())).touch()
    while len(os.listdir(barrier)) < processes:
        time.sleep(0.001)
    with holding(Path(path), "optimize", wait=60):
        with open(log, "a") as out:
            out.write("in\n")
        time.sleep(0.2)
        with open(log, "a") as out:
            out.write("out\n")


def test_processes_starting_together_on_a_new_lease_take_turns(tmp_path: Path) -> None:
    """Three processes released at once on a lease table none has made yet (the creators race,
    and a creation that lost once became an append that hid a claim): never two inside."""
    context = multiprocessing.get_context("spawn")  # delta-rs's runtime does not survive fork
    for round_ in range(4):
        base = tmp_path / str(round_)
        (base / "barrier").mkdir(parents=True)
        args = (str(base / "leases"), str(base / "log"), str(base / "barrier"), 3)
        processes = [context.Process(target=_hold_and_log, args=args) for _ in range(3)]
        for process in processes:
            process.start()
        for process in processes:
            process.join(120)
        assert [p.exitcode for p in processes] == [0, 0, 0]
        assert (base / "log").read_text().split() == ["in", "out"] * 3, round_


def test_a_live_holder_is_waited_for_then_named(tmp_path: Path) -> None:
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with holding(tmp_path, "optimize", hold=60, wait=5):
            held.set()
            release.wait(30)

    other = threading.Thread(target=hold)
    other.start()
    held.wait(30)
    with (
        pytest.raises(ConcurrentWriteError, match=r"another optimize holds this table \(process "),
        holding(tmp_path, "optimize", hold=60, wait=0.5),
    ):
        pass
    release.set()
    other.join(30)
    started = time.monotonic()
    with holding(tmp_path, "optimize", hold=60, wait=5):
        pass
    assert time.monotonic() - started < 2
    # Claims and releases only: the table has no data file.
    assert DeltaTable(str(tmp_path)).file_uris() == []


def test_a_second_claimant_waits_for_the_release(tmp_path: Path) -> None:
    order: list[str] = []

    def hold(name: str) -> None:
        with holding(tmp_path, "optimize", hold=60, wait=30):
            order.append(f"{name} in")
            time.sleep(1.5)
            order.append(f"{name} out")

    threads = [threading.Thread(target=hold, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [e.split()[1] for e in order] == ["in", "out", "in", "out"]
    assert order[0].split()[0] == order[1].split()[0]


def test_a_dead_holder_of_this_machine_is_taken_over_at_once(tmp_path: Path) -> None:
    claim_by(tmp_path, f"{socket.gethostname()}:999999999:1", time.time() + 3600)
    with holding(tmp_path, "optimize", hold=60, wait=0):
        pass


def test_another_machine_is_waited_for_until_its_claim_ends(tmp_path: Path) -> None:
    claim_by(tmp_path, "elsewhere:1:1", time.time() + 3600)
    with (
        pytest.raises(ConcurrentWriteError, match="elsewhere:1:1"),
        holding(tmp_path, "optimize", hold=60, wait=0),
    ):
        pass
    claim_by(tmp_path, "elsewhere:1:1", time.time() - 1)  # ended
    with holding(tmp_path, "optimize", hold=60, wait=0):
        pass
