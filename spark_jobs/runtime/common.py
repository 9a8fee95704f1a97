"""What every step shares: typed arguments, the step context, the summary line, the entry wrapper."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from cdc_pipeline import summaries
from cdc_pipeline.config import TableConfig, load_table_configs
from cdc_pipeline.counts import Counts, NoopCounts
from cdc_pipeline.errors import (
    PERMANENT_ERRORS,
    CdcError,
    ConfigError,
    UsageError,
)
from cdc_pipeline.intervals import Interval
from cdc_pipeline.paths import Location, TablePaths, as_location
from cdc_pipeline.steps import ArgumentKind, Step, step_named
from spark_jobs.runtime.notices import show_warnings_on_stderr

C = TypeVar("C", bound=Counts)


@dataclass(frozen=True)
class StepArgs:
    """Arguments of one step run: the table, the interval (when the step has one), the config."""

    table: str
    config: Path | None = None
    start: str | None = None
    end: str | None = None
    retention_hours: int | None = None
    force: bool = False
    at: str | None = None
    output: Location | None = None
    limit: int | None = None

    def interval(self) -> Interval:
        """The data interval [start, end)."""
        if self.start is None or self.end is None:
            raise UsageError("--start and --end are required")
        return Interval.parse(self.start, self.end)


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    """`check [TABLE ...] [--config PATH]`."""
    parser.add_argument("tables", nargs="*", metavar="TABLE", help="tables (default: every one)")
    parser.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="config table file")


def add_step_arguments(parser: argparse.ArgumentParser, kind: ArgumentKind) -> None:
    """The arguments of a step of `kind` (shared by `cdc` and the spark-submit entries)."""
    parser.add_argument("table", help="table name (a row of the config table)")
    parser.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="config table file")
    if kind == "interval":
        parser.add_argument("--start", required=True, help="interval start, ISO 8601 (inclusive)")
        parser.add_argument("--end", required=True, help="interval end, ISO 8601 (exclusive)")
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


def step_args_from(namespace: argparse.Namespace) -> StepArgs:
    """StepArgs from parsed arguments."""
    return StepArgs(
        table=namespace.table,
        config=getattr(namespace, "config", None),
        start=getattr(namespace, "start", None),
        end=getattr(namespace, "end", None),
        retention_hours=getattr(namespace, "retention_hours", None),
        force=getattr(namespace, "force", False),
        at=getattr(namespace, "at", None),
        output=getattr(namespace, "output", None),
        limit=getattr(namespace, "limit", None),
    )


@dataclass(frozen=True)
class StepContext:
    """A configured table, where its data lives, and the Spark session to process it."""

    spark: Any  # SparkSession; None for steps that need no Spark (vacuum)
    table: TableConfig
    paths: TablePaths


@dataclass
class StepReport(Generic[C]):
    """What a step did, printed as one summary line: `step table interval: key=value ...`.
    `result` is the step's typed counts (`cdc_pipeline.counts`); `counts` the same by name."""

    step: str
    table: str
    interval: str
    result: C

    @property
    def counts(self) -> dict[str, Any]:
        """The counts by name, in the order the line shows them (the JSON's `counts`)."""
        return self.result.as_dict()

    def line(self) -> str:
        """The one-line summary."""
        where = f" {self.interval}" if self.interval else ""
        values = " ".join(f"{k}={v}" for k, v in self.counts.items())
        return f"{self.step} {self.table}{where}: {values}".rstrip()


def _message(error: BaseException) -> str:
    """An error's message, also when it cannot be had: py4j's Java errors ask the JVM for their
    text, and a JVM that has just died (out of memory) cannot answer."""
    try:
        return str(error)
    except Exception:
        return str(getattr(error, "errmsg", "") or "")


def one_line(error: BaseException) -> str:
    """An error as one line: its message's first line, prefixed by its kind for non-CDC errors."""
    if isinstance(error, CdcError):
        message = _message(error).strip()
        return message.splitlines()[0] if message else type(error).__name__
    resource = _resource_problem(error)
    if resource is not None:
        return resource
    remote = os.environ.get("CDC_SPARK_REMOTE")
    lost = connect_server_lost(error) if remote else None
    if lost is not None:
        # The server went away mid-step (its gRPC error names no server): say which one.
        return (
            f"Spark Connect server {remote} stopped answering ({lost}); "
            "nothing was committed past the last commit the summary reports: rerun the step"
        )
    return error_line(error)


