"""The config table: one typed, validated row per source table (no Spark, no Airflow)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cdc_pipeline.errors import ConfigError

NAME_PATTERN = r"^[a-z][a-z0-9_]*$"
COLUMN_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
TECHNICAL_PREFIX = "_cdc_"

# Spark SQL types a column may declare. Nested types are not supported: change rows are flat.
_SIMPLE_TYPES = {
    "boolean",
    "tinyint",
    "byte",
    "smallint",
    "short",
    "int",
    "integer",
    "bigint",
    "long",
    "float",
    "double",
    "string",
    "date",
    "timestamp",
    "timestamp_ntz",
    "binary",
}
_PARAM_TYPES = re.compile(
    r"^(decimal|numeric)\(\s*\d+\s*(,\s*\d+\s*)?\)$|^(varchar|char)\(\s*\d+\s*\)$"
)
# Columns a change format adds to every change row, usable in sequence_by (name -> Spark type).
FORMAT_COLUMNS: dict[str, dict[str, str]] = {
    "flat": {},
    "debezium": {
        "_cdc_source_ts_ms": "bigint",
        "_cdc_lsn": "bigint",
        "_cdc_binlog_file": "string",
        "_cdc_binlog_pos": "bigint",
        "_cdc_binlog_row": "int",
        "_cdc_position": "string",
    },
    "wal2json": {"_cdc_lsn": "bigint", "_cdc_position": "string"},
    "snapshot": {"_cdc_snapshot_at": "timestamp"},
}
# The source's own order, used when a row of these formats omits sequence_by.
DEFAULT_SEQUENCE_BY: dict[str, list[str]] = {
    "debezium": ["_cdc_source_ts_ms", "_cdc_position"],
    "wal2json": ["_cdc_position"],
    "snapshot": ["_cdc_snapshot_at"],
}
# Formats whose changes are events read from JSON lines (they carry an op, not a flag column).
EVENT_FORMATS = ("debezium", "wal2json")
# Where the change kind is read from for the event formats (they carry an op, not a flag column).
EVENT_OP_COLUMN = "_cdc_op"
SPARK_TYPES_HELP = (
    "a Spark SQL type such as bigint, int, string, double, decimal(10,2), date, timestamp"
)


def is_spark_sql_type(text: str) -> bool:
    """True when `text` names a flat Spark SQL type this project can cast change values to."""
    normalized = text.strip().lower()
    return normalized in _SIMPLE_TYPES or bool(_PARAM_TYPES.match(normalized))


class TableConfig(BaseModel):
    """One row of the config table: how one source table's changes become a Delta table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN, description="Table name; the DAG id is cdc_<name>.")
    file_format: Literal["parquet", "csv", "json"] = Field(
        default="parquet",
        description="Format of the landed change files (json = JSON lines; the default for "
        "debezium and wal2json).",
    )
    change_format: Literal["flat", "debezium", "wal2json", "snapshot"] = Field(
        default="flat",
        description="flat: one row per change with a flag column; debezium: Debezium change "
        "events; wal2json: wal2json format-version 2 lines; snapshot: each interval holds a full "
        "extract of the source, compared by hashes with the final table.",
    )
    compare_exclude: list[str] = Field(
        default_factory=list,
        description="change_format snapshot: columns left out of change detection (operational "
        "columns such as a load time); a change only there is no change.",
    )
    history: bool = Field(
        default=False,
        description="Also keep {table}/history, an SCD type 2 table with one version per change.",
    )
    track_history_columns: list[str] | None = Field(
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
    columns: dict[str, str] | None = Field(
        default=None,
        description="Column name -> Spark SQL type. Optional except for csv: without it the "
        "files give the schema, and it evolves (see on_schema_change).",
    )
    on_schema_change: Literal["evolve", "quarantine"] = Field(
        default="evolve",
        description="When columns is omitted and a batch's schema differs from staging's: evolve "
        "adds new columns and applies widening type changes (a narrowing or incompatible change "
        "quarantines the batch); quarantine refuses every change.",
    )
    keys: list[str] = Field(min_length=1, description="Record key columns (composite allowed).")
    sequence_by: list[str] = Field(
        min_length=1,
        description="Columns ordering the changes of a key; later ones break ties. Optional for "
        "debezium and wal2json (the source's own order).",
    )
    partition_expression: str | None = Field(
        default=None, description="Spark SQL expression giving the final table's partition value."
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
        "a delete. An update that moved a key anyway would leave its old row in place too.",
    )
    insert_only: bool = Field(
        default=False, description="Append each (key, sequence) once; never update or delete."
    )
    flag_column: str = Field(
        default="FLAG", description="Column holding the change flag I, U or D."
    )
    zorder_by: list[str] = Field(default_factory=list, description="Columns OPTIMIZE Z-orders by.")
    schedule: str = Field(default="@hourly", description="Cron or preset of the table's DAG.")
    start_date: date = Field(
        default=date(2024, 1, 1),
        description="First data interval of the DAG (UTC); backfills start here.",
    )
    optimize_schedule: str | None = Field(
        default="@daily", description="When OPTIMIZE runs (cron or preset); null never."
    )
    vacuum_schedule: str | None = Field(
        default="@weekly", description="When VACUUM runs (cron or preset); null never."
    )
    reset_staging_schedule: str | None = Field(
        default="@weekly", description="When staging is reset to final + tombstones; null never."
    )
    vacuum_retention_hours: int = Field(
        default=168, ge=0, description="Files no version younger than this needs are deleted."
    )
    spark_conn_id: str = Field(
        default="spark_default", description="Airflow connection the Spark tasks submit through."
    )
    description: str | None = Field(default=None, description="Free text shown in the DAG docs.")

    @model_validator(mode="before")
    @classmethod
    def _format_defaults(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("change_format") in DEFAULT_SEQUENCE_BY:
            data = dict(data)
            if data["change_format"] in EVENT_FORMATS:
                data.setdefault("file_format", "json")
            if not data.get("sequence_by"):
                data["sequence_by"] = list(DEFAULT_SEQUENCE_BY[data["change_format"]])
        return data

    @field_validator("keys", "sequence_by", "zorder_by", "compare_exclude", "track_history_columns")
    @classmethod
    def _no_duplicates(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        duplicates = sorted({v for v in value if value.count(v) > 1})
        if duplicates:
            raise ValueError(f"lists {', '.join(duplicates)} more than once")
        return value

    @field_validator("columns")
    @classmethod
    def _columns_are_typed(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return value
        if not value:
            raise ValueError("must name at least one column")
        problems = []
        for column, spark_type in value.items():
            if not re.match(COLUMN_PATTERN, column):
                problems.append(f"column name {column!r} must match {COLUMN_PATTERN}")
            elif column.lower().startswith(TECHNICAL_PREFIX):
                problems.append(
                    f"column name {column!r} uses the reserved prefix {TECHNICAL_PREFIX}"
                )
            if not isinstance(spark_type, str) or not is_spark_sql_type(spark_type):
                problems.append(f"type {spark_type!r} of {column} is not {SPARK_TYPES_HELP}")
        if problems:
            raise ValueError("; ".join(problems))
        return {column: spark_type.strip().lower() for column, spark_type in value.items()}

    @model_validator(mode="after")
    def _fields_agree(self) -> TableConfig:
        problems: list[str] = []
        if self.columns is None and self.file_format == "csv":
            problems.append("columns: required for file_format csv (CSV values carry no types)")
        if self.change_format in EVENT_FORMATS and self.file_format != "json":
            problems.append(
                f"file_format: change_format {self.change_format} is read from JSON lines "
                "(file_format json)"
            )
        format_columns = FORMAT_COLUMNS[self.change_format]
        declared = set(self.columns or {}) | set(format_columns)
        for field_name in (
            "keys",
            "sequence_by",
            "zorder_by",
            "compare_exclude",
            "track_history_columns",
        ):
            for column in getattr(self, field_name) or []:
                known = declared if self.columns is not None else set(format_columns)
                if column.startswith(TECHNICAL_PREFIX) and column not in format_columns:
                    problems.append(
                        f"{field_name}: {column!r} is not a column of change_format "
                        f"{self.change_format} (those are: {', '.join(format_columns) or 'none'})"
                    )
                elif self.columns is not None and column not in known:
                    problems.append(f"{field_name}: {column!r} is not a declared column")
        problems += self._snapshot_and_history_problems()
        if (
            self.columns is not None
            and self.change_format != "snapshot"
            and self.flag_column in declared
        ):
            problems.append(f"flag_column: {self.flag_column!r} must not also be a declared column")
        overlap = sorted(set(self.keys) & set(self.sequence_by))
        if overlap:
            problems.append(f"sequence_by: {', '.join(overlap)} already in keys")
        if (self.partition_expression is None) != (self.partition_column is None):
            problems.append(
                "partition_column: partition_expression and partition_column go together (set both or neither)"
            )
        if self.partition_column is not None:
            if not re.match(COLUMN_PATTERN, self.partition_column):
                problems.append(
                    f"partition_column: {self.partition_column!r} must match {COLUMN_PATTERN}"
                )
            if self.partition_column in declared:
                problems.append(
                    f"partition_column: {self.partition_column!r} clashes with a declared column"
                )
            if self.partition_column in self.zorder_by:
                problems.append("zorder_by: cannot include the partition column")
        if self.partition_expression is not None and not self.partition_expression.strip():
            problems.append("partition_expression: must not be empty")
        if self.partition_stable and self.partition_column is None:
            problems.append("partition_stable: needs partition_expression and partition_column")
        for field_name in (
            "schedule",
            "optimize_schedule",
            "vacuum_schedule",
            "reset_staging_schedule",
        ):
            value = getattr(self, field_name)
            if value is not None and not is_schedule(value):
                problems.append(
                    f"{field_name}: {value!r} is not a cron expression or a preset like @hourly"
                )
        if problems:
            raise ValueError(" | ".join(problems))
        return self

    def _snapshot_and_history_problems(self) -> list[str]:
        problems = []
        if self.compare_exclude and self.change_format != "snapshot":
            problems.append("compare_exclude: only for change_format snapshot")
        if set(self.compare_exclude) & set(self.keys):
            problems.append("compare_exclude: key columns are always compared")
        if self.change_format == "snapshot" and self.insert_only:
            problems.append("insert_only: a snapshot table derives updates and deletes")
        if self.history and self.insert_only:
            problems.append("history: insert_only tables never change a row (no history to keep)")
        if self.track_history_columns is not None:
            if not self.history:
                problems.append("track_history_columns: needs history: true")
            if not self.track_history_columns:
                problems.append("track_history_columns: must name at least one column")
            if set(self.track_history_columns) & set(self.keys):
                problems.append("track_history_columns: key columns identify a row, not a version")
        return problems

    @property
    def dag_id(self) -> str:
        """The Airflow DAG id of this table."""
        return f"cdc_{self.name}"

    @property
    def data_columns(self) -> list[str] | None:
        """Declared columns in declaration order, or None when the files give the schema."""
        return list(self.columns) if self.columns is not None else None

    @property
    def format_columns(self) -> dict[str, str]:
        """The `_cdc_` columns the change format adds to every row (name -> Spark type)."""
        return dict(FORMAT_COLUMNS[self.change_format])

    @property
    def flag_source(self) -> str:
        """Column the change kind (I, U, D) is read from: the flag column, or the event's op."""
        return EVENT_OP_COLUMN if self.change_format in EVENT_FORMATS else self.flag_column


_PRESETS = {
    "@once",
    "@hourly",
    "@daily",
    "@weekly",
    "@monthly",
    "@yearly",
    "@annually",
    "@midnight",
}
_CRON_FIELD = re.compile(r"^[0-9A-Za-z*/,\-?LW#]+$")


def is_schedule(value: str) -> bool:
    """True for an Airflow preset or a five-field cron expression."""
    text = value.strip()
    if text in _PRESETS:
        return True
    parts = text.split()
    return len(parts) == 5 and all(_CRON_FIELD.match(p) for p in parts)


@dataclass(frozen=True)
class ConfigProblem:
    """One validation problem of one config row: which table, which field, what is expected."""

    table: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"table {self.table}: {self.field}: {self.message}"


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


def _problems_from_validation(table: str, error: ValidationError) -> list[ConfigProblem]:
    problems = []
    for item in error.errors():
        location = ".".join(str(part) for part in item["loc"]) or "(row)"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown field (misspelt?)"
        elif item["type"] == "missing":
            message = "required field is missing"
        message = message.removeprefix("Value error, ")
        if location == "(row)" and " | " in message:
            # The cross-field check joins its findings; give each its own line.
            for part in message.split(" | "):
                field_name, _, text = part.partition(": ")
                problems.append(ConfigProblem(table, field_name, text))
            continue
        if location == "(row)" and ": " in message:
            field_name, _, message = message.partition(": ")
            location = field_name
        problems.append(ConfigProblem(table, location, message))
    return problems


def parse_config(document: Any, source: str = "config") -> ConfigLoadResult:
    """Validate a parsed YAML document (defaults + tables) into table rows and problems."""
    result = ConfigLoadResult()
    if not isinstance(document, Mapping):
        result.problems.append(
            ConfigProblem("*", "(file)", f"{source} must be a mapping with a 'tables' list")
        )
        return result
    unknown = sorted(set(document) - {"defaults", "tables"})
    for key in unknown:
        result.problems.append(
            ConfigProblem("*", key, "unknown top-level key (expected defaults, tables)")
        )
    defaults = document.get("defaults") or {}
    if not isinstance(defaults, Mapping):
        result.problems.append(ConfigProblem("*", "defaults", "must be a mapping of table fields"))
        defaults = {}
    else:
        for key in sorted(set(defaults) - set(TableConfig.model_fields)):
            result.problems.append(
                ConfigProblem("*", f"defaults.{key}", "unknown field (misspelt?)")
            )
        defaults = {k: v for k, v in defaults.items() if k in TableConfig.model_fields}
    rows = document.get("tables")
    if not isinstance(rows, list):
        result.problems.append(ConfigProblem("*", "tables", "must be a list of table rows"))
        return result
    seen: set[str] = set()
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            result.problems.append(
                ConfigProblem(f"#{index + 1}", "(row)", "must be a mapping of fields")
            )
            continue
        label = str(row.get("name") or f"#{index + 1}")
        merged = {**defaults, **row}
        try:
            table = TableConfig.model_validate(merged)
        except ValidationError as error:
            result.problems.extend(_problems_from_validation(label, error))
            continue
        if table.name in seen:
            result.problems.append(
                ConfigProblem(label, "name", "appears more than once in the config table")
            )
            result.tables.pop(table.name, None)
            continue
        seen.add(table.name)
        result.tables[table.name] = table
    return result


def load_table_configs(path: Path | str | None = None) -> ConfigLoadResult:
    """Read and validate the config table file; unreadable YAML is one problem, not an exception."""
    config_path = Path(path) if path is not None else default_config_path()
    try:
        text = config_path.read_text()
    except OSError as error:
        return ConfigLoadResult(
            problems=[ConfigProblem("*", "(file)", f"cannot read {config_path}: {error.strerror}")]
        )
    try:
        # libyaml's loader when PyYAML has it: parsing many rows stays cheap at DAG parse time.
        document = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        return ConfigLoadResult(
            problems=[ConfigProblem("*", "(file)", f"{config_path} is not valid YAML{where}")]
        )
    return parse_config(document, str(config_path))


def table_names(result: ConfigLoadResult) -> Iterable[str]:
    """Names of the valid tables, sorted."""
    return sorted(result.tables)
