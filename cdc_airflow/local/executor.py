"""The local deployment's executor: Airflow's LocalExecutor, with the task code imported before its
workers fork.

The LocalExecutor forks its workers from the scheduler, and each worker forks one process per
task. A task of this package then imports the Spark Connect client (pyspark, pandas, pyarrow,
grpc), the Task SDK's runner and the step modules, the larger part of a small task's CPU.
Imported once here, in the scheduler before the workers fork, every task process starts with
them (copy-on-write). Importing creates no thread, socket or gRPC channel, so forking afterwards
is safe.

It also runs fewer task processes than the tasks it accepts: `[cdc] task_processes` processes
(default: core.parallelism, as the LocalExecutor), while the scheduler hands over up to
core.parallelism tasks. The others wait in the executor's queue and start the moment a process is
free. The LocalExecutor instead gives a process that finished its next task only in the
scheduler's next loop.

And its workers notice a task process's exit when it happens. A worker supervises each task
(the Task SDK's supervisor) by waiting on the task process's pipes; once the process has closed
them all on its way out, the supervisor slept in a wait on no pipes until its next heartbeat
(up to `[workers] min_heartbeat_interval`) before it saw the exit and freed the process for the
next task. Patched here (`notice_exit_at_once`): with no pipe left it waits for the process's exit
itself, which returns the moment the process ends. Together the two keep the task processes
from idling between tasks (the figures: docs/performance-log.md). Its supervisors also skip the
heartbeat the Task SDK sends right after the task's start (`no_heartbeat_at_start`).

Use it as `AIRFLOW__CORE__EXECUTOR=cdc_airflow.local.executor.PreloadingLocalExecutor` (the local
deployment does, with 2 task processes and parallelism 4); with another start method than fork
it preloads nothing.
"""

from __future__ import annotations

import importlib
import logging
import time
from typing import Any, cast

from airflow.configuration import conf
from airflow.executors.local_executor import LocalExecutor

from cdc_pipeline.steps import STEPS

log = logging.getLogger(__name__)

# What a task process imports on its way to a step, heaviest first.
PRELOADED = (
    "pyspark.sql.connect.session",
    "airflow.sdk.execution_time.task_runner",
    "cdc_airflow.dags",
    "cdc_airflow.operator",
    # The config's partition expressions are checked with sqlglot's Spark dialect, which sqlglot
    # imports on first use: 0.15-0.2 s of every task's DAG parse when not imported here.
    "sqlglot.dialects.spark",
    *(f"spark_jobs.{step.module}" for step in STEPS),
    # Imported by the steps as they run (delta-rs's file system handler, pyarrow's datasets and
    # pandas conversion, Connect's window functions): about 12 ms a task.
    "deltalake.fs",
    "pyarrow.dataset",
    "pyarrow.pandas_compat",
    "pyspark.sql.connect.window",
    # Imported by every interval step before any Spark (whether it has work: the ledger, the
    # Kafka offsets), and by the Task SDK's runner and the Connect client on their way to the
    # step (its template environment's extensions, the asset metadata, the gRPC channel, the
    # ledger's Acero query): about 10% of a task process's CPU, sampled in a 65-table cycle.
    "spark_jobs.status.pending_work",
    "jinja2.ext",
    "airflow.sdk.definitions.asset.metadata",
    "grpc._channel",
    "pyarrow.acero",
    # The rest a task process imported after the fork in a cycle run with
    # PYTHONPROFILEIMPORTTIME=1 (its task logs list them): the DAG file's module, the runner's
    # timeout, cache, stats and version modules, and the partition expression's check over
    # the change rows (with Connect's SQL formatter it uses).
    "cdc_airflow.dag_files.tables",
    "airflow.version",
    "airflow.sdk.execution_time.timeout",
    "airflow.sdk.execution_time.cache",
    "airflow.sdk.observability.stats",
    "spark_jobs.rules.expression_check",
    "pyspark.sql.connect.sql_formatter",
)


def preload(modules: tuple[str, ...] = PRELOADED) -> list[str]:
    """Import `modules`; returns the ones that failed (logged, not raised: a task that needs one
    imports it itself and reports the error where it belongs)."""
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as error:  # a preload never stops the scheduler
            log.warning("preload of %s failed: %s", name, error)
            failed.append(name)
    return failed


def load_listeners() -> bool:
    """Load the Task SDK's listeners (the plugins' entry points and folder, found and imported)
    once before the workers fork: every task process otherwise does it when it starts (about 3%
    of its CPU, reading each installed distribution's metadata). The manager it builds is cached
    for the process (`functools.cache`), so the forked task processes start with it. Whether it
    loaded (a failure is logged; each task then loads the listeners itself)."""
    try:
        from airflow.sdk.listener import get_listener_manager

        get_listener_manager()
    except Exception as error:  # a preload never stops the scheduler
        log.warning("loading the task listeners before the fork failed: %s", error)
        return False
    return True