# What a Spark Connect client reports when its server restarted or dropped the step's session:
# a new server instance answers the old session with INVALID_HANDLE.SESSION_CHANGED or
# SESSION_NOT_FOUND (PySpark may wrap it in RESPONSE_ALREADY_RECEIVED), PySpark then refuses
# every call on that session with NO_ACTIVE_SESSION; a server that is gone, gRPC's UNAVAILABLE.
# (Seen in tests/deploy/test_topology.py, the Connect server restarted during a cycle.)
_SERVER_LOST_TYPES = ("SparkConnectGrpcException", "RetriesExceeded")
# A server being stopped first stops its SparkContext: a job in flight then fails with one of the
# last two (an IllegalStateException or SparkException sent back as an ordinary error).
_SERVER_LOST_MARKERS = (
    "INVALID_HANDLE.SESSION_",
    "NO_ACTIVE_SESSION",
    "StatusCode.UNAVAILABLE",
    "Cannot call methods on a stopped SparkContext",
    "because SparkContext was shut down",
)


def connect_server_lost(error: BaseException) -> str | None:
    """Why the Spark Connect server stopped answering or restarted during the step, when
    `error`'s chain (its causes and the errors it was raised while handling) says so: transient,
    a retry of the step resumes. The reason is the chain's most telling line (`Kind: line`).
    None when the failure is anything else."""
    lines: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        kind = type(current).__name__
        text = _message(current)
        for line in text.splitlines():
            if any(marker in line for marker in _SERVER_LOST_MARKERS):
                lines.append(f"{kind}: {line.strip()}")
        if kind in _SERVER_LOST_TYPES and not lines:
            lines.append(error_line(current))
        current = current.__cause__ or current.__context__
    if not lines:
        return None
    return next((line for line in lines if _SERVER_LOST_MARKERS[0] in line), lines[0])


def error_line(error: BaseException) -> str:
    """`Kind: first line of the message`."""
    message = _message(error).strip()
    return f"{type(error).__name__}: {message.splitlines()[0]}" if message else type(error).__name__


NOTHING_PAST = "nothing past the last commit the summary reports was written"


def _driver_memory_advice() -> str:
    setting = os.environ.get("CDC_SPARK_DRIVER_MEMORY")
    memory = setting or "1g, Spark's default"
    where = " (the Connect server's: restart it)" if os.environ.get("CDC_SPARK_REMOTE") else ""
    return (
        f"driver memory is {memory}: set CDC_SPARK_DRIVER_MEMORY higher{where}, "
        f"e.g. {_larger_memory(setting)}"
    )


_JVM_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _larger_memory(setting: str | None) -> str:
    """A JVM size above `setting` (Spark's default 1g when unset): 4g, or twice what is set from
    4g up, so the advice never names what already failed."""
    found = re.fullmatch(r"(\d+)([kmgt])b?", (setting or "1g").strip().lower())
    if found is None:
        return "4g"
    number, unit = int(found.group(1)), found.group(2)
    if number * _JVM_UNITS[unit] < 4 * _JVM_UNITS["g"]:
        return "4g"
    return f"{number * 2}{unit}"


def _resource_problem(error: BaseException) -> str | None:
    """The one line for an error whose cause is the machine, not the data: the driver out of
    memory, the disk full, the storage read-only (Spark names them only deep in a Java trace)."""
    texts, seen = [], set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts.append(f"{type(current).__name__}: {_message(current)}")
        current = current.__cause__ or current.__context__
    text = "\n".join(texts)
    out_of_memory = (
        f"Spark ran out of memory (java.lang.OutOfMemoryError): {_driver_memory_advice()}; "
        + NOTHING_PAST
    )
    if "OutOfMemoryError" in text or "GC overhead limit exceeded" in text:
        return out_of_memory
    if "No space left on device" in text:
        return (
            "disk full (No space left on device): free space where CDC_WAREHOUSE lives and in "
            f"Spark's scratch directory (spark.local.dir, default /tmp), then rerun; {NOTHING_PAST}"
        )
    if (
        "Read-only file system" in text
        or "ReadOnlyFileSystemException" in text
        or _read_only_folder(text)
    ):
        return (
            "storage is read-only (Read-only file system): CDC_WAREHOUSE must be writable; remount "
            f"it read-write or point CDC_WAREHOUSE elsewhere, then rerun; {NOTHING_PAST}"
        )
    exit_code = _driver_jvm_exit() if "Py4J" in text or "Connection refused" in text else None
    if exit_code == SPARK_EXIT_OOM:
        return out_of_memory
    if exit_code is not None or (
        not os.environ.get("CDC_SPARK_REMOTE")
        and (
            type(error).__name__ in ("Py4JNetworkError", "ConnectionRefusedError")
            or "Answer from Java side is empty" in text
        )
    ):
        return (
            "Spark's driver JVM exited mid-step (most often out of memory: look for "
            f"java.lang.OutOfMemoryError above): {_driver_memory_advice()}; {NOTHING_PAST}"
        )
    return None


SPARK_EXIT_OOM = 52  # SparkExitCode.OOM: the JVM's exit after an OutOfMemoryError in a task


