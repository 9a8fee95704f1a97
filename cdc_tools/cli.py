"""The `cdc` command: validate the config table and run the steps of one table."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

from cdc_pipeline import summaries
from cdc_pipeline.config import load_table_configs
from cdc_pipeline.errors import UsageError
from cdc_pipeline.intervals import parse_timestamp
from cdc_pipeline.paths import landing_root, warehouse_root
from cdc_pipeline.steps import RUN, STEPS, step_named

JSON = "print the summary as one JSON object on stdout"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `cdc` and its commands."""
    from spark_jobs.runtime.args import add_check_arguments, add_step_arguments

    parser = argparse.ArgumentParser(
        prog="cdc", description="CDC into Delta Lake tables with Spark."
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="config table (default: $CDC_CONFIG or config/tables.yaml)",
    )
    parser.add_argument(
        "--version", action="version", version=f"cdc {metadata.version('cdc-lakehouse')}"
    )
    parser.add_argument("--json", action="store_true", help=JSON)
    commands = parser.add_subparsers(dest="command", required=True)
    validate = commands.add_parser("validate", help="check every row of the config table")
    validate.add_argument("--config", type=Path, default=argparse.SUPPRESS)
    # The steps of the registry, with the composite `run` after the last step it runs.
    for step in STEPS:
        command = commands.add_parser(step.name, help=step.help)
        if step.kind == "tables":
            add_check_arguments(command)
        else:
            add_step_arguments(command, step.kind, interval_is_label=step.interval_is_label)
        if step.name == RUN.steps[-1]:
            add_step_arguments(commands.add_parser(RUN.name, help=RUN.help), "interval")
    _add_bench_commands(commands)
    _add_status_commands(commands)
    _add_repair_command(commands)
    demo = commands.add_parser("demo", help="generate sample change sets and apply them")
    demo.add_argument("--config", type=Path, default=argparse.SUPPRESS)
    demo.add_argument(
        "--start", default="2024-01-01T00:00:00Z", help="first hour of the sample data"
    )
    demo.add_argument("--hours", type=int, default=3, help="hours of sample data (one run each)")
    demo.add_argument("--keys", type=int, default=2000, help="order lines loaded in the first hour")
    demo.add_argument(
        "--without-airflow",
        action="store_true",
        help="apply the runs in this process instead of an Airflow backfill",
    )
    for command in commands.choices.values():
        command.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=JSON)
    return parser


def _add_status_commands(commands: Any) -> None:
    """`cdc status` and `cdc quarantine`: what the tables hold and wait for, without Spark."""
    status = commands.add_parser(
        "status",
        help="per table: newest applied change, files waiting (landed, not applied), oldest waiting",
    )
    status.add_argument("--config", type=Path, default=argparse.SUPPRESS)
    status.add_argument("tables", nargs="*", help="table names (default: every table)")
    status.add_argument(
        "--at", default=None, help="measure as of this time, ISO 8601 (default: now)"
    )
    quarantine = commands.add_parser(
        "quarantine",
        help="what a table's quarantine holds: rows per hour and reason, sample rows with "
        "their values and source file",
    )
    quarantine.add_argument("--config", type=Path, default=argparse.SUPPRESS)
    quarantine.add_argument("table", help="table name")
    quarantine.add_argument(
        "--hours", type=int, default=24, help="newest hour folders to take samples from (24)"
    )
    quarantine.add_argument("--samples", type=int, default=20, help="sample rows to show (20)")


def _add_repair_command(commands: Any) -> None:
    """`cdc repair TABLE [--dry-run] [--force]`."""
    repair = commands.add_parser(
        "repair",
        help="rebuild a damaged final (history, applied) from staging and the remembered "
        "deletes, then check it; pause the table's DAG first",
    )
    repair.add_argument("--config", type=Path, default=argparse.SUPPRESS)
    repair.add_argument("table", help="table name")
    repair.add_argument(
        "--dry-run", action="store_true", help="print what is damaged and the plan; change nothing"
    )
    repair.add_argument(
        "--force", action="store_true", help="rebuild final even when nothing is damaged"
    )


