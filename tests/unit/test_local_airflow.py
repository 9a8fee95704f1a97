"""The local launcher: loopback by default, secrets readable by the owner only, one pool per table."""

from __future__ import annotations

import importlib
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_airflow.local import launcher as local_airflow
from cdc_airflow.local.launcher import LocalAirflow, write_private

REPO = Path(__file__).resolve().parents[2]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def config(path: Path) -> Path:
    """Two valid rows and a bad one (no keys): pools only for the valid ones."""
    row = {"file_format": "csv", "columns": {"ID": "bigint", "TS": "timestamp"}}
    rows = [
        {"name": "beta", **row, "keys": ["ID"], "sequence_by": ["TS"]},
        {"name": "alpha", **row, "keys": ["ID"], "sequence_by": ["TS"]},
        {"name": "broken", **row, "keys": ["NOPE"], "sequence_by": ["TS"]},
    ]
    path.write_text(yaml.safe_dump({"tables": rows}))
    return path


EXPECTED_POOLS = {
    "cdc_alpha": {
        "slots": 1,
        "description": "CDC table alpha: one Spark step of the table at a time",
    },
    "cdc_beta": {
        "slots": 1,
        "description": "CDC table beta: one Spark step of the table at a time",
    },
}


def test_write_private_creates_the_file_0600_whatever_the_umask(tmp_path: Path) -> None:
    target = tmp_path / "secret.json"
    old = os.umask(0)  # the most permissive umask: a plain open() would give 0666
    try:
        write_private(target, '{"admin": "one"}')
        assert mode(target) == 0o600
        write_private(target, '{"admin": "two"}')  # replaced whole, still 0600
    finally:
        os.umask(old)
    assert (target.read_text(), mode(target)) == ('{"admin": "two"}', 0o600)
    assert [p.name for p in tmp_path.iterdir()] == ["secret.json"]  # no temporary file left


@pytest.fixture
def launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[LocalAirflow, list[Any]]:
    """A LocalAirflow whose airflow CLI calls are recorded instead of run (with the pools file)."""
    monkeypatch.delenv("CDC_AIRFLOW_HOST", raising=False)
    # A spark-submit connection: start_services then starts no Spark Connect server.
    local = LocalAirflow(
        tmp_path / "home",
        config(tmp_path / "t.yaml"),
        tmp_path,
        tmp_path,
        spark_connection=local_airflow.LOCAL_SPARK,
        port=8793,
    )
    calls: list[Any] = []

    def record(*args: str, **kwargs: Any) -> None:
        pools = json.loads(Path(args[2]).read_text()) if args[:2] == ("pools", "import") else None
        calls.append((args, pools))

    monkeypatch.setattr(local, "airflow", record)
    return local, calls


def test_migrate_keeps_the_home_and_password_file_private_and_imports_one_pool_per_table(
    launcher: tuple[LocalAirflow, list[Any]],
) -> None:
    local, calls = launcher
    old = os.umask(0o022)  # the usual umask, which gives 0644 files and 0755 folders
    try:
        local.migrate()
    finally:
        os.umask(old)
    assert mode(local.home) == 0o700
    assert mode(local.passwords_file) == 0o600
    password = local.admin_password()
    assert len(password) >= 16
    assert calls[0] == (("db", "migrate"), None)
    assert calls[1][0][:2] == ("pools", "import") and calls[1][1] == EXPECTED_POOLS
    # A second migrate keeps the password; a file left 0644 by an older launcher is tightened.
    local.passwords_file.chmod(0o644)
    local.home.chmod(0o755)
    local.migrate()
    assert (local.admin_password(), mode(local.passwords_file), mode(local.home)) == (
        password,
        0o600,
        0o700,
    )


