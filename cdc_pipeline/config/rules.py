"""The cross-field rules of a config row: each declares the fields it reads.

`broken_rules` runs every rule once per row, in the order below (the order their problems are
reported in). A rule reading a field that failed its own check is skipped: that field already
has its problem, and the rule would only repeat it or guess.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from cdc_pipeline import sql_guard
from cdc_pipeline.columns import TECHNICAL_PREFIX
from cdc_pipeline.config.formats import EVENT_FORMATS, FORMAT_COLUMNS
from cdc_pipeline.config.messages import COLUMN_PATTERN, PATTERN_HELP, close
from cdc_pipeline.config.one_pass import Failed, Problem

# Below this retention `cdc vacuum` needs --force (spark_jobs/vacuum.py reads it).
VACUUM_SAFE_HOURS = 168
# The values of a rule's fields, by name: a rule can read only the fields it declares.
Fields = Mapping[str, Any]


@dataclass(frozen=True)
class Rule:
    """A check over several fields of one row, yielding (field, message) problems."""

    reads: tuple[str, ...]
    check: Callable[[Fields], Iterator[Problem]]


RULES: list[Rule] = []


def rule(*reads: str) -> Callable[[Callable[[Fields], Iterator[Problem]]], Rule]:
    """Declare a rule over the fields `reads`; rules run in the order they are declared."""

    def declare(check: Callable[[Fields], Iterator[Problem]]) -> Rule:
        declared = Rule(reads, check)
        RULES.append(declared)
        return declared

    return declare


def broken_rules(values: Mapping[str, Any]) -> list[Problem]:
    """The problems of every rule whose fields all validated (`Failed` marks the others)."""
    values = dict(values)
    given = values.get("columns")
    if isinstance(given, Failed) and isinstance(given.given, Mapping) and given.given:
        # The names of a mapping with a bad type are still the declared columns.
        values["columns"] = {str(k): str(v) for k, v in given.given.items()}
    problems: list[Problem] = []
    for declared in RULES:
        if any(isinstance(values[name], Failed) for name in declared.reads):
            continue
        problems += declared.check({name: values[name] for name in declared.reads})
    return problems


@rule("columns", "file_format")
def _csv_declares_columns(row: Fields) -> Iterator[Problem]:
    if row["columns"] is None and row["file_format"] == "csv":
        yield "columns", "required for file_format csv (CSV values carry no types)"


@rule("change_format", "file_format")
def _events_are_json_lines(row: Fields) -> Iterator[Problem]:
    change_format = row["change_format"]
    if change_format in EVENT_FORMATS and row["file_format"] != "json":
        yield (
            "file_format",
            f"change_format {change_format} is read from JSON lines (file_format json)",
        )


def _names_columns(field_name: str) -> Rule:
    """The rule that `field_name` lists declared columns or the format's `_cdc_` columns."""

    @rule("change_format", "columns", field_name)
    def check(row: Fields) -> Iterator[Problem]:
        columns, change_format = row["columns"], row["change_format"]
        format_columns = FORMAT_COLUMNS[change_format]
        declared = set(columns or {}) | set(format_columns)
        for column in row[field_name] or []:
            if column.startswith(TECHNICAL_PREFIX) and column not in format_columns:
                yield (
                    field_name,
                    f"{column!r} is not a column of change_format {change_format} (those "
                    f"are: {', '.join(format_columns) or 'none'})",
                )
            elif columns is not None and column not in declared:
                yield (
                    field_name,
                    f"{column!r} is not a declared column{close(column, declared)} "
                    f"(declared: {', '.join(columns)})",
                )

    return check


# The fields that list columns, each checked against the declared and the format's columns.
COLUMN_LISTS = ("keys", "sequence_by", "zorder_by", "compare_exclude", "track_history_columns")
for listing in COLUMN_LISTS:
    _names_columns(listing)


@rule("change_format", "columns", "flag_column")
def _flag_is_not_a_column(row: Fields) -> Iterator[Problem]:
    columns, flag_column = row["columns"], row["flag_column"]
    if columns is None or row["change_format"] == "snapshot":
        return
    declared = set(columns) | set(FORMAT_COLUMNS[row["change_format"]])
    if flag_column.lower() in {c.lower() for c in declared}:
        yield "flag_column", f"{flag_column!r} must not also be a declared column"