def _add_bench_commands(commands: Any) -> None:
    """`cdc bench` and `cdc bench-cycle` with their options (the latter's in its own function)."""
    bench = commands.add_parser(
        "bench",
        help="overwrite-final vs a full rebuild and the MERGEs of delta-rs and delta-spark, timed "
        "side by side; optionally messages staged per second from Kafka",
    )
    bench.add_argument("--config", type=Path, default=argparse.SUPPRESS)
    bench.add_argument("--rows", type=int, default=None, help="rows of the x1 table (5000000)")
    bench.add_argument("--partitions", type=int, default=None, help="partitions (100)")
    bench.add_argument("--key-width", type=int, default=None, help="key columns (1)")
    bench.add_argument("--changes", type=int, default=None, help="rows of the change set (20000)")
    bench.add_argument(
        "--fractions", default=None, help="touched fractions of partitions (0.01,0.05,0.25)"
    )
    bench.add_argument("--sizes", default=None, help="table size multipliers (1,4)")
    bench.add_argument(
        "--repeats", type=int, default=None, help="runs of overwrite-final and MERGE (3): median"
    )
    bench.add_argument(
        "--warm-up-runs",
        type=int,
        default=None,
        help="runs of each of them before those counted, at the case's size (2); 0: a cold JVM",
    )
    bench.add_argument(
        "--key-layout",
        choices=["ordered", "spread"],
        default=None,
        help="ordered: the key is the row id (narrow file key ranges); spread: a scrambled id, "
        "like a hash or UUID key, that file statistics cannot prune (ordered)",
    )
    bench.add_argument(
        "--partition-stable",
        action="store_true",
        help="declare the table partition_stable (the change set then moves no key)",
    )
    bench.add_argument(
        "--methods",
        default=None,
        help="comma-separated methods to measure (default: all): overwrite_final (always run), "
        "full_rebuild, delta_rs_merge, delta_rs_merge_unstreamed, delta_spark_merge, "
        "delta_spark_merge_dv",
    )
    bench.add_argument(
        "--kafka-messages",
        type=int,
        default=None,
        help="also measure messages staged per second: the bench starts the bundled Kafka "
        "broker, sends N change messages to a topic and stages them as a source: kafka table "
        "(median of --repeats runs, each into a fresh table; default: not measured)",
    )
    bench.add_argument("--output", type=Path, default=None, help="results folder (bench-results)")
    bench.add_argument("--smoke", action="store_true", help="tiny sizes: the harness in seconds")
    _add_bench_cycle_command(commands)


def _add_bench_cycle_command(commands: Any) -> None:
    """`cdc bench-cycle` with its options."""
    cycle = commands.add_parser(
        "bench-cycle",
        help="N tables through one scheduling cycle of a real Airflow, Connect vs spark-submit, "
        "reading landed files or Kafka topics",
    )
    cycle.add_argument(
        "--config", type=Path, default=argparse.SUPPRESS, help="unused: the bench writes its own"
    )
    cycle.add_argument("--tables", type=int, default=None, help="tables (65)")
    cycle.add_argument("--changes", type=int, default=None, help="changes per table (300)")
    cycle.add_argument(
        "--mode", choices=["connect", "spark-submit", "both"], default="both", help="(both)"
    )
    cycle.add_argument(
        "--source",
        choices=["files", "kafka", "both"],
        default="files",
        help="the tables read landed files, a Kafka topic each (a broker the bench starts), or "
        "both: per mode one after the other, side by side in the report (files)",
    )
    cycle.add_argument(
        "--kafka-conn-id", default=None, help="the Kafka tables' connection (kafka_default)"
    )
    cycle.add_argument(
        "--parallelism",
        type=int,
        default=None,
        help="task processes at once, each with a task queued behind it (the launcher's: 2)",
    )
    cycle.add_argument(
        "--every",
        type=int,
        default=None,
        help="the tables' schedule in minutes: 60 (@hourly, default), or 30, 15, 10 or 5 "
        "(*/15: sub-hourly runs over the hourly folders; 5 or 10 to run many cycles in less "
        "time)",
    )
    cycle.add_argument(
        "--output", type=Path, default=None, help="results folder (bench-results/cycle)"
    )
    cycle.add_argument(
        "--smoke", action="store_true", help="3 tables, 30 changes, one mode (Connect if available)"
    )
    _add_bench_cycle_server_options(cycle)


