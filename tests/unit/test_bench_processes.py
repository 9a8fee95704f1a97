"""The bench's process sampler: CPU per role over a window, a short task process counted once,
through the supervisor that reaped it (real processes, real /proc)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from cdc_tools.bench.processes import ProcessSampler, role_of

# A stand-in for the executor's worker: titled as Airflow titles it, it forks a task process
# that burns `burn` CPU seconds and exits, reaps it, says so in `reaped`, then waits until
# `done` exists.
WORKER = textwrap.dedent(
    """
    import os, sys, time
    from setproctitle import setproctitle
    setproctitle("airflow worker -- LocalExecutor: <idle>")
    burn, done, reaped = float(sys.argv[1]), sys.argv[2], sys.argv[3]
    time.sleep(0.6)
    child = os.fork()
    if child == 0:
        end = time.process_time() + burn
        while time.process_time() < end:
            pass
        os._exit(0)
    os.waitpid(child, 0)
    open(reaped, "w").close()
    while not os.path.exists(done):
        time.sleep(0.05)
    """
)


def test_roles_come_from_titles_and_a_supervisors_child_is_a_task() -> None:
    assert role_of(["airflow", "scheduler"], "bench") == "scheduler"
    assert role_of(["/usr/bin/java", "-cp", "x"], "bench") == "connect_server"
    assert role_of(["airflow api_server -- host:127.0.0.1 port:1"], None) == "api_server"
    assert role_of(["airflow worker -- LocalExecutor: <idle>"], "scheduler") == "supervisors"
    # A task process keeps its worker's title (a fork): its parent tells it apart.
    assert role_of(["airflow worker -- LocalExecutor: <idle>"], "supervisors") == "task_processes"
    assert role_of(["chmod", "755", "/x"], "connect_server") == "connect_server"
    # spark-submit mode: the JVM a task process starts is that task's Spark, not a server.
    assert role_of(["/usr/bin/java", "-cp", "x"], "task_processes") == "task_processes"
    assert role_of(["python", "helper.py"], None) == "other"


def _wait_for(path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never came"
        time.sleep(0.05)


def test_a_short_task_process_counts_once_through_its_supervisor(tmp_path: Path) -> None:
    done, reaped = tmp_path / "done", tmp_path / "reaped"
    with ProcessSampler(every=0.1) as sampler:
        time.sleep(0.3)
        start = time.time()
        worker = subprocess.Popen([sys.executable, "-c", WORKER, "0.8", str(done), str(reaped)])
        try:
            _wait_for(reaped)  # the task process burnt 0.8 s over several samples and ended
            usage = sampler.cpu_between(start, time.time())
        finally:
            done.touch()
            worker.wait(timeout=30)
    assert usage is not None
    cpu = usage["cpu_seconds"]
    # Sampled alive over several samples, reaped inside the window: 0.8 s once, not twice.
    assert 0.7 <= cpu["task_processes"] <= 1.0, cpu
    assert cpu.get("supervisors", 0.0) < 0.5, cpu
    assert usage["machine_cpu_seconds"] >= cpu["task_processes"]


def test_the_progress_line_names_each_roles_cpu() -> None:
    from cdc_tools.bench.cycle import cycle_line

    cpu = {
        "cpu_seconds": {"connect_server": 70.2, "task_processes": 20.1},
        "machine_cpu_seconds": 120.0,
        "cores_busy": 1.6,
        "machine_steal_seconds": 0.2,
    }
    line = cycle_line(1, {"cycle_seconds": 75.0}, cpu)
    assert line == (
        "cycle 2: 75.0 s; CPU-s connect_server 70.2, task_processes 20.1 "
        "(machine 120.0, 1.6 cores busy, 0.2 stolen)"
    )
    assert cycle_line(0, {"cycle_seconds": 75.0}, None) == "cycle 1: 75.0 s"


def test_a_process_that_execs_takes_the_role_of_what_it_became(tmp_path: Path) -> None:
    # `spark-submit` is a shell script that execs the JVM under the same pid: the role is told
    # from the command the process has now, not the one it had when first seen.
    burnt = tmp_path / "burnt"
    burn = (
        "import os, time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass"
        "\nopen(os.environ['BURNT'], 'w').close()\ntime.sleep(60)"
    )
    # The title comes from the environment: the shell's own command line does not carry it.
    script = f'sleep 0.6; exec {sys.executable} -c "{burn}" "$TITLE"'
    with ProcessSampler(every=0.1) as sampler:
        time.sleep(0.3)
        start = time.time()
        environment = {**os.environ, "TITLE": "airflow scheduler", "BURNT": str(burnt)}
        child = subprocess.Popen(["sh", "-c", script], env=environment)
        try:
            _wait_for(burnt)  # alive at the window's end: its own CPU counts, by its role now
            usage = sampler.cpu_between(start, time.time())
        finally:
            child.kill()
            child.wait(timeout=30)
    assert usage is not None
    assert usage["cpu_seconds"].get("scheduler", 0.0) >= 0.5, usage


def test_runs_that_started_before_their_changes_landed_are_named() -> None:
    from datetime import UTC, datetime, timedelta

    from cdc_airflow.local.runs import TaskRow
    from cdc_tools.bench.cycle import early_problem, started_before

    fed = datetime(2026, 11, 30, 23, 32, 10, tzinfo=UTC)

    def task(dag: str, task_id: str, start: datetime | None) -> TaskRow:
        return TaskRow(dag, "r", task_id, "success", 1, None, start, None)

    tasks = [
        task("bc001_u", "stage", fed - timedelta(seconds=40)),
        task("bc001_u", "overwrite_final", fed + timedelta(seconds=1)),
        task("bc000_p", "stage", fed - timedelta(seconds=2)),
        task("bc002_i", "stage", fed + timedelta(seconds=5)),
        task("bc003_p", "stage", None),
    ]
    early = started_before(tasks, fed)
    assert early == ["bc000_p", "bc001_u"]
    problem = early_problem(early, fed)
    assert problem.startswith("2 tables' runs (first bc000_p) started before this cycle's change")
    assert "2026-11-30T23:32:10+00:00" in problem and "longer --every" in problem