@rule("change_format", "columns", "partition_column")
def _partition_column_is_new(row: Fields) -> Iterator[Problem]:
    partition_column = row["partition_column"]
    columns = [*(row["columns"] or {}), *FORMAT_COLUMNS[row["change_format"]]]
    clash = [c for c in columns if partition_column and c.lower() == partition_column.lower()]
    if clash:
        # Spark resolves names regardless of case: `id` would overwrite the column ID.
        same = "" if partition_column in clash else f" ({', '.join(clash)}; Spark ignores case)"
        yield "partition_column", f"{partition_column!r} clashes with a declared column{same}"


@rule("change_format", "columns", "partition_expression")
def _partition_expression_is_allowed(row: Fields) -> Iterator[Problem]:
    expression, columns = row["partition_expression"], row["columns"]
    if expression is None or not expression.strip():
        return
    refused = sql_guard.expression_problems(
        expression,
        list(columns) if columns is not None else None,
        list(FORMAT_COLUMNS[row["change_format"]]),
    )
    if refused:
        yield "partition_expression", f"{expression!r} refused: " + "; ".join(refused[:3])


@rule("compare_exclude", "change_format")
def _compare_exclude_is_for_snapshots(row: Fields) -> Iterator[Problem]:
    if row["compare_exclude"] and row["change_format"] != "snapshot":
        yield "compare_exclude", "only for change_format snapshot"


@rule("compare_exclude", "keys")
def _keys_are_compared(row: Fields) -> Iterator[Problem]:
    if set(row["compare_exclude"]) & set(row["keys"]):
        yield "compare_exclude", "key columns are always compared"


@rule("change_format", "insert_only")
def _snapshots_update(row: Fields) -> Iterator[Problem]:
    if row["change_format"] == "snapshot" and row["insert_only"]:
        yield "insert_only", "a snapshot table derives updates and deletes"


@rule("history", "insert_only")
def _history_needs_changes(row: Fields) -> Iterator[Problem]:
    if row["history"] and row["insert_only"]:
        yield "history", "insert_only tables never change a row (no history to keep)"


@rule("track_history_columns", "history")
def _tracking_needs_history(row: Fields) -> Iterator[Problem]:
    if row["track_history_columns"] is not None and not row["history"]:
        yield "track_history_columns", "needs history: true"


@rule("track_history_columns")
def _tracking_names_a_column(row: Fields) -> Iterator[Problem]:
    tracked = row["track_history_columns"]
    if tracked is not None and not tracked:
        yield "track_history_columns", "must name at least one column"


@rule("track_history_columns", "keys")
def _keys_are_not_tracked(row: Fields) -> Iterator[Problem]:
    if set(row["track_history_columns"] or []) & set(row["keys"]):
        yield "track_history_columns", "key columns identify a row, not a version"


@rule("keys", "sequence_by")
def _order_is_not_a_key(row: Fields) -> Iterator[Problem]:
    overlap = sorted(set(row["keys"]) & set(row["sequence_by"]))
    if overlap:
        yield "sequence_by", f"{', '.join(overlap)} already in keys"


@rule("partition_expression", "partition_column")
def _partition_fields_go_together(row: Fields) -> Iterator[Problem]:
    if (row["partition_expression"] is None) != (row["partition_column"] is None):
        yield (
            "partition_column",
            "partition_expression and partition_column go together (set both or neither)",
        )


@rule("partition_column")
def _partition_column_is_a_name(row: Fields) -> Iterator[Problem]:
    partition_column = row["partition_column"]
    if partition_column is None:
        return
    if not re.match(COLUMN_PATTERN, partition_column):
        yield "partition_column", f"{partition_column!r} {PATTERN_HELP[COLUMN_PATTERN]}"
    elif partition_column.lower().startswith(TECHNICAL_PREFIX):
        yield (
            "partition_column",
            f"{partition_column!r} uses the reserved prefix {TECHNICAL_PREFIX}",
        )


@rule("partition_column", "zorder_by")
def _zorder_is_within_a_partition(row: Fields) -> Iterator[Problem]:
    if row["partition_column"] is not None and row["partition_column"] in row["zorder_by"]:
        yield "zorder_by", "cannot include the partition column"


@rule("vacuum_retention_hours", "vacuum_schedule")
def _scheduled_vacuum_is_safe(row: Fields) -> Iterator[Problem]:
    hours = row["vacuum_retention_hours"]
    if row["vacuum_schedule"] is not None and hours < VACUUM_SAFE_HOURS:
        # The scheduled vacuum runs without --force, and refuses such a retention every time.
        yield (
            "vacuum_retention_hours",
            f"{hours} is below {VACUUM_SAFE_HOURS}, which the scheduled vacuum refuses; use "
            f"at least {VACUUM_SAFE_HOURS}, or vacuum_schedule: null and `cdc vacuum "
            "--force` by hand",
        )