def _add_bench_cycle_server_options(cycle: Any) -> None:
    """bench-cycle's options of the server's state: cycles, a cold server, AUTO CDC after."""
    cycle.add_argument(
        "--cycles",
        type=int,
        default=None,
        help="consecutive scheduled cycles on one server, new changes landed before each (1); "
        "with 2 or more, no warm-up pass: the first cycle (after the server's start) is reported "
        "apart and the later cycles' median is the figure (the scheduler's steady state)",
    )
    cycle.add_argument(
        "--cold",
        action="store_true",
        help="connect mode: measure on a fresh server (default: a warm one, after one warm-up "
        "pass of every table on copies of its folders, as a server that ran earlier cycles)",
    )
    cycle.add_argument(
        "--at-server-start",
        action="store_true",
        help="connect mode: unpause as soon as the DAGs are parsed, while the server may still "
        "be warming itself up (default: first wait for its warm-up to finish, up to 180 s, as in "
        "a deployment whose first due run comes later)",
    )
    cycle.add_argument(
        "--auto-cdc",
        action="store_true",
        help="then apply the same change sets with Spark's AUTO CDC, one pipeline with a flow "
        "per table, on a server of its own (targets: Spark's in-memory test table; "
        "python -m cdc_tools.bench.auto_cdc)",
    )


def validate(config: Path | None) -> int:
    """Print one line per problem of the config table; exit 2 (a bad config) when there is any."""
    result = load_table_configs(config)
    summaries.record("tables", sorted(result.tables))
    summaries.record(
        "problems",
        [
            {"table": p.table, "field": p.field, "message": p.message, "line": p.line}
            for p in result.problems
        ],
    )
    for problem in result.problems:
        print(problem)
    if result.problems:
        print(
            f"{len(result.problems)} problem(s); {len(result.tables)} valid table(s)",
            file=sys.stderr,
        )
        return 2  # as for every ConfigError of a step (README: a bad config exits 2)
    print(f"ok: {len(result.tables)} table(s): {', '.join(sorted(result.tables))}")
    return 0


def run_both(args) -> int:  # type: ignore[no-untyped-def]
    """`cdc run`: the registry's composite (stage then overwrite-final) in one Spark session,
    one summary line."""
    from cdc_pipeline.counts import CompositeCounts
    from spark_jobs.runtime.context import StepContext
    from spark_jobs.runtime.entry import execute, load_body
    from spark_jobs.runtime.report import StepReport

    def body(context: StepContext, step_args) -> StepReport:  # type: ignore[no-untyped-def]
        reported = {
            name: load_body(step_named(name))(context, step_args).counts for name in RUN.steps
        }
        interval = str(step_args.required_interval())
        picked = CompositeCounts(RUN.counts(reported))
        return StepReport(RUN.name, context.table.name, interval, picked)

    return execute(args, RUN.name, body)


def run_status_command(namespace: argparse.Namespace) -> int:
    """`cdc status`: one line per table, its health (ok, warn, error or unknown, with the
    reasons) and freshness measured by the data (no Spark)."""
    from cdc_pipeline.errors import CdcError
    from cdc_pipeline.paths import TablePaths
    from spark_jobs.runtime.failures import one_line
    from spark_jobs.status.table_health import status_of

    loaded = load_table_configs(namespace.config)
    try:
        names = list(dict.fromkeys(namespace.tables)) or sorted(loaded.tables)
        tables = [loaded.table(name) for name in names]
    except CdcError as error:
        print(f"error: status: {one_line(error)}", file=sys.stderr)
        return 2
    for problem in loaded.problems if not namespace.tables else []:
        print(f"warning: status: skipped: {problem}", file=sys.stderr, flush=True)
    now = parse_timestamp(namespace.at) if namespace.at else None
    documents = []
    for table in tables:
        freshness, health = status_of(table, TablePaths.for_table(table.name), now)
        document = {"table": table.name, "health": health.state, "reasons": health.reasons}
        if freshness is not None:
            document.update(freshness.document())
        documents.append(document)
        values = freshness.line().partition(": ")[2] if freshness is not None else ""
        # One key=value line per table on stdout (scripts parse it); why, and the files not
        # applied with the command for each, on stderr for the person reading.
        print(f"status {table.name}: health={health.state} {values}".rstrip(), flush=True)
        for reason in health.reasons:
            print(f"status {table.name}: {health.state}: {reason}", file=sys.stderr, flush=True)
        for line in freshness.backlog_lines() if freshness is not None else []:
            print(line, file=sys.stderr, flush=True)
    summaries.record("tables", documents)
    return 0