def _driver_jvm_exit() -> int | None:
    """The exit code of the classic session's driver JVM if it died under this step, else None.

    An OutOfMemoryError in a task makes Spark's uncaught-exception handler exit the JVM with
    code 52; the Python side then sees whatever the dying JVM answered last (a stopped
    SparkContext's NullPointerException, a refused connection), not the OutOfMemoryError.
    Waits a few seconds for the exit: the JVM runs its shutdown hooks first.
    """
    if os.environ.get("CDC_SPARK_REMOTE") or "pyspark" not in sys.modules:
        return None
    from pyspark import SparkContext

    process = getattr(SparkContext._gateway, "proc", None)
    if process is None:
        return None
    try:
        return int(process.wait(timeout=JVM_EXIT_WAIT_SECONDS))
    except subprocess.TimeoutExpired:
        return None  # the JVM lives: an ordinary Java error


JVM_EXIT_WAIT_SECONDS = 10


def _read_only_folder(text: str) -> bool:
    """Whether Hadoop's "Mkdirs failed to create <path>" (its local file system says no more)
    is about a folder on a read-only mount."""
    failed = re.search(r"Mkdirs failed to create (?:file:)?(/\S+)", text)
    if failed is None:
        return False
    folder = Path(failed.group(1))
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


StepBody = Callable[[StepContext, StepArgs], StepReport]


SparkFactory = Callable[[str], Any]


def perform(
    args: StepArgs, prog: str, body: StepBody, spark_factory: SparkFactory | None = None
) -> StepReport:
    """Run a step body and return its report; errors propagate (the CLI and Airflow map them).

    `spark_factory(app_name)` gives the session (None: a step that needs no Spark); the caller
    owns it. The CLI, spark-submit and the Airflow operator all come through here.
    """
    table = load_table_configs(args.config).table(args.table)
    if args.start is not None:
        args.interval()  # a bad timestamp fails before a session starts
    spark = spark_factory(f"cdc-{prog}-{args.table}") if spark_factory is not None else None
    return body(StepContext(spark, table, TablePaths.for_table(table.name)), args)


def execute(args: StepArgs, prog: str, body: StepBody, needs_spark: bool = True) -> int:
    """Run a step body: config, Spark, summary line; one line on stderr and non-zero on failure.

    The session is a Connect client with `CDC_SPARK_REMOTE`, else classic on `CDC_SPARK_MASTER`.
    """
    show_warnings_on_stderr()
    try:
        factory: SparkFactory | None = None
        if needs_spark:
            from spark_jobs.runtime.session import build_spark_session

            factory = build_spark_session
        report = perform(args, prog, body, factory)
    except (ConfigError, UsageError) as error:
        line = f"error: {prog}: {one_line(error)}"
        print(line, file=sys.stderr, flush=True)
        write_failure(line, permanent=True)
        return 2
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


def load_body(step: Step) -> StepBody:
    """The body function of a registered step (imports its module)."""
    import importlib

    body: StepBody = getattr(importlib.import_module(f"spark_jobs.{step.module}"), step.body)
    return body


def parse_step_args(step: Step, argv: Sequence[str], config: Path | None = None) -> StepArgs:
    """StepArgs from a step's argv (as spark-submit would get it) and a config path."""
    parser = argparse.ArgumentParser(prog=step.name)
    add_step_arguments(parser, step.kind)
    args = step_args_from(parser.parse_args(list(argv)))
    return args if args.config is not None or config is None else replace(args, config=config)


def noop_report(prog: str, table: str, interval: Interval) -> StepReport:
    """The report of an interval with nothing to do: no landing file, no staged batch."""
    return StepReport(prog, table, str(interval), NoopCounts())


def summary_payload(report: StepReport) -> dict[str, Any]:
    """The report as plain JSON data (an Airflow task's XCom): step, table, interval, counts, line."""
    payload = {
        "step": report.step,
        "table": report.table,
        "interval": report.interval,
        "counts": report.counts,
        "line": report.line(),
    }
    return dict(json.loads(json.dumps(payload, default=str)))


def write_failure(line: str, *, permanent: bool) -> None:
    """Where CDC_SUMMARY_PATH says, the failure's one line and whether a retry would fail the
    same way (the Airflow task fails with that line, once if permanent)."""
    target = os.environ.get("CDC_SUMMARY_PATH")
    if target:
        Path(target).write_text(json.dumps({"error": line, "permanent": permanent}))


def write_summary(report: StepReport) -> bool:
    """Write the counts as JSON where CDC_SUMMARY_PATH says (the Airflow task reads them);
    whether it did."""
    target = os.environ.get("CDC_SUMMARY_PATH")
    if target:
        Path(target).write_text(json.dumps(summary_payload(report)))
    return bool(target)


def run_step(module: str, argv: Sequence[str] | None = None) -> int:
    """spark-submit entry of a registered step: parse `argv` (default sys.argv), execute it."""
    step = step_named(module)
    args = parse_step_args(step, sys.argv[1:] if argv is None else argv)
    return execute(args, step.name, load_body(step), step.needs_spark)
