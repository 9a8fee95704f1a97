"""The config table: one typed, validated row per source table (no Spark, no Airflow).

Validation is exactly as strict as what runs, and complete in one pass: every field of every
row is checked on its own, then the cross-field rules run on whatever parsed (a rule whose
inputs failed is skipped, not reported twice), duplicates are found by name whatever the rows'
validity, and each problem names the YAML line it comes from.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, timedelta
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from cdc_pipeline import sql_guard
from cdc_pipeline.columns import (
    BINLOG_FILE,
    BINLOG_POS,
    BINLOG_ROW,
    LSN,
    OP,
    POSITION,
    SNAPSHOT_AT,
    SOURCE_TS_MS,
    TECHNICAL_PREFIX,
)
from cdc_pipeline.durations import parse_duration
from cdc_pipeline.errors import ConfigError
from cdc_pipeline.schedules import schedule_problem
from cdc_pipeline.schema import SPARK_TYPES_HELP, is_spark_sql_type

NAME_PATTERN = r"^[a-z][a-z0-9_]*$"
COLUMN_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Below this retention `cdc vacuum` needs --force (spark_jobs/vacuum.py SAFE_RETENTION_HOURS).
VACUUM_SAFE_HOURS = 168

# Columns a change format adds to every change row, usable in sequence_by (name -> Spark type).
FORMAT_COLUMNS: dict[str, dict[str, str]] = {
    "flat": {},
    "debezium": {
        SOURCE_TS_MS: "bigint",
        LSN: "bigint",
        BINLOG_FILE: "string",
        BINLOG_POS: "bigint",
        BINLOG_ROW: "int",
        POSITION: "string",
    },
    "wal2json": {LSN: "bigint", POSITION: "string"},
    "snapshot": {SNAPSHOT_AT: "timestamp"},
}
# The source's own order, used when a row of these formats omits sequence_by.
DEFAULT_SEQUENCE_BY: dict[str, list[str]] = {
    "debezium": [SOURCE_TS_MS, POSITION],
    "wal2json": [POSITION],
    "snapshot": [SNAPSHOT_AT],
}
# Formats whose changes are events read from JSON lines (they carry an op, not a flag column).
EVENT_FORMATS = ("debezium", "wal2json")
# Where the change kind is read from for the event formats (they carry an op, not a flag column).
EVENT_OP_COLUMN = OP


def _no_duplicates(value: list[str]) -> list[str]:
    duplicates = sorted({v for v in value if value.count(v) > 1})
    if duplicates:
        raise ValueError(f"lists {', '.join(duplicates)} more than once")
    return value


def _columns_are_typed(value: dict[str, str]) -> dict[str, str]:
    if not value:
        raise ValueError("must name at least one column")
    problems = []
    by_case: dict[str, list[str]] = {}
    for column in value:
        by_case.setdefault(column.lower(), []).append(column)
    for same in by_case.values():
        if len(same) > 1:
            problems.append(
                f"column names {' and '.join(same)} differ only in case (Spark does not tell "
                "them apart)"
            )
    for column, spark_type in value.items():
        if not re.match(COLUMN_PATTERN, column):
            problems.append(f"column name {column!r} {PATTERN_HELP[COLUMN_PATTERN]}")
        elif column.lower().startswith(TECHNICAL_PREFIX):
            problems.append(f"column name {column!r} uses the reserved prefix {TECHNICAL_PREFIX}")
        if not isinstance(spark_type, str) or not is_spark_sql_type(spark_type):
            problems.append(f"type {spark_type!r} of {column} is not {SPARK_TYPES_HELP}")
    if problems:
        raise ValueError("; ".join(problems))
    return {column: spark_type.strip().lower() for column, spark_type in value.items()}


def _valid_schedule(value: str) -> str:
    problem = schedule_problem(value)
    if problem:
        raise ValueError(problem)
    return value


# Reusable validated types: a field declared with one of them is checked on its own too, so its
# problem is reported together with every other problem of the row (see `_validate_fields`).
ColumnList = Annotated[list[str], AfterValidator(_no_duplicates)]
ColumnTypes = Annotated[dict[str, str], AfterValidator(_columns_are_typed)]
Schedule = Annotated[str, AfterValidator(_valid_schedule)]
# What a pattern means, in the words of the README (pydantic would quote the regex).
PATTERN_HELP = {
    NAME_PATTERN: "must be lower-case letters, digits and _, starting with a letter (e.g. orders_v2)",
    COLUMN_PATTERN: "must be letters, digits and _, not starting with a digit (e.g. CREATE_DATE)",
}


class TableConfig(BaseModel):
    """One row of the config table: how one source table's changes become a Delta table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        pattern=NAME_PATTERN,
        description="Table name; the DAG id is cdc_<name>, its change files land in "
        "{landing}/<name>, its tables are {warehouse}/<name>/final, staging, ...",
    )
    file_format: Literal["parquet", "csv", "json"] = Field(
        default="parquet",
        description="Format of the landed change files: parquet, csv (a header line; columns "
        "are matched by name) or json (JSON lines; the default for debezium and wal2json).",
    )
    change_format: Literal["flat", "debezium", "wal2json", "snapshot"] = Field(
        default="flat",
        description="flat: one row per change with a flag column; debezium: Debezium change "
        "events; wal2json: wal2json format-version 2 lines; snapshot: each interval holds a full "
        "extract of the source, compared by hashes with the final table.",
    )
    compare_exclude: ColumnList = Field(
        default_factory=list,
        description="change_format snapshot: columns left out of change detection (operational "
        "columns such as a load time); a change only there is no change.",
    )
    database: str = Field(
        default="cdc",
        pattern=NAME_PATTERN,
        description="The Spark catalog database the final (and history) table is registered in "
        "after each run that applies changes: `<database>.<name>` (and `<database>.<name>_history`), "
        "so users query spark.table('cdc.orders') on the same Spark (the Connect server's "
        "session catalog; a Hive metastore when the deployment configures one).",
    )
    history: bool = Field(
        default=False,
        description="Also keep {table}/history, an SCD type 2 table with one version per change.",
    )
    track_history_columns: ColumnList | None = Field(
        default=None,
        description="With history: only changes of these columns start a new version; other "
        "changes update the version in place. Default: every column but keys and sequence_by.",
    )
    history_buckets: int = Field(
        default=16,
        ge=1,
        le=4096,
        description="With history: the history table is partitioned by a hash of the key into "
        "this many buckets; a run rewrites only the buckets of the keys it touches. Fixed once "
        "the history table exists.",
    )
    columns: ColumnTypes | None = Field(
        default=None,
        description="Column name -> Spark SQL type (bigint, int, string, double, "
        "decimal(p,s), date, timestamp, ...). Optional except for csv. Declared: other columns "
        "in the files are ignored, with a warning. Omitted: the files give the schema, and it "
        "evolves (see on_schema_change).",
    )
    on_schema_change: Literal["evolve", "quarantine"] = Field(
        default="evolve",
        description="When columns is omitted and a batch's schema differs from staging's: evolve "
        "adds new columns and applies widening type changes (a narrowing or incompatible change "
        "quarantines the batch); quarantine refuses every change.",
    )
    keys: ColumnList = Field(min_length=1, description="Record key columns (composite allowed).")
    sequence_by: ColumnList = Field(
        min_length=1,
        description="Columns ordering the changes of a key; later ones break ties: the latest "
        "change is ROW_NUMBER() OVER (PARTITION BY keys ORDER BY sequence_by DESC). Required "
        "for flat; debezium, wal2json and snapshot default to the source's own order.",
    )
    partition_expression: str | None = Field(
        default=None,
        description="Spark SQL expression over the columns giving the final table's partition "
        "value. The expression is data, not code: only column references (declared columns, or "
        "the format's _cdc_ columns), literals, operators, CASE/IF/COALESCE and deterministic "
        "scalar functions (date/time, string, math, casts, hashes such as md5, sha2, xxhash64, "
        "hash); refused with a message naming the construct: subqueries and file reads, "
        "reflect/java_method, UDFs and unknown functions, nondeterministic functions (rand, "
        "uuid, current_timestamp, ...), aggregates, window functions, lambdas, *. Checked by "
        "`cdc validate` (sqlglot's Spark parser) and again on Spark's analysed plan before the "
        "first write.",
    )
    partition_column: str | None = Field(
        default=None,
        description="Name of the partition column, required with partition_expression.",
    )
    partition_stable: bool = Field(
        default=False,
        description="A key's partition value never changes (the partition expression is over "
        "columns a key keeps, such as its creation date): overwrite-final then trusts the "
        "partition an insert or update names and looks up where a key lives only for keys with "
        "a delete. Set it only when that holds: an update that moved a key anyway would leave "
        "its old row in the old partition too.",
    )
    insert_only: bool = Field(
        default=False, description="Append each (key, sequence) once; never update or delete."
    )
    flag_column: str = Field(
        default="FLAG", description="Column holding the change flag I, U or D (case-insensitive)."
    )
    zorder_by: ColumnList = Field(
        default_factory=list, description="Columns OPTIMIZE Z-orders the final table by."
    )
    apply_truncates: bool = Field(
        default=True,
        description="Event formats: a truncate (wal2json action T, Debezium op t) is applied: "
        "it removes every row whose change is ordered before it (by sequence_by), in final, "
        "in history (their versions end at it), and against changes that arrive later but "
        "are ordered before it. false: truncates are skipped and counted "
        "(truncates_skipped=).",
    )
    ignore_null_updates: bool = Field(
        default=False,
        description="change_format flat: a null in an insert or update means 'not sent' "
        "(partial updates): the column keeps the key's previous value, as for an event "
        "format's column a change did not carry (Databricks AUTO CDC's ignore_null_updates). "
        "Also a column the file lacks. A column can then not be set to null by an update; a "
        "delete still removes the row, and a key inserted after its delete starts empty.",
    )
    unavailable_value: str = Field(
        default="__debezium_unavailable_value",
        min_length=1,
        description="Debezium: the text the connector sends for a value it does not have "
        "(its unavailable.value.placeholder, such as an unchanged TOASTed column of a "
        "PostgreSQL update): as text, as the base64 of a bytea value, or as an array's only "
        "element. Such a value is never written: the column keeps the key's previous value, "
        "like a column wal2json leaves out.",
    )
    late_arrival_window: str = Field(
        default="3d",
        description="How far back from its interval's end a run looks for landed files not "
        "staged yet (a duration like 3d or 48h): every hr= folder whose hour starts in [end - "
        "window, end) is listed, so a file that lands in an old hour's folder after that hour's "
        "run, the hours missed during an outage and a sub-hourly schedule's files are all "
        "applied by the next run. The default covers a weekend outage. A file landed in an "
        "older folder is never staged silently: it is counted (files_outside_window), shown by "
        "`cdc status` and warned about; `cdc run` over its hour applies it.",
    )
    schedule: Schedule = Field(
        default="@hourly",
        description="The table's run schedule: a five-field cron or a preset (@hourly, @daily, "
        "@midnight, @weekly, @monthly, @quarterly, @yearly, @annually). @once and null are "
        "refused: a CDC table's runs own consecutive data intervals (a one-off load is `cdc "
        "run`).",
    )
    start_date: date = Field(
        default=date(2024, 1, 1),
        description="First data interval of the DAG (UTC); backfills start here at the earliest.",
    )
    optimize_schedule: Schedule | None = Field(
        default="@daily", description="When OPTIMIZE runs (cron or preset); null never."
    )
    vacuum_schedule: Schedule | None = Field(
        default="@weekly", description="When VACUUM runs (cron or preset); null never."
    )
    reset_staging_schedule: Schedule | None = Field(
        default="@weekly", description="When staging is reset to final + tombstones; null never."
    )
    check_schedule: Schedule | None = Field(
        default="@daily",
        description="When `cdc check` verifies the table's invariants (cron or preset; the task "
        "fails on a breach); null never.",
    )
    vacuum_retention_hours: int = Field(
        default=168, ge=0, description="Files no version younger than this needs are deleted."
    )
    spark_conn_id: str = Field(
        default="spark_default",
        description="Airflow connection the Spark tasks run through: spark_connect (a Spark "
        "Connect client in the task) or spark (spark-submit).",
    )
    description: str | None = Field(default=None, description="Free text shown in the DAG docs.")
    # Operations (Airflow): timeouts, retries, alerts. Durations are text like 30m, 2h, 1h30m.
    execution_timeout: str = Field(
        default="1h",
        description="Longest a task may run; a task past it is stopped (its Spark work "
        "interrupted) and fails, then retries.",
    )
    dagrun_timeout: str = Field(
        default="3h",
        description="Longest a DAG run may take, retries included; a run past it fails, so one "
        "hung run cannot hold the table (max_active_runs=1) forever. Not shorter than "
        "execution_timeout.",
    )
    retries: int = Field(
        default=2, ge=0, le=10, description="Retries of a failed task (exponential back-off)."
    )
    freshness: str | None = Field(
        default=None,
        description="Deadline alert: a run must succeed within this time of being queued (a "
        "scheduled run is queued when its interval ends), so the table is never more than one "
        "interval plus this behind without an alert to `notify`. Null: no deadline.",
    )
    notify: list[str] = Field(
        default_factory=list,
        description="Notifier names (keys of the deployment's notifier registry, the Airflow "
        "Variable cdc_notifiers) told of task failures, missed deadlines and quarantine alerts.",
    )
    max_quarantine_fraction: float | None = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Alert when a stage run quarantines more than this fraction of the rows it "
        "reads (see quarantine_action). Null: no check.",
    )
    quarantine_action: Literal["warn", "fail"] = Field(
        default="warn",
        description="Past max_quarantine_fraction: warn logs and notifies, the run goes on; fail "
        "also fails the stage task without retry, so final is not updated for the interval.",
    )

    max_sequence_ahead: str | None = Field(
        default="7d",
        description="Quarantine a change whose sequence value lies more than this after the "
        "stage run (a duration like 7d or 36h): a clock error such as year 9999 would otherwise "
        "beat every later real update of its key. Checks the timestamp and date columns of "
        "sequence_by (and Debezium's _cdc_source_ts_ms); null: no bound.",
    )

    @field_validator("max_sequence_ahead")
    @classmethod
    def _sequence_bound_is_duration(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration(value)
        return value

    @field_validator("execution_timeout", "dagrun_timeout", "freshness", "late_arrival_window")
    @classmethod
    def _is_duration(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration(value)
        return value

    @field_validator("notify")
    @classmethod
    def _notifier_names(cls, value: list[str]) -> list[str]:
        bad = [name for name in value if not re.match(NAME_PATTERN, str(name))]
        if bad:
            raise ValueError(
                f"notifier names must match {NAME_PATTERN}: {', '.join(map(str, bad))}"
            )
        duplicates = sorted({v for v in value if value.count(v) > 1})
        if duplicates:
            raise ValueError(f"lists {', '.join(duplicates)} more than once")
        return value

    @model_validator(mode="after")
    def _timeouts_agree(self) -> TableConfig:
        if parse_duration(self.dagrun_timeout) < parse_duration(self.execution_timeout):
            raise ValueError(
                f"dagrun_timeout: {self.dagrun_timeout} is shorter than execution_timeout "
                f"{self.execution_timeout} (a run would time out before its first task does)"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _format_defaults(cls, data: Any) -> Any:
        return with_format_defaults(data)

    @model_validator(mode="after")
    def _fields_agree(self) -> TableConfig:
        values = {name: getattr(self, name) for name in type(self).model_fields}
        problems = cross_field_problems(values, unknown=set())
        if problems:
            raise ValueError(" | ".join(f"{name}: {message}" for name, message in problems))
        return self

    @field_validator("late_arrival_window")
    @classmethod
    def _window_covers_an_hour(cls, value: str) -> str:
        if parse_duration(value) < timedelta(hours=1):
            raise ValueError(f"{value!r} is shorter than one hour folder: give at least 1h")
        return value

    @property
    def late_arrival(self) -> timedelta:
        """late_arrival_window as a timedelta."""
        return parse_duration(self.late_arrival_window)

    @property
    def dag_id(self) -> str:
        """The Airflow DAG id of this table."""
        return f"cdc_{self.name}"

    @property
    def data_columns(self) -> list[str] | None:
        """Declared columns in declaration order, or None when the files give the schema."""
        return list(self.columns) if self.columns is not None else None

    @property
    def partition_by(self) -> list[str]:
        """The Delta partition columns of the table's outputs: the partition column, or none."""
        return [self.partition_column] if self.partition_column else []

    @property
    def format_columns(self) -> dict[str, str]:
        """The `_cdc_` columns the change format adds to every row (name -> Spark type)."""
        return dict(FORMAT_COLUMNS[self.change_format])

    @property
    def flag_source(self) -> str:
        """Column the change kind (I, U, D) is read from: the flag column, or the event's op."""
        return EVENT_OP_COLUMN if self.change_format in EVENT_FORMATS else self.flag_column


def with_format_defaults(data: Any) -> Any:
    """A row with the defaults its change format implies (file_format json, the source order)."""
    if isinstance(data, Mapping) and data.get("change_format") in DEFAULT_SEQUENCE_BY:
        data = dict(data)
        if data["change_format"] in EVENT_FORMATS:
            data.setdefault("file_format", "json")
        if not data.get("sequence_by"):
            data["sequence_by"] = list(DEFAULT_SEQUENCE_BY[data["change_format"]])
    return data


def _close(value: object, choices: Iterable[str]) -> str:
    """'; did you mean `x`?' when `value` is close to one of `choices`, else ''."""
    matches = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=0.6)
    return f"; did you mean `{matches[0]}`?" if matches else ""


def cross_field_problems(values: Mapping[str, Any], unknown: set[str]) -> list[tuple[str, str]]:
    """(field, message) for each rule the row's fields break together.

    `unknown` names fields whose value could not be parsed: a rule that reads one of them is
    skipped (its field already has a problem), every other rule still runs.
    """

    def known(*names: str) -> bool:
        return not unknown.intersection(names)

    problems: list[tuple[str, str]] = []
    columns = values.get("columns")
    change_format = values.get("change_format", "flat")
    if known("columns", "file_format") and columns is None and values["file_format"] == "csv":
        problems.append(("columns", "required for file_format csv (CSV values carry no types)"))
    if (
        known("change_format", "file_format")
        and change_format in EVENT_FORMATS
        and values["file_format"] != "json"
    ):
        problems.append(
            (
                "file_format",
                f"change_format {change_format} is read from JSON lines (file_format json)",
            )
        )
    if not known("change_format", "columns"):
        return problems + _later_rules(values, unknown, known)
    format_columns = FORMAT_COLUMNS[change_format]
    declared = set(columns or {}) | set(format_columns)
    for field_name in (
        "keys",
        "sequence_by",
        "zorder_by",
        "compare_exclude",
        "track_history_columns",
    ):
        if not known(field_name):
            continue
        for column in values.get(field_name) or []:
            if column.startswith(TECHNICAL_PREFIX) and column not in format_columns:
                problems.append(
                    (
                        field_name,
                        f"{column!r} is not a column of change_format {change_format} (those "
                        f"are: {', '.join(format_columns) or 'none'})",
                    )
                )
            elif columns is not None and column not in declared:
                problems.append(
                    (
                        field_name,
                        f"{column!r} is not a declared column{_close(column, declared)} "
                        f"(declared: {', '.join(columns)})",
                    )
                )
    if (
        known("flag_column")
        and columns is not None
        and change_format != "snapshot"
        and values["flag_column"].lower() in {c.lower() for c in declared}
    ):
        problems.append(
            ("flag_column", f"{values['flag_column']!r} must not also be a declared column")
        )
    partition_column = values.get("partition_column")
    clash = [
        c
        for c in [*(columns or {}), *format_columns]
        if partition_column and c.lower() == partition_column.lower()
    ]
    if known("partition_column") and clash:
        # Spark resolves names regardless of case: `id` would overwrite the column ID.
        same = "" if partition_column in clash else f" ({', '.join(clash)}; Spark ignores case)"
        problems.append(
            ("partition_column", f"{partition_column!r} clashes with a declared column{same}")
        )
    expression = values.get("partition_expression")
    if known("partition_expression") and expression is not None and expression.strip():
        refused = sql_guard.expression_problems(
            expression, list(columns) if columns is not None else None, list(format_columns)
        )
        if refused:
            problems.append(
                ("partition_expression", f"{expression!r} refused: " + "; ".join(refused[:3]))
            )
    return problems + _later_rules(values, unknown, known)


def _partial_update_rules(
    values: Mapping[str, Any], known: Callable[..., bool]
) -> list[tuple[str, str]]:
    """ignore_null_updates: flat tables with updates only."""
    problems: list[tuple[str, str]] = []
    if not (known("ignore_null_updates", "change_format") and values.get("ignore_null_updates")):
        return problems
    change_format = values.get("change_format")
    if change_format != "flat":
        problems.append(
            (
                "ignore_null_updates",
                f"only for change_format flat ({change_format} "
                + (
                    "tells a value not sent from a null itself)"
                    if change_format in EVENT_FORMATS
                    else "rows are full extracts: a null there is a null)"
                ),
            )
        )
    if known("insert_only") and values.get("insert_only"):
        problems.append(("ignore_null_updates", "insert_only tables have no updates"))
    return problems


def _later_rules(
    values: Mapping[str, Any], unknown: set[str], known: Callable[..., bool]
) -> list[tuple[str, str]]:
    """The rules that need no declared columns: snapshot/history, keys vs order, partitions."""
    problems: list[tuple[str, str]] = []
    change_format = values.get("change_format")
    keys = set(values.get("keys") or []) if known("keys") else set()
    compare_exclude = values.get("compare_exclude") or []
    if (
        known("compare_exclude", "change_format")
        and compare_exclude
        and change_format != "snapshot"
    ):
        problems.append(("compare_exclude", "only for change_format snapshot"))
    if known("compare_exclude") and set(compare_exclude) & keys:
        problems.append(("compare_exclude", "key columns are always compared"))
    insert_only = known("insert_only") and values.get("insert_only")
    if known("change_format") and change_format == "snapshot" and insert_only:
        problems.append(("insert_only", "a snapshot table derives updates and deletes"))
    if known("history") and values.get("history") and insert_only:
        problems.append(("history", "insert_only tables never change a row (no history to keep)"))
    tracked = values.get("track_history_columns")
    if known("track_history_columns") and tracked is not None:
        if known("history") and not values.get("history"):
            problems.append(("track_history_columns", "needs history: true"))
        if not tracked:
            problems.append(("track_history_columns", "must name at least one column"))
        if set(tracked) & keys:
            problems.append(("track_history_columns", "key columns identify a row, not a version"))
    if known("sequence_by"):
        overlap = sorted(keys & set(values.get("sequence_by") or []))
        if overlap:
            problems.append(("sequence_by", f"{', '.join(overlap)} already in keys"))
    expression, partition_column = (
        values.get("partition_expression"),
        values.get("partition_column"),
    )
    if known("partition_expression", "partition_column") and (expression is None) != (
        partition_column is None
    ):
        problems.append(
            (
                "partition_column",
                "partition_expression and partition_column go together (set both or neither)",
            )
        )
    if known("partition_column") and partition_column is not None:
        if not re.match(COLUMN_PATTERN, partition_column):
            problems.append(
                ("partition_column", f"{partition_column!r} {PATTERN_HELP[COLUMN_PATTERN]}")
            )
        elif partition_column.lower().startswith(TECHNICAL_PREFIX):
            problems.append(
                (
                    "partition_column",
                    f"{partition_column!r} uses the reserved prefix {TECHNICAL_PREFIX}",
                )
            )
        if known("zorder_by") and partition_column in (values.get("zorder_by") or []):
            problems.append(("zorder_by", "cannot include the partition column"))
    hours = values.get("vacuum_retention_hours")
    if (
        known("vacuum_retention_hours", "vacuum_schedule")
        and values.get("vacuum_schedule") is not None
        and isinstance(hours, int)
        and hours < VACUUM_SAFE_HOURS
    ):
        # The scheduled vacuum runs without --force, and refuses such a retention every time.
        problems.append(
            (
                "vacuum_retention_hours",
                f"{hours} is below {VACUUM_SAFE_HOURS}, which the scheduled vacuum refuses; use "
                f"at least {VACUUM_SAFE_HOURS}, or vacuum_schedule: null and `cdc vacuum "
                "--force` by hand",
            )
        )
    if known("partition_expression") and expression is not None and not expression.strip():
        problems.append(("partition_expression", "must not be empty"))
    if (
        known("partition_stable", "partition_column")
        and values.get("partition_stable")
        and partition_column is None
    ):
        problems.append(("partition_stable", "needs partition_expression and partition_column"))
    return problems + _partial_update_rules(values, known)


# Where each part of the YAML document starts: ("tables", 0) -> line of the first row,
# ("tables", 0, "keys") -> line of its keys, ("defaults", "schedule") -> line of that default.
LineMap = dict[tuple[Any, ...], int]
# A key a YAML mapping repeats: (row index or None outside rows, field, message, line).
Duplicate = tuple[int | None, str, str, int]


def _describe(error: Mapping[str, Any], choices: Iterable[str] = ()) -> str:
    """A pydantic error in the project's words: what is wrong and what would be right."""
    kind, given, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    if kind == "missing":
        return "required field is missing"
    if kind == "string_pattern_mismatch":
        pattern = ctx.get("pattern", "")
        return f"{given!r} {PATTERN_HELP.get(pattern, f'must match {pattern}')}"
    if kind in ("literal_error", "enum"):
        options = [o.strip().strip("'") for o in re.split(r",| or ", ctx.get("expected", ""))]
        options = [o for o in options if o]
        return f"{given!r} is not one of {', '.join(options)}{_close(given, options)}"
    if kind == "too_short":
        return (
            "must not be empty (name at least one)"
            if ctx.get("min_length") == 1
            else (f"needs at least {ctx.get('min_length')} items")
        )
    if kind in ("greater_than_equal", "greater_than"):
        return f"{given!r} is too small (at least {ctx.get('ge', ctx.get('gt'))})"
    if kind in ("less_than_equal", "less_than"):
        return f"{given!r} is too large (at most {ctx.get('le', ctx.get('lt'))})"
    expected = {
        "bool_parsing": "true or false",
        "bool_type": "true or false",
        "int_parsing": "a whole number",
        "int_type": "a whole number",
        "int_from_float": "a whole number",
        "float_parsing": "a number",
        "float_type": "a number",
        "string_type": "text",
        "list_type": "a list such as [A, B]",
        "dict_type": "a mapping such as {ID: bigint}",
        "date_parsing": "a date such as 2024-01-01",
        "date_from_datetime_parsing": "a date such as 2024-01-01",
        "date_type": "a date such as 2024-01-01",
    }.get(kind)
    if expected:
        return f"{given!r} is not {expected}"
    return str(error["msg"]).removeprefix("Value error, ")


@cache
def _default_of(name: str) -> Any:
    """A field's default, computed once: the checks only read it (the model makes its own)."""
    return TableConfig.model_fields[name].get_default(call_default_factory=True)


@cache
def _field_adapter(name: str) -> TypeAdapter[Any]:
    """A validator of one field on its own: its type with the field's constraints."""
    info = TableConfig.model_fields[name]
    annotation: Any = info.annotation
    if info.metadata:
        annotation = Annotated[annotation, *info.metadata]
    return TypeAdapter(annotation)


def _field_validators(name: str) -> list[Any]:
    """The model's own @field_validator functions of `name` (fields added with one keep it)."""
    found = []
    for decorator in TableConfig.__pydantic_decorators__.field_validators.values():
        if name in decorator.info.fields and decorator.info.mode in ("after", "plain"):
            found.append(decorator.func)
    return found


def _validate_fields(
    data: Mapping[str, Any], format_failed: bool
) -> tuple[dict[str, Any], set[str], list[tuple[str, str]]]:
    """Each field of one row on its own: (parsed values, unknown fields, field problems)."""
    values: dict[str, Any] = {}
    unknown: set[str] = set()
    problems: list[tuple[str, str]] = []
    for name, info in TableConfig.model_fields.items():
        if name not in data:
            if info.is_required():
                unknown.add(name)
                # Whether sequence_by is required depends on a change_format that did not parse.
                if not (name == "sequence_by" and format_failed):
                    problems.append((name, "required field is missing"))
            elif name == "file_format" and format_failed:
                unknown.add(name)  # its default depends on the change_format
            else:
                values[name] = _default_of(name)
            continue
        try:
            value = _field_adapter(name).validate_python(data[name])
            if value is not None:
                for validator in _field_validators(name):
                    value = validator(value)
            values[name] = value
        except ValidationError as error:
            unknown.add(name)
            choices = _literal_choices(info.annotation)
            for item in error.errors():
                problems.append((name, _describe(item, choices)))
        except (ValueError, TypeError) as error:
            unknown.add(name)
            problems.append((name, str(error).removeprefix("Value error, ")))
    raw_columns = data.get("columns")
    if "columns" in unknown and isinstance(raw_columns, Mapping) and raw_columns:
        # The names of a mapping with a bad type are still the declared columns.
        values["columns"] = {str(k): str(v) for k, v in raw_columns.items()}
        unknown.discard("columns")
    return values, unknown, problems


def _literal_choices(annotation: Any) -> list[str]:
    args = getattr(annotation, "__args__", ())
    return [a for a in args if isinstance(a, str)]


def _other_model_rules(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The model's other after-validators, on the parsed fields; one whose input failed is skipped."""
    problems = []
    view = SimpleNamespace(**values)
    for decorator in TableConfig.__pydantic_decorators__.model_validators.values():
        if decorator.info.mode != "after" or decorator.cls_var_name == "_fields_agree":
            continue
        try:
            decorator.func(view)
        except ValueError as error:
            for part in str(error).split(" | "):
                name, _, message = part.partition(": ")
                problems.append((name, message) if message else ("(row)", part))
        except (AttributeError, TypeError, KeyError):
            continue  # reads a field that did not parse: that field has its own problem
    return problems


def row_problems(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every (field, message) problem of one merged row, field and cross-field, in one pass."""
    return check_row(row)[0]


def check_row(row: Mapping[str, Any]) -> tuple[list[tuple[str, str]], TableConfig | None]:
    """The row's problems (see `row_problems`), and the validated row when there are none."""
    problems: list[tuple[str, str]] = []
    fields = TableConfig.model_fields
    for key in row:
        if key not in fields:
            hint = _close(key, fields) or " (see README, The config table, for the fields)"
            problems.append((str(key), f"unknown field{hint}"))
    change_format = row.get("change_format", "flat")
    format_failed = change_format not in FORMAT_COLUMNS
    data = with_format_defaults(row) if not format_failed else dict(row)
    values, unknown, field_problems = _validate_fields(data, format_failed)
    problems = field_problems + problems
    problems += cross_field_problems(values, unknown)
    problems += _other_model_rules(values)
    if not problems:
        try:
            return [], TableConfig.model_validate(row)
        except ValidationError as error:  # a rule this pass does not know of: still reported
            for item in error.errors():
                name = ".".join(str(p) for p in item["loc"]) or "(row)"
                for part in _describe(item).split(" | "):
                    field_name, _, message = part.partition(": ")
                    problems.append(
                        (field_name, message) if message and name == "(row)" else (name, part)
                    )
    return problems, None


def is_schedule(value: str) -> bool:
    """True for a preset or a cron expression the DAG builder and the cadences can run."""
    return schedule_problem(value) is None


@dataclass(frozen=True)
class ConfigProblem:
    """One validation problem of one config row: which table, which field, what is expected.

    With the file and line it comes from when known: `config/tables.yaml:12: table orders: ...`.
    """

    table: str
    field: str
    message: str
    line: int | None = None
    source: str | None = None

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}: " if self.source and self.line else ""
        return f"{where}table {self.table}: {self.field}: {self.message}"


@dataclass
class ConfigLoadResult:
    """The valid table rows and the problems of the invalid ones; one bad row hides no other."""

    tables: dict[str, TableConfig] = field(default_factory=dict)
    problems: list[ConfigProblem] = field(default_factory=list)

    def table(self, name: str) -> TableConfig:
        """The valid row called `name`, or a ConfigError explaining why there is none."""
        if name in self.tables:
            return self.tables[name]
        mine = [str(p) for p in self.problems if p.table == name]
        if mine:
            raise ConfigError("; ".join(mine))
        known = ", ".join(sorted(self.tables)) or "none"
        raise ConfigError(f"table {name}: not in the config table (valid tables: {known})")


def default_config_path() -> Path:
    """`CDC_CONFIG`, else config/tables.yaml under the project root."""
    env = os.environ.get("CDC_CONFIG")
    return Path(env) if env else project_root() / "config" / "tables.yaml"


def project_root() -> Path:
    """The repository root (the folder holding config/ and dags/)."""
    return Path(__file__).resolve().parent.parent


def _line_of(lines: LineMap, index: int, field_name: str, from_row: bool) -> int | None:
    """The line of a row's field: where the row sets it, else where defaults do, else the row."""
    top = field_name.split(".")[0]
    if from_row and ("tables", index, top) in lines:
        return lines[("tables", index, top)]
    if ("defaults", top) in lines:
        return lines[("defaults", top)]
    return lines.get(("tables", index))


def parse_config(
    document: Any,
    source: str = "config",
    lines: LineMap | None = None,
    duplicates: Iterable[Duplicate] = (),
) -> ConfigLoadResult:
    """Validate a parsed YAML document (defaults + tables) into table rows and problems.

    `lines` and `duplicates` (from `load_table_configs`) put the file and line in front of
    each problem and report keys the YAML repeats.
    """
    result = ConfigLoadResult()
    marks = lines or {}
    repeated = list(duplicates)
    shown = source if lines is not None else None

    def report(table: str, field_name: str, message: str, line: int | None) -> None:
        result.problems.append(ConfigProblem(table, field_name, message, line, shown))

    for where, field_name, message, line in repeated:
        if where is None:
            report("*", field_name, message, line)
    if not isinstance(document, Mapping):
        report("*", "(file)", f"{source} must be a mapping with a 'tables' list", 1)
        return result
    for key in sorted(set(document) - {"defaults", "tables"}, key=str):
        report(
            "*", str(key), "unknown top-level key (expected defaults, tables)", marks.get((key,))
        )
    defaults = document.get("defaults") or {}
    if not isinstance(defaults, Mapping):
        report("*", "defaults", "must be a mapping of table fields", marks.get(("defaults",)))
        defaults = {}
    else:
        for key in sorted(set(defaults) - set(TableConfig.model_fields), key=str):
            hint = _close(key, TableConfig.model_fields) or ""
            report("*", f"defaults.{key}", f"unknown field{hint}", marks.get(("defaults", key)))
        defaults = {k: v for k, v in defaults.items() if k in TableConfig.model_fields}
    rows = document.get("tables")
    if not isinstance(rows, list):
        report("*", "tables", "must be a list of table rows", marks.get(("tables",)))
        return result
    names = [str(r.get("name")) if isinstance(r, Mapping) and r.get("name") else None for r in rows]
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            report(
                f"#{index + 1}",
                "(row)",
                "must be a mapping of fields",
                marks.get(("tables", index)),
            )
            continue
        label = names[index] or f"#{index + 1}"
        found, table = check_row({**defaults, **row})
        bad = [(f, m, _line_of(marks, index, f, f in row)) for f, m in found]
        bad += [(f, m, line) for (where, f, m, line) in repeated if where == index]
        first = names.index(names[index]) if names[index] is not None else index
        if first != index:
            others = [str(i + 1) for i, n in enumerate(names) if n == names[index] and i != index]
            bad.append(
                (
                    "name",
                    f"appears more than once in the config table (also row {', '.join(others)}); "
                    "each table needs its own name",
                    _line_of(marks, index, "name", True),
                )
            )
        # In file order when lines are known (sorted is stable: the rule order stays otherwise).
        for field_name, message, where in sorted(bad, key=lambda item: item[2] or 0):
            report(label, field_name, message, where)
        if bad or names.count(names[index]) > 1 or table is None:
            continue
        result.tables[label] = table
    return result


def _compose(text: str) -> tuple[Any, LineMap, list[Duplicate]]:
    """The YAML document and its line map; repeated keys are recorded, not silently dropped.

    libyaml's loader (when PyYAML has it) composes the node tree with marks; the same tree is
    then constructed, so lines cost one walk over the nodes and no second parse.
    """
    loader_class = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _expanded_size(node, {}, set(), 0)
        document = loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()
    marks: LineMap = {}
    duplicates: list[Duplicate] = []
    if node is not None:
        _walk(node, (), marks, duplicates)
    return document, marks, duplicates


# A config table is a few hundred nodes; aliases may repeat a defaults block per row. Beyond
# these bounds the file is refused before it is expanded ("billion laughs": 9 levels of aliases
# took 2.3 GB, and a recursive alias ended in a RecursionError).
MAX_EXPANDED_NODES = 100_000
MAX_DEPTH = 50


class UnsafeYamlError(yaml.YAMLError):
    """A YAML document whose aliases expand too far, refer to themselves, or nest too deep."""

    def __init__(self, message: str, mark: Any) -> None:
        super().__init__(message)
        self.message = message
        self.problem_mark = mark


def _expanded_size(node: Any, sizes: dict[int, int], open_nodes: set[int], depth: int) -> int:
    """How many nodes the document has once every alias is expanded (each shared node counted
    once per use); UnsafeYamlError past the bounds or for a node inside itself."""
    key = id(node)
    if key in open_nodes:
        raise UnsafeYamlError("an alias refers to a node that contains it", node.start_mark)
    if key in sizes:
        return sizes[key]
    if depth > MAX_DEPTH:
        raise UnsafeYamlError(f"nested more than {MAX_DEPTH} levels deep", node.start_mark)
    children: list[Any] = []
    if isinstance(node, yaml.MappingNode):
        children = [item for pair in node.value for item in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    open_nodes.add(key)
    total = 1 + sum(_expanded_size(child, sizes, open_nodes, depth + 1) for child in children)
    open_nodes.discard(key)
    if total > MAX_EXPANDED_NODES:
        raise UnsafeYamlError(
            f"its aliases expand to more than {MAX_EXPANDED_NODES:,} nodes", node.start_mark
        )
    sizes[key] = total
    return total


def _walk(node: Any, path: tuple[Any, ...], marks: LineMap, duplicates: list[Duplicate]) -> None:
    marks[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen:
                duplicates.append(_duplicate(path, key, seen[key], line))
            seen[key] = line
            _walk(value_node, (*path, key), marks, duplicates)
            marks[(*path, key)] = line
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, (*path, index), marks, duplicates)


def _duplicate(path: tuple[Any, ...], key: str, first: int, line: int) -> Duplicate:
    message = f"key {key!r} appears twice (lines {first} and {line}); keep one (YAML would silently keep the last)"
    if len(path) >= 2 and path[0] == "tables" and isinstance(path[1], int):
        return (path[1], ".".join(str(p) for p in path[2:]) or key, message, line)
    return (None, ".".join(str(p) for p in path) or key, message, line)


def display_path(path: Path) -> str:
    """`path` relative to the working directory when it is under it (as users typed it)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def load_table_configs(path: Path | str | None = None) -> ConfigLoadResult:
    """Read and validate the config table file; unreadable YAML is one problem, not an exception."""
    config_path = Path(path) if path is not None else default_config_path()
    shown = display_path(config_path)
    try:
        text = config_path.read_text()
    except OSError as error:
        return ConfigLoadResult(
            problems=[ConfigProblem("*", "(file)", f"cannot read {config_path}: {error.strerror}")]
        )
    try:
        document, marks, duplicates = _compose(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        why = f": {error.message}" if isinstance(error, UnsafeYamlError) else ""
        return ConfigLoadResult(
            problems=[ConfigProblem("*", "(file)", f"{config_path} is not valid YAML{where}{why}")]
        )
    return parse_config(document, shown, marks, duplicates)