def run_quarantine_command(namespace: argparse.Namespace) -> int:
    """`cdc quarantine TABLE`: its quarantine's counts per reason and hour, and sample rows with
    their values and where they came from (no Spark)."""
    from cdc_pipeline.errors import CdcError
    from cdc_pipeline.paths import TablePaths
    from spark_jobs.runtime.failures import one_line
    from spark_jobs.status.quarantine import quarantine_report

    try:
        if namespace.hours < 1 or namespace.samples < 0:
            raise UsageError("--hours must be at least 1 and --samples at least 0")
        table = load_table_configs(namespace.config).table(namespace.table)
    except CdcError as error:
        print(f"error: quarantine: {one_line(error)}", file=sys.stderr)
        return 2
    try:
        report = quarantine_report(
            table.name,
            TablePaths.for_table(table.name).quarantine,
            batches=namespace.hours,
            samples=namespace.samples,
        )
    except (CdcError, OSError) as error:
        print(f"error: quarantine {table.name}: {one_line(error)}", file=sys.stderr)
        return 1
    for line in report.lines():
        print(line, flush=True)
    summaries.record("quarantine", report.document())
    return 0


def run_demo_command(namespace: argparse.Namespace) -> int:
    """`cdc demo`."""
    from cdc_pipeline.config import default_config_path
    from cdc_pipeline.errors import CdcError
    from cdc_tools.demo import run_airflow_demo, run_demo
    from spark_jobs.runtime.failures import one_line
    from spark_jobs.runtime.session import build_spark_session

    config_path = namespace.config or default_config_path()
    configs = load_table_configs(config_path)
    try:
        start = parse_timestamp(namespace.start)
        if namespace.without_airflow:
            lines = run_demo(
                build_spark_session("cdc-demo"), configs, start, namespace.hours, namespace.keys
            )
        else:
            lines = run_airflow_demo(
                configs, Path(config_path), start, namespace.hours, namespace.keys
            )
        for line in lines:
            print(line, flush=True)
    except (CdcError, RuntimeError) as error:
        print(f"error: demo: {one_line(error)}", file=sys.stderr)
        return 1
    return 0


def bench_overrides(namespace: argparse.Namespace) -> dict[str, object]:
    """`cdc bench`'s options as BenchSpec fields (only those given); ValueError for a bad one."""
    from cdc_tools.bench.merges import check_methods

    overrides: dict[str, object] = {
        name: value
        for name, value in (
            ("rows", namespace.rows),
            ("partitions", namespace.partitions),
            ("key_width", namespace.key_width),
            ("changes", namespace.changes),
            ("repeats", namespace.repeats),
            ("warm_up_runs", namespace.warm_up_runs),
            ("key_layout", namespace.key_layout),
            ("partition_stable", namespace.partition_stable or None),
            ("kafka_messages", namespace.kafka_messages),
        )
        if value is not None
    }
    if namespace.repeats is not None and namespace.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, not {namespace.repeats}")
    if namespace.warm_up_runs is not None and namespace.warm_up_runs < 0:
        raise ValueError(f"--warm-up-runs must be at least 0, not {namespace.warm_up_runs}")
    if namespace.kafka_messages is not None and namespace.kafka_messages < 1:
        raise ValueError(f"--kafka-messages must be at least 1, not {namespace.kafka_messages}")
    if namespace.fractions:
        overrides["fractions"] = tuple(float(v) for v in namespace.fractions.split(","))
    if namespace.sizes:
        overrides["sizes"] = tuple(int(v) for v in namespace.sizes.split(","))
    if namespace.methods:
        methods = tuple(m.strip() for m in namespace.methods.split(",") if m.strip())
        check_methods(methods)
        overrides["methods"] = methods
    return overrides