@rule("partition_expression")
def _partition_expression_is_not_empty(row: Fields) -> Iterator[Problem]:
    expression = row["partition_expression"]
    if expression is not None and not expression.strip():
        yield "partition_expression", "must not be empty"


@rule("partition_stable", "partition_column")
def _stable_needs_a_partition(row: Fields) -> Iterator[Problem]:
    if row["partition_stable"] and row["partition_column"] is None:
        yield "partition_stable", "needs partition_expression and partition_column"


@rule("ignore_null_updates", "change_format")
def _partial_updates_are_flat(row: Fields) -> Iterator[Problem]:
    change_format = row["change_format"]
    if row["ignore_null_updates"] and change_format != "flat":
        why = (
            "tells a value not sent from a null itself)"
            if change_format in EVENT_FORMATS
            else "rows are full extracts: a null there is a null)"
        )
        yield "ignore_null_updates", f"only for change_format flat ({change_format} {why}"


# change_format too: ignore_null_updates is judged only against a change_format that parsed.
@rule("ignore_null_updates", "change_format", "insert_only")
def _partial_updates_need_updates(row: Fields) -> Iterator[Problem]:
    if row["ignore_null_updates"] and row["insert_only"]:
        yield "ignore_null_updates", "insert_only tables have no updates"


@rule("execution_timeout", "dagrun_timeout")
def _timeouts_agree(row: Fields) -> Iterator[Problem]:
    task, run = row["execution_timeout"], row["dagrun_timeout"]
    if run.delta < task.delta:
        yield (
            "dagrun_timeout",
            f"{run} is shorter than execution_timeout {task} (a run would time out before its "
            "first task does)",
        )


# Kafka's legal topic names (its Topic.validate): letters, digits, '.', '_', '-'; 1-249 long.
TOPIC_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,249}")
# Change formats a Kafka message's JSON value can hold.
KAFKA_CHANGE_FORMATS = ("debezium", "flat")


@rule("source", "topic")
def _kafka_names_its_topic(row: Fields) -> Iterator[Problem]:
    topic = row["topic"]
    if row["source"] == "kafka":
        if topic is None:
            yield "topic", "required for source kafka (the topic holding this table's changes)"
        elif not TOPIC_PATTERN.fullmatch(topic) or topic in (".", ".."):
            yield (
                "topic",
                f"{topic!r} is not a Kafka topic name (letters, digits, '.', '_' and '-'; at "
                "most 249)",
            )
    elif topic is not None:
        yield "topic", "only for source kafka (this row reads files: set source: kafka)"


@rule("source", "change_format", "file_format")
def _kafka_values_are_json_changes(row: Fields) -> Iterator[Problem]:
    if row["source"] != "kafka":
        return
    if row["change_format"] not in KAFKA_CHANGE_FORMATS:
        yield (
            "change_format",
            f"{row['change_format']} is not read from Kafka (a message's value is one JSON "
            f"change: {' or '.join(KAFKA_CHANGE_FORMATS)})",
        )
    if row["file_format"] != "json":
        yield (
            "file_format",
            f"{row['file_format']} is for landed files; a Kafka message's value is JSON "
            "(omit file_format)",
        )


@rule("source", "late_arrival_window")
def _window_is_for_files(row: Fields) -> Iterator[Problem]:
    if row["source"] == "kafka" and row["late_arrival_window"].delta != timedelta(days=3):
        yield (
            "late_arrival_window",
            "only for source files (a Kafka table reads every message not staged yet)",
        )


@rule("source", "kafka_conn_id", "starting_offsets", "accept_lost_offsets")
def _kafka_fields_need_kafka(row: Fields) -> Iterator[Problem]:
    if row["source"] == "kafka":
        return
    set_here = [
        name
        for name, default in (
            ("kafka_conn_id", "kafka_default"),
            ("starting_offsets", "earliest"),
            ("accept_lost_offsets", False),
        )
        if row[name] != default
    ]
    for name in set_here:
        yield name, "only for source kafka (this row reads files: set source: kafka)"


@rule("starting_offsets", "columns", "on_schema_change")
def _latest_start_learns_columns(row: Fields) -> Iterator[Problem]:
    if (
        row["starting_offsets"] == "latest"
        and row["columns"] is None
        and row["on_schema_change"] == "quarantine"
    ):
        # The first run records where it starts before any message showed a column: the
        # columns are then learnt as a schema change, which quarantine refuses.
        yield (
            "on_schema_change",
            "quarantine refuses the columns a starting_offsets: latest table learns from its "
            "first messages: declare columns, or use evolve",
        )
