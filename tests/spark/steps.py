"""Running steps in the shared session, as the CLI would."""

from __future__ import annotations

from typing import Any

from cdc_pipeline.config import TableConfig
from spark_jobs.overwrite_final import run_overwrite_final
from spark_jobs.runtime.context import StepContext
from spark_jobs.runtime.report import StepReport
from spark_jobs.stage import run_stage
from tests.helpers import Workspace, interval


def context(spark: Any, ws: Workspace, table: TableConfig) -> StepContext:
    return StepContext(spark, table, ws.paths(table.name))


def run(
    spark: Any, ws: Workspace, table: TableConfig, start: str, end: str
) -> tuple[StepReport, StepReport]:
    """stage + overwrite-final of [start, end)."""
    ctx = context(spark, ws, table)
    window = interval(start, end)
    return run_stage(ctx, window), run_overwrite_final(ctx, window)