def run_bench_command(namespace: argparse.Namespace) -> int:
    """`cdc bench`: the sweep, one line per case, the table of times, the ratios, the Kafka
    staging rate when measured, and where the results are."""
    from dataclasses import replace

    from cdc_tools.bench.merges import BenchSpec, run_bench, summary_table
    from spark_jobs.runtime.failures import one_line
    from spark_jobs.runtime.session import build_spark_session

    output = namespace.output or Path("bench-results") / ("smoke" if namespace.smoke else "")
    spec = BenchSpec.smoke(output) if namespace.smoke else BenchSpec(output=output)
    try:
        spec = replace(spec, **bench_overrides(namespace))  # type: ignore[arg-type]
    except ValueError as error:
        print(f"error: bench: {error}", file=sys.stderr)
        return 2
    kafka = None
    if spec.kafka_messages:
        from cdc_tools.bench.kafka_stage import kafka_unavailable, measure_kafka_staging

        if (reason := kafka_unavailable()) is not None:
            print(
                f"error: bench: --kafka-messages: the broker cannot run: {reason}", file=sys.stderr
            )
            return 1
        kafka = measure_kafka_staging
    os.environ.setdefault("CDC_SPARK_UI", "true")  # stage times come from Spark's REST API
    try:
        result = run_bench(build_spark_session("cdc-bench"), spec, kafka=kafka)
    except Exception as error:
        print(f"error: bench: {one_line(error)}", file=sys.stderr)
        return 1
    for line in summary_table(result):
        print(f"bench: {line}")
    for name, value in result["ratios"].items():
        print(f"bench: {name}={value}")
    if kafka := result.get("kafka_staging"):
        print(
            f"bench: kafka: {kafka['messages']:,} messages staged in {kafka['stage_seconds']} s "
            f"(median): {kafka['messages_per_second']:,} messages/s"
        )
    print(f"bench: results in {spec.output}/latest.json and latest.png")
    return 0


