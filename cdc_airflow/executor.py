"""The local deployment's executor: Airflow's LocalExecutor, with the task code imported before its
workers fork.

The LocalExecutor forks its workers from the scheduler, and each worker forks one process per
task. A task of this package then imports the Spark Connect client (pyspark, pandas, pyarrow,
grpc), the Task SDK's runner and the step modules: about a second of CPU per task, which at 65
tables and two tasks each is a minute of a 2-core machine per cycle. Imported once here, in
the scheduler before the workers fork, every task process starts with them (copy-on-write).
Importing creates no thread, socket or gRPC channel, so forking afterwards is safe.

Use it as `AIRFLOW__CORE__EXECUTOR=cdc_airflow.executor.PreloadingLocalExecutor` (the local
deployment does); with another start method than fork it behaves as the LocalExecutor.
"""

from __future__ import annotations

import importlib
import logging
import time

from airflow.executors.local_executor import LocalExecutor

from cdc_pipeline.steps import STEPS

log = logging.getLogger(__name__)

# What a task process imports on its way to a step, heaviest first.
PRELOADED = (
    "pyspark.sql.connect.session",
    "airflow.sdk.execution_time.task_runner",
    "cdc_airflow.dags",
    *(f"spark_jobs.{step.module}" for step in STEPS),
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


class PreloadingLocalExecutor(LocalExecutor):
    """LocalExecutor whose forked workers (and so their task processes) start with the task code
    already imported."""

    def start(self) -> None:
        if self.is_mp_using_fork:
            began = time.monotonic()
            failed = preload()
            log.info(
                "imported the task code before forking workers in %.1f s%s",
                time.monotonic() - began,
                f" (failed: {', '.join(failed)})" if failed else "",
            )
        super().start()
