"""A step's typed arguments and their command lines (spark-submit, `cdc <step>`, the Airflow
operator)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from cdc_pipeline.errors import (
    UsageError,
)
from cdc_pipeline.intervals import Interval
from cdc_pipeline.paths import Location, as_location
from cdc_pipeline.steps import ArgumentKind, Step


@dataclass(frozen=True, kw_only=True)
class StepArgs:
    """Arguments of one step run, parsed and checked once: the table, the config, the interval
    (when the step has one; parsed from --start/--end before any session starts)."""

    table: str
    config: Path | None = None
    interval: Interval | None = None
    retention_hours: int | None = None
    force: bool = False
    at: str | None = None
    output: Location | None = None
    limit: int | None = None

    def required_interval(self) -> Interval:
        """The data interval [start, end) of a step that reads by interval."""
        if self.interval is None:
            raise UsageError("--start and --end are required")
        return self.interval


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    """`check [TABLE ...] [--config PATH]`."""
    parser.add_argument("tables", nargs="*", metavar="TABLE", help="tables (default: every one)")
    parser.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="config table file")


def add_step_arguments(
    parser: argparse.ArgumentParser, kind: ArgumentKind, *, interval_is_label: bool = False
) -> None:
    """The arguments of a step of `kind` (shared by `cdc` and the spark-submit entries).

    `interval_is_label`: --start/--end are optional and only name the run in its summary (the
    step applies whatever is pending, whatever the interval)."""
    parser.add_argument("table", help="table name (a row of the config table)")
    parser.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="config table file")
    if kind == "interval":
        label = " (optional: it only labels the summary)" if interval_is_label else ""
        required = not interval_is_label
        parser.add_argument(
            "--start", required=required, help=f"interval start, ISO 8601 (inclusive){label}"
        )
        parser.add_argument(
            "--end", required=required, help=f"interval end, ISO 8601 (exclusive){label}"
        )
    if kind == "vacuum":
        parser.add_argument("--retention-hours", type=int, default=None, help="default: the row's")
        parser.add_argument("--force", action="store_true", help="allow a retention below 168 h")
    if kind == "as_of":
        parser.add_argument(
            "--at",
            required=True,
            help="a value of the first sequence_by column: ISO 8601 timestamp or date, or a number",
        )
        parser.add_argument(
            "--output",
            type=as_location,
            default=None,
            help="write a Delta table here (a folder or s3://bucket/prefix) instead of printing",
        )
        parser.add_argument("--limit", type=int, default=None, help="rows to print (default 20)")


def interval_from(start: str | None, end: str | None) -> Interval | None:
    """The interval of --start/--end (None without both); a bad one fails here, once."""
    if start is None and end is None:
        return None
    if start is None or end is None:
        raise UsageError("--start and --end go together: give both or neither")
    return Interval.parse(start, end)


def step_args_from(namespace: argparse.Namespace) -> StepArgs:
    """StepArgs from parsed arguments (UsageError for a bad interval)."""
    return StepArgs(
        table=namespace.table,
        config=getattr(namespace, "config", None),
        interval=interval_from(getattr(namespace, "start", None), getattr(namespace, "end", None)),
        retention_hours=getattr(namespace, "retention_hours", None),
        force=getattr(namespace, "force", False),
        at=getattr(namespace, "at", None),
        output=getattr(namespace, "output", None),
        limit=getattr(namespace, "limit", None),
    )


def parse_step_args(step: Step, argv: Sequence[str], config: Path | None = None) -> StepArgs:
    """StepArgs from a step's argv (as spark-submit would get it) and a config path."""
    parser = argparse.ArgumentParser(prog=step.name)
    add_step_arguments(parser, step.kind, interval_is_label=step.interval_is_label)
    args = step_args_from(parser.parse_args(list(argv)))
    return args if args.config is not None or config is None else replace(args, config=config)