def run_bench_cycle_command(namespace: argparse.Namespace) -> int:
    """`cdc bench-cycle`: one scheduling cycle per mode, measured; non-zero when a table is off."""
    from dataclasses import replace

    from cdc_tools.bench.cycle import (
        CycleSpec,
        connect_mode_available,
        failed,
        run_bench_cycle,
    )

    modes: tuple[str, ...]
    if namespace.smoke:
        smoke_mode = "connect" if connect_mode_available() else "spark-submit"
        modes = (smoke_mode,) if namespace.mode == "both" else (namespace.mode,)
        output = namespace.output or Path("bench-results") / "cycle-smoke"
        spec = CycleSpec.smoke(output, modes)  # type: ignore[arg-type]
    else:
        modes = ("connect", "spark-submit") if namespace.mode == "both" else (namespace.mode,)
        spec = CycleSpec(modes=modes, output=namespace.output or Path("bench-results") / "cycle")  # type: ignore[arg-type]
    overrides = {
        name: value
        for name, value in (
            ("tables", namespace.tables),
            ("changes", namespace.changes),
            ("parallelism", namespace.parallelism),
            ("every", namespace.every),
            ("warm", False if namespace.cold else None),
            ("await_server_warm_up", False if namespace.at_server_start else None),
            ("cycles", namespace.cycles),
            ("auto_cdc", True if namespace.auto_cdc else None),
            ("sources", ("files", "kafka") if namespace.source == "both" else (namespace.source,)),
            ("kafka_conn_id", namespace.kafka_conn_id),
        )
        if value is not None
    }
    spec = replace(spec, **overrides)  # type: ignore[arg-type]
    try:
        spec.validate()
    except ValueError as error:
        print(f"error: bench-cycle: {error}", file=sys.stderr)
        return 2
    try:
        document = run_bench_cycle(spec)
        if spec.auto_cdc:
            from cdc_tools.bench.auto_cdc import beside_cycle

            document = beside_cycle(spec, document)
    except Exception as error:
        from spark_jobs.runtime.failures import one_line

        print(f"error: bench-cycle: {one_line(error)}", file=sys.stderr)
        return 1
    problems = failed(document)
    for problem in problems:
        print(f"error: bench-cycle: {problem}", file=sys.stderr)
    return 1 if problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `cdc`."""
    from spark_jobs.runtime.notices import show_warnings_on_stderr

    show_warnings_on_stderr()
    parser = build_parser()
    namespace = parser.parse_args(argv)
    try:  # CDC_LANDING and CDC_WAREHOUSE, checked once before any command reads them
        landing_root(), warehouse_root()
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if namespace.json:
        return run_as_json(namespace)
    return dispatch(namespace)


class _Tee(io.TextIOBase):
    """stderr as it is, and its lines kept (the failure's one line goes into the JSON too)."""

    def __init__(self, target: TextIO) -> None:
        self.target = target
        self.lines: list[str] = []
        self.partial = ""

    def write(self, text: str) -> int:
        self.target.write(text)
        self.partial += text
        *done, self.partial = self.partial.split("\n")
        self.lines += done
        return len(text)

    def flush(self) -> None:
        self.target.flush()


def run_as_json(namespace: argparse.Namespace) -> int:
    """Run the command with its stdout captured; print its summary as one JSON object instead.

    The object always has `command`, `ok` and `exit_code`; a step adds `summary` (step, table,
    interval, counts, line), `check` and `status` add `tables`, `quarantine` adds `quarantine`
    (its counts and samples), `repair` adds `repair` (what was damaged, where each table set
    aside went, the rebuilt final's rows, the check's result), `validate` adds `tables` and
    `problems`, a failure adds `error` (its one line); `output` holds the lines the command
    would have printed (the rows of `as-of`, the lines of `demo` and `bench`)."""
    captured = io.StringIO()
    errors = _Tee(sys.stderr)
    summaries.take()
    with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(errors):
        try:
            code = dispatch(namespace)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
    document: dict[str, Any] = {"command": namespace.command, "ok": code == 0, "exit_code": code}
    document.update(summaries.take())
    failure = [line for line in errors.lines if line.startswith("error: ")]
    if code != 0 and failure:
        document["error"] = failure[-1][len("error: ") :]
    document["output"] = captured.getvalue().splitlines()
    print(json.dumps(document, default=str), flush=True)
    return code


def dispatch(namespace: argparse.Namespace) -> int:
    """Run the parsed command; its exit code."""
    if namespace.command == "validate":
        code = validate(namespace.config)
    elif namespace.command == "check":
        from spark_jobs.check import execute_check

        code = execute_check(namespace.config, namespace.tables)
    elif namespace.command == "status":
        code = run_status_command(namespace)
    elif namespace.command == "quarantine":
        code = run_quarantine_command(namespace)
    elif namespace.command == "repair":
        from cdc_tools.repair import run_repair

        code = run_repair(
            namespace.config, namespace.table, dry_run=namespace.dry_run, force=namespace.force
        )
    elif namespace.command == "demo":
        code = run_demo_command(namespace)
    elif namespace.command == "bench":
        code = run_bench_command(namespace)
    elif namespace.command == "bench-cycle":
        code = run_bench_cycle_command(namespace)
    else:
        from spark_jobs.runtime.args import step_args_from
        from spark_jobs.runtime.entry import execute, load_body, usage_failure

        try:
            args = step_args_from(namespace)
        except UsageError as error:  # a bad interval: before any config or Spark
            return usage_failure(namespace.command, error)
        if namespace.command == RUN.name:
            code = run_both(args)
        else:
            step = step_named(namespace.command)
            code = execute(args, step.name, load_body(step), needs_spark=step.needs_spark)
    return code


def console_main() -> None:
    """Console script: exit with main's code without running interpreter teardown twice.

    Stopping Spark first and then leaving with os._exit keeps the exit status equal to what
    the step committed (a native library once aborted at interpreter exit after a conflict).
    """
    code = main()
    if "pyspark.sql" in sys.modules:  # a command that loaded no Spark has none to stop
        try:
            from pyspark.sql import SparkSession

            active = SparkSession.getActiveSession()
            if active is not None:
                active.stop()
        except Exception:  # a failed stop must not turn a success into a failure
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # python -m cdc_tools.cli, as the `cdc` script
    console_main()
