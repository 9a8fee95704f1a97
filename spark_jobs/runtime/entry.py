"""The entry wrapper every step runs through (the CLI, spark-submit, the Airflow operator):
config, Spark session, body, summary line; one line on stderr and non-zero on failure."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cdc_pipeline import summaries
from cdc_pipeline.config import TableConfig, load_table_configs
from cdc_pipeline.errors import (
    PERMANENT_ERRORS,
    CdcError,
    ConfigError,
    UsageError,
)
from cdc_pipeline.paths import TablePaths
from cdc_pipeline.steps import Step, step_named
from spark_jobs.runtime.args import StepArgs, parse_step_args
from spark_jobs.runtime.context import StepContext
from spark_jobs.runtime.failures import one_line
from spark_jobs.runtime.notices import show_warnings_on_stderr
from spark_jobs.runtime.report import StepReport, summary_payload, write_failure, write_summary

StepBody = Callable[[StepContext, StepArgs], StepReport]


SparkFactory = Callable[[str], Any]


@dataclass(frozen=True, kw_only=True)
class StepPlan:
    """One step run, parsed and checked once before any Spark: its arguments (the interval
    typed), its config row and its table's folders. The Airflow backend decides from it whether
    the run has work, then hands the same plan to the step."""

    prog: str  # the step's name in summaries and error lines
    args: StepArgs
    table: TableConfig
    paths: TablePaths


def plan_step(args: StepArgs, prog: str) -> StepPlan:
    """The plan of a step run: its config row loaded and validated (ConfigError, UsageError)."""
    table = load_table_configs(args.config).table(args.table)
    return StepPlan(prog=prog, args=args, table=table, paths=TablePaths.for_table(table.name))


def perform(
    plan: StepPlan, body: StepBody, spark_factory: SparkFactory | None = None
) -> StepReport:
    """Run a step body on its plan and return its report; errors propagate (the CLI and Airflow
    map them).

    `spark_factory(app_name)` gives the session (None: a step that needs no Spark); the caller
    owns it. The CLI, spark-submit and the Airflow operator all come through here.
    """
    name = f"cdc-{plan.prog}-{plan.table.name}"
    spark = spark_factory(name) if spark_factory is not None else None
    return body(StepContext(spark, plan.table, plan.paths), plan.args)


def execute(args: StepArgs, prog: str, body: StepBody, *, needs_spark: bool = True) -> int:
    """Run a step body: config, Spark, summary line; one line on stderr and non-zero on failure.

    The session is a Connect client with `CDC_SPARK_REMOTE`, else classic on `CDC_SPARK_MASTER`.
    """
    show_warnings_on_stderr()
    try:
        factory: SparkFactory | None = None
        if needs_spark:
            from spark_jobs.runtime.session import build_spark_session

            factory = build_spark_session
        report = perform(plan_step(args, prog), body, factory)
    except (ConfigError, UsageError) as error:
        return usage_failure(prog, error)
    except Exception as error:
        if not isinstance(error, CdcError):
            traceback.print_exc(file=sys.stderr)
        line = f"error: {prog} {args.table}: {one_line(error)}"
        print(line, file=sys.stderr, flush=True)
        write_failure(line, permanent=isinstance(error, PERMANENT_ERRORS))
        return 1
    if not write_summary(report):  # else the Airflow task that reads the file logs the line
        print(report.line(), flush=True)
    summaries.record("summary", summary_payload(report))
    return 0


def usage_failure(prog: str, error: Exception) -> int:
    """A bad config or argument: one line on stderr (and in the failure file), exit code 2."""
    line = f"error: {prog}: {one_line(error)}"
    print(line, file=sys.stderr, flush=True)
    write_failure(line, permanent=True)
    return 2


def load_body(step: Step) -> StepBody:
    """The body function of a registered step (imports its module)."""
    import importlib

    body: StepBody = getattr(importlib.import_module(f"spark_jobs.{step.module}"), step.body)
    return body


def run_step(module: str, argv: Sequence[str] | None = None) -> int:
    """spark-submit entry of a registered step: parse `argv` (default sys.argv), execute it."""
    step = step_named(module)
    try:
        args = parse_step_args(step, sys.argv[1:] if argv is None else argv)
    except UsageError as error:
        return usage_failure(step.name, error)
    return execute(args, step.name, load_body(step), needs_spark=step.needs_spark)
