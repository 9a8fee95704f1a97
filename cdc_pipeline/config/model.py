"""The config table's row: `TableConfig`, one typed, validated row per source table.

The YAML row is flat; the fields are grouped here by the part of the pipeline they configure
(source, apply, history, maintenance, operations), in the order of the config reference
(docs/config.md, generated from this model). A field's own check is its type (`types.py`); the
checks across fields are the rules (`rules.py`), run once per row after the fields validated.
"""

from __future__ import annotations

from datetime import date
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from cdc_pipeline.config.formats import (
    EVENT_FORMATS,
    EVENT_OP_COLUMN,
    FORMAT_COLUMNS,
    with_format_defaults,
)
from cdc_pipeline.config.messages import NAME_PATTERN
from cdc_pipeline.config.one_pass import Failed, RowCheck
from cdc_pipeline.config.rules import broken_rules
from cdc_pipeline.config.types import (
    ColumnList,
    ColumnTypes,
    Duration,
    LateArrivalWindow,
    NotifierNames,
    Schedule,
)


class TableConfig(BaseModel):
    """One row of the config table: how one source table's changes become a Delta table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The source: what lands, how it is read and ordered.
    name: str = Field(
        pattern=NAME_PATTERN,
        description="Table name; the DAG id is cdc_<name>, its change files land in "
        "{landing}/<name>, its tables are {warehouse}/<name>/final, staging, ...",
    )
    source: Literal["files", "kafka"] = Field(
        default="files",
        description="Where the changes come from: files (change files landed in "
        "{landing}/<name>/dt=YYYY-MM-DD/hr=HH/) or kafka (the messages of one Kafka topic, "
        "`topic`; their values are JSON: change_format debezium or flat).",
    )
    topic: str | None = Field(
        default=None,
        description="source kafka: the topic holding this table's changes (one topic per "
        "table; no other row may read it).",
    )
    kafka_conn_id: str = Field(
        default="kafka_default",
        min_length=1,
        description="source kafka: the Airflow connection (the Kafka provider's type) holding "
        "the bootstrap servers and any SASL/SSL settings. The `cdc` command reads "
        "CDC_KAFKA_BOOTSTRAP_SERVERS and CDC_KAFKA_<PROPERTY> variables instead "
        "(CDC_KAFKA_SECURITY_PROTOCOL is security.protocol); never the config file.",
    )
    starting_offsets: Literal["earliest", "latest"] = Field(
        default="earliest",
        description="source kafka: where the table's first run starts in each partition: "
        "earliest (every message the topic still holds) or latest (only messages that arrive "
        "after it). Later runs start where the last staged run ended; a partition added to the "
        "topic later is read from its earliest offset.",
    )
    accept_lost_offsets: bool = Field(
        default=False,
        description="source kafka: when the broker deleted messages (retention) before they "
        "were staged, false fails the run naming the lost offsets (the default: nothing is "
        "skipped silently); true stages from the earliest offset the broker still has and "
        "counts the messages lost (messages_lost=).",
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
    flag_column: str = Field(
        default="FLAG", description="Column holding the change flag I, U or D (case-insensitive)."
    )
    compare_exclude: ColumnList = Field(
        default_factory=list,
        description="change_format snapshot: columns left out of change detection (operational "
        "columns such as a load time); a change only there is no change.",
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
    late_arrival_window: LateArrivalWindow = Field(
        default=Duration("3d"),
        description="How far back from its interval's end a run looks for landed files not "
        "staged yet (a duration like 3d or 48h): every hr= folder whose hour starts in [end - "
        "window, end) is listed, so a file that lands in an old hour's folder after that hour's "
        "run, the hours missed during an outage and a sub-hourly schedule's files are all "
        "applied by the next run. The default covers a weekend outage. A file landed in an "
        "older folder is never staged silently: it is counted (files_outside_window), shown by "
        "`cdc status` and warned about; `cdc run` over its hour applies it.",
    )
    max_sequence_ahead: Duration | None = Field(
        default=Duration("7d"),
        description="Quarantine a change whose sequence value lies more than this after the "
        "stage run (a duration like 7d or 36h): a clock error such as year 9999 would otherwise "
        "beat every later real update of its key. Checks the timestamp and date columns of "
        "sequence_by (and Debezium's _cdc_source_ts_ms); null: no bound.",
    )

    # Apply: the final table the changes become.
    database: str = Field(
        default="cdc",
        pattern=NAME_PATTERN,
        description="The Spark catalog database the final (and history) table is registered in "
        "after each run that applies changes: `<database>.<name>` (and `<database>.<name>_history`), "
        "so users query spark.table('cdc.orders') on the same Spark (the Connect server's "
        "session catalog; a Hive metastore when the deployment configures one).",
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

    # History: the SCD type 2 table.
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

    # Maintenance: OPTIMIZE, VACUUM, the staging reset and the checks, each on its own cadence.
    zorder_by: ColumnList = Field(
        default_factory=list, description="Columns OPTIMIZE Z-orders the final table by."
    )
    optimize_schedule: Schedule | None = Field(
        default=Schedule("@daily"), description="When OPTIMIZE runs (cron or preset); null never."
    )
    vacuum_schedule: Schedule | None = Field(
        default=Schedule("@weekly"), description="When VACUUM runs (cron or preset); null never."
    )
    vacuum_retention_hours: int = Field(
        default=168, ge=0, description="Files no version younger than this needs are deleted."
    )
    reset_staging_schedule: Schedule | None = Field(
        default=Schedule("@weekly"),
        description="When staging is reset to final + tombstones; null never.",
    )
    check_schedule: Schedule | None = Field(
        default=Schedule("@daily"),
        description="When `cdc check` verifies the table's invariants (cron or preset; the task "
        "fails on a breach); null never.",
    )

    # Operations (Airflow): the run schedule, timeouts, retries, alerts.
    schedule: Schedule = Field(
        default=Schedule("@hourly"),
        description="The table's run schedule: a five-field cron or a preset (@hourly, @daily, "
        "@midnight, @weekly, @monthly, @quarterly, @yearly, @annually). @once and null are "
        "refused: a CDC table's runs own consecutive data intervals (a one-off load is `cdc "
        "run`).",
    )
    start_date: date = Field(
        default=date(2024, 1, 1),
        description="First data interval of the DAG (UTC); backfills start here at the earliest.",
    )
    spark_conn_id: str = Field(
        default="spark_default",
        description="Airflow connection the Spark tasks run through: spark_connect (a Spark "
        "Connect client in the task) or spark (spark-submit).",
    )
    description: str | None = Field(default=None, description="Free text shown in the DAG docs.")
    execution_timeout: Duration = Field(
        default=Duration("1h"),
        description="Longest a task may run; a task past it is stopped (its Spark work "
        "interrupted) and fails, then retries.",
    )
    dagrun_timeout: Duration = Field(
        default=Duration("3h"),
        description="Longest a DAG run may take, retries included; a run past it fails, so one "
        "hung run cannot hold the table (max_active_runs=1) forever. Not shorter than "
        "execution_timeout.",
    )
    retries: int = Field(
        default=2, ge=0, le=10, description="Retries of a failed task (exponential back-off)."
    )
    freshness: Duration | None = Field(
        default=None,
        description="Deadline alert: a run must succeed within this time of being queued (a "
        "scheduled run is queued when its interval ends), so the table is never more than one "
        "interval plus this behind without an alert to `notify`. Null: no deadline.",
    )
    notify: NotifierNames = Field(
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
        description="Past max_quarantine_fraction: warn logs and notifies, the good rows reach "
        "final and the run's check task fails without retry (the run shows failed, its changes "
        "applied); fail also fails the stage task without retry, so final is not updated for "
        "the interval.",
    )

    @model_validator(mode="before")
    @classmethod
    def _format_defaults(cls, data: Any) -> Any:
        return with_format_defaults(data)

    @field_validator("*", mode="wrap")
    @classmethod
    def _each_field(
        cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> Any:
        """A field's own check; in one-pass mode (see one_pass.py) a failure is recorded."""
        check = RowCheck.of(info)
        if check is None:
            return handler(value)
        if isinstance(value, Failed):  # a required field the row does not set
            return value
        try:
            return handler(value)
        except ValidationError as error:
            check.field_failed(str(info.field_name), error.errors())
            return Failed(value)

    @model_validator(mode="after")
    def _rules_hold(self, info: ValidationInfo) -> TableConfig:
        problems = broken_rules({name: getattr(self, name) for name in type(self).model_fields})
        check = RowCheck.of(info)
        if check is not None:
            check.rules += problems
        elif problems:
            raise ValueError(" | ".join(f"{name}: {message}" for name, message in problems))
        return self

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