def preparse_config() -> None:
    """Validate the config table once before the workers fork: every task process then starts
    with it parsed (the loader validates a given text once per process; about 0.1 s for 65
    rows, of every task's DAG parse). A config changed later is validated again by each task."""
    from cdc_pipeline.config import load_table_configs

    try:
        load_table_configs()
    except Exception as error:  # a preparse never stops the scheduler
        log.warning("preparse of the config table failed: %s", error)


def notice_exit_at_once() -> bool:
    """Make the Task SDK's supervisor wait for its task process's exit, not for nothing, once the
    process has closed every pipe; whether the supervisor is the one this was written for (a
    later Airflow whose supervisor differs is left as it is)."""
    from airflow.sdk.execution_time.supervisor import WatchedSubprocess

    original = getattr(WatchedSubprocess, "_service_subprocess", None)
    if original is None or not hasattr(WatchedSubprocess, "_check_subprocess_exit"):
        return False
    if getattr(original, "notices_exit_at_once", False):
        return True

    def _service_subprocess(
        self: Any, max_wait_time: float, raise_on_timeout: bool = False, expect_signal: Any = None
    ) -> int | None:
        if self._exit_code is None and not self.selector.get_map():
            try:  # returns when the process exits (its exit code kept for the check below)
                self._process.wait(timeout=max(0.01, max_wait_time))
                max_wait_time = 0
            except self._process.TimeoutExpired:
                max_wait_time = 0  # waited the whole time already
        return cast(
            "int | None",
            original(
                self,
                max_wait_time,
                raise_on_timeout=raise_on_timeout,
                expect_signal=expect_signal,
            ),
        )

    _service_subprocess.notices_exit_at_once = True  # type: ignore[attr-defined]
    WatchedSubprocess._service_subprocess = _service_subprocess  # type: ignore[method-assign]
    return True


def no_heartbeat_at_start() -> bool:
    """Make the Task SDK's supervisor send its task's first heartbeat one heartbeat interval
    after the start, not at once; whether the supervisor is the one this was written for.

    The supervisor tells the API server the task started (which records a heartbeat), then
    its first loop sends a heartbeat straight away: its last attempt starts at 0. That second
    request carried nothing the start had not (130 a 65-table cycle, 18-31 ms each in the
    api-server's logs); a task still running after `[workers] min_heartbeat_interval`
    heartbeats as before, and one that ends sooner sends none."""
    from airflow.sdk.execution_time.supervisor import ActivitySubprocess

    original = getattr(ActivitySubprocess, "_on_child_started", None)
    fields = getattr(ActivitySubprocess, "__attrs_attrs__", ())
    if original is None or not any(f.name == "_last_heartbeat_attempt" for f in fields):
        return False
    if getattr(original, "no_heartbeat_at_start", False):
        return True

    def _on_child_started(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._last_heartbeat_attempt = time.monotonic()  # the start was the first heartbeat

    _on_child_started.no_heartbeat_at_start = True  # type: ignore[attr-defined]
    ActivitySubprocess._on_child_started = _on_child_started  # type: ignore[method-assign]
    return True


class PreloadingLocalExecutor(LocalExecutor):
    """LocalExecutor whose forked workers (and so their task processes) start with the task code
    already imported, and whose `task_processes` workers take the tasks queued beyond them as
    soon as they are free."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        wanted = conf.getint("cdc", "task_processes", fallback=self.parallelism)
        self.task_processes = max(1, min(wanted, self.parallelism))

    def _spawn_workers_with_gc_freeze(self, spawn_number: int) -> None:
        missing = min(spawn_number, self.task_processes - len(self.workers))
        if missing > 0:
            super()._spawn_workers_with_gc_freeze(missing)

    def _spawn_worker(self) -> None:
        if len(self.workers) < self.task_processes:
            super()._spawn_worker()

    def start(self) -> None:
        if not notice_exit_at_once():
            log.warning("the Task SDK supervisor is not the one expected: exits noticed as before")
        if not no_heartbeat_at_start():
            log.warning("the Task SDK supervisor is not the one expected: it heartbeats at start")
        if self.is_mp_using_fork:
            began = time.monotonic()
            failed = preload()
            preparse_config()
            load_listeners()
            log.info(
                "imported the task code before forking workers in %.1f s%s",
                time.monotonic() - began,
                f" (failed: {', '.join(failed)})" if failed else "",
            )
        super().start()