def test_the_api_server_binds_loopback_unless_told_otherwise(
    launcher: tuple[LocalAirflow, list[Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    local, _ = launcher
    assert local.api_server_command()[1:] == ["api-server", "--host", "127.0.0.1", "--port", "8793"]
    assert local.environment()["AIRFLOW__API__HOST"] == "127.0.0.1"
    assert local.url == "http://127.0.0.1:8793"
    monkeypatch.setenv("CDC_AIRFLOW_HOST", "0.0.0.0")
    exposed = LocalAirflow(tmp_path, tmp_path / "t.yaml", tmp_path, tmp_path, port=8793)
    assert exposed.api_server_command()[2:4] == ["--host", "0.0.0.0"]
    assert exposed.environment()["AIRFLOW__API__HOST"] == "0.0.0.0"
    assert exposed.url == "http://127.0.0.1:8793"  # clients still use loopback
    flag = LocalAirflow(tmp_path, tmp_path / "t.yaml", tmp_path, tmp_path, port=1, host="::1")
    assert (flag.api_server_command()[3], flag.url) == ("::1", "http://[::1]:1")


def test_start_services_runs_the_api_server_with_its_host(
    launcher: tuple[LocalAirflow, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    local, _ = launcher
    started: list[list[str]] = []

    class FakePopen:
        def __init__(self, command: list[str], **kwargs: Any) -> None:
            started.append(command)
            self.pid = 0

    monkeypatch.setattr(local_airflow.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(local, "wait_for_api", lambda: None)
    local.start_services()
    assert [c[1:] for c in started] == [
        ["api-server", "--host", "127.0.0.1", "--port", "8793"],
        ["scheduler"],
        ["dag-processor"],
    ]
    local.processes.clear()
    # Without the scheduler (a caller queueing runs first starts it itself).
    started.clear()
    local.start_services(scheduler=False)
    local.start("scheduler")
    assert [c[1] for c in started] == ["api-server", "dag-processor", "scheduler"]
    local.processes.clear()


def test_print_pools_is_what_the_compose_init_service_imports(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cdc_airflow.local.launcher", "--print-pools"],
        env={**os.environ, "CDC_CONFIG": str(config(tmp_path / "t.yaml"))},
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    assert json.loads(result.stdout) == EXPECTED_POOLS


def test_the_local_deployment_runs_the_preloading_executor_and_every_preload_imports(
    tmp_path: Path,
) -> None:
    from cdc_airflow.local.executor import PRELOADED, PreloadingLocalExecutor, preload

    local = LocalAirflow(tmp_path / "home", tmp_path / "tables.yaml", tmp_path, tmp_path)
    path = local.environment()["AIRFLOW__CORE__EXECUTOR"]
    module, _, name = path.rpartition(".")
    assert getattr(importlib.import_module(module), name) is PreloadingLocalExecutor
    # A renamed step module would only log a warning in the scheduler: caught here instead.
    assert "spark_jobs.stage" in PRELOADED and "pyspark.sql.connect.session" in PRELOADED
    assert preload() == []
    assert preload(("cdc_airflow.no_such_module",)) == ["cdc_airflow.no_such_module"]


def test_the_task_listeners_load_before_the_fork_with_no_thread_and_stay_loaded() -> None:
    # Loaded in the scheduler before its workers fork, so a task process finds them loaded;
    # forking is safe only if loading them started no thread.
    from airflow.sdk.listener import get_listener_manager

    from cdc_airflow.local.executor import load_listeners

    threads = threading.active_count()
    assert load_listeners()
    assert threading.active_count() == threads
    assert get_listener_manager.cache_info().currsize == 1  # what a task process's call returns


def test_a_task_process_builds_its_dag_with_nothing_left_to_import() -> None:
    # What a task process imports on its way to its DAG costs every task (0.15-0.2 s for
    # sqlglot's Spark dialect, which checks the partition expressions): all of it is preloaded.
    # And the config is validated before the fork: the task's DAG parse validates nothing.
    script = """
import os, sys
from cdc_airflow.local.executor import preload, preparse_config
from cdc_pipeline.config import loader
assert preload() == []
preparse_config()
def refused(*args):
    raise AssertionError("the config was validated again")
loader.parse_config = refused
before = set(sys.modules)
from cdc_airflow.dags import build_dags
print(list(build_dags()), sorted(set(sys.modules) - before))
"""
    env = {
        **os.environ,
        "CDC_CONFIG": str(REPO / "config" / "tables.yaml"),  # partition expressions in it
        "_AIRFLOW_PARSING_CONTEXT_DAG_ID": "cdc_orders",
    }
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout.splitlines()[-1] == "['cdc_orders'] []"


def test_the_executor_runs_its_task_processes_and_queues_the_other_tasks_behind_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.executors.local_executor import LocalExecutor

    from cdc_airflow.local.executor import PreloadingLocalExecutor

    env = LocalAirflow(tmp_path / "home", tmp_path / "t.yaml", tmp_path, tmp_path).environment()
    # The scheduler hands over 4 tasks; 2 run, 2 wait for a free process.
    assert (env["AIRFLOW__CORE__PARALLELISM"], env["AIRFLOW__CDC__TASK_PROCESSES"]) == ("4", "2")

    class Worker:
        def is_alive(self) -> bool:
            return True

    def spawn(self: LocalExecutor) -> None:  # instead of forking a worker process
        self.workers[len(self.workers) + 1] = Worker()  # type: ignore[assignment]

    monkeypatch.setattr(LocalExecutor, "_spawn_worker", spawn)
    monkeypatch.setenv("AIRFLOW__CDC__TASK_PROCESSES", "2")
    executor = PreloadingLocalExecutor(parallelism=4)
    executor.workers = {}
    executor._spawn_workers_with_gc_freeze(4)  # what start() asks for: parallelism
    executor._spawn_worker()  # what _check_workers asks for with tasks waiting
    assert (len(executor.workers), executor.slots_available) == (2, 4)
    # Without the setting it is the LocalExecutor: a process per task handed over.
    monkeypatch.delenv("AIRFLOW__CDC__TASK_PROCESSES")
    plain = PreloadingLocalExecutor(parallelism=3)
    plain.workers = {}
    plain._spawn_workers_with_gc_freeze(3)
    assert len(plain.workers) == 3


def test_the_supervisor_sees_its_task_process_exit_when_it_happens_not_at_its_next_heartbeat() -> (
    None
):
    import selectors

    import psutil
    from airflow.sdk.execution_time.supervisor import PsutilTracker, WatchedSubprocess

    from cdc_airflow.local.executor import notice_exit_at_once

    class Supervised:
        """What the supervisor's wait uses of itself: a task process whose pipes have all closed
        (an empty selector), still running for 0.2 s."""

        _check_subprocess_exit = WatchedSubprocess._check_subprocess_exit

        def __init__(self) -> None:
            child = psutil.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
            self._process = PsutilTracker(child)
            self._exit_code: int | None = None
            self._process_exit_monotonic: float | None = None
            self.selector = selectors.DefaultSelector()

    assert notice_exit_at_once() and notice_exit_at_once()  # patched once, then seen patched
    supervised = Supervised()
    started = time.monotonic()
    # The wait until the supervisor's next heartbeat, as long as it may be: 30 s.
    assert WatchedSubprocess._service_subprocess(supervised, max_wait_time=30.0) == 0
    assert time.monotonic() - started < 15  # the process's 0.2 s and its start, not 30 s


def test_a_task_sends_its_first_heartbeat_an_interval_after_its_start_not_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The start tells the API server the task runs (and records a heartbeat): the supervisor's
    first loop then sends no heartbeat of its own until `min_heartbeat_interval` has passed."""
    from types import SimpleNamespace

    from airflow.sdk.execution_time import supervisor
    from airflow.sdk.execution_time.supervisor import ActivitySubprocess

    from cdc_airflow.local.executor import no_heartbeat_at_start

    beats: list[int] = []

    def supervised() -> SimpleNamespace:
        """What the supervisor's start and heartbeat use of themselves."""
        client = SimpleNamespace(
            task_instances=SimpleNamespace(heartbeat=lambda ti_id, pid: beats.append(pid))
        )
        return SimpleNamespace(
            id="ti",
            client=client,
            _process=SimpleNamespace(pid=42),
            _terminal_state=None,
            _last_heartbeat_attempt=0.0,
            _last_successful_heartbeat=0.0,
            failed_heartbeats=0,
        )

    monkeypatch.setattr(supervisor, "MIN_HEARTBEAT_INTERVAL", 5)
    # Airflow's own supervisor, unpatched: a heartbeat at once, right after the start.
    ActivitySubprocess._send_heartbeat_if_needed(supervised())
    assert beats == [42]
    # Patched (the start itself stubbed: it is a request to the API server).
    monkeypatch.setattr(ActivitySubprocess, "_on_child_started", lambda self, **kwargs: None)
    assert no_heartbeat_at_start() and no_heartbeat_at_start()  # patched once, then seen patched
    task = supervised()
    ActivitySubprocess._on_child_started(task, ti=None)
    ActivitySubprocess._send_heartbeat_if_needed(task)
    assert beats == [42]  # none sent
    task._last_heartbeat_attempt -= 5  # an interval later
    ActivitySubprocess._send_heartbeat_if_needed(task)
    assert beats == [42, 42]
