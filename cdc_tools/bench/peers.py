"""The peers `cdc bench` measures overwrite-final against, each at its best (issue: "the peers at
their best"): a full rebuild, delta-rs MERGE with and without streamed execution, and
delta-spark MERGE INTO with and without deletion vectors.

Every MERGE applies the latest change per key when its sequence is newer (updates and deletes;
new keys inserted unless deleted). On a table declared `partition_stable` a MERGE also names the
partitions the changes touch in its condition (`t.P IN (...) AND t.key = s.key`), as a user who
knows no key moves would write it: both engines prune the target's files by it.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_pipeline.config import TableConfig
from spark_jobs import delta
from spark_jobs.rules.transforms import FLAG, latest_change_per_key

# The delta-rs MERGE without streamed execution: the source's statistics (its keys' min and max)
# give an early pruning predicate on the target (delta-rs derives none while streaming).
DELTA_RS_UNSTREAMED = "delta_rs_merge_unstreamed"
# delta-spark MERGE INTO on a copy with `delta.enableDeletionVectors`: rows are deleted and
# updated by deletion vectors (merge-on-read) instead of rewriting the files that hold them.
DELTA_SPARK_DV = "delta_spark_merge_dv"
DELTA_SPARK_METHODS = ("delta_spark_merge", DELTA_SPARK_DV)


def delta_rs_streamed_default() -> bool | None:
    """The installed deltalake's default of `DeltaTable.merge(streamed_exec=...)`; None when it
    has no such argument."""
    parameter = inspect.signature(DeltaTable.merge).parameters.get("streamed_exec")
    return None if parameter is None else bool(parameter.default)


def delta_rs_settings() -> dict[str, Any]:
    """What the JSON says about the delta-rs MERGEs: the version, `streamed_exec`'s default and
    the setting each method ran with."""
    import deltalake

    default = delta_rs_streamed_default()
    settings: dict[str, Any] = {"version": deltalake.__version__, "streamed_exec_default": default}
    if default is None:
        settings["delta_rs_merge"] = "the library's only execution (no streamed_exec argument)"
        settings[DELTA_RS_UNSTREAMED] = "not available: this deltalake has no streamed_exec"
    else:
        settings["delta_rs_merge"] = "streamed_exec=True (streamed: no source statistics)"
        settings[DELTA_RS_UNSTREAMED] = "streamed_exec=False (source statistics prune the target)"
    return settings


def has_delta_spark(spark: SparkSession) -> bool:
    """Whether the session runs Delta Lake's SQL extension (MERGE INTO a path)."""
    try:
        extensions = spark.conf.get("spark.sql.extensions", "") or ""
    except Exception:  # a Connect server may refuse to read a static setting
        return False
    return "DeltaSparkSessionExtension" in extensions


def sql_literal(value: Any) -> str:
    """A partition value as a SQL literal (numbers as they are, anything else quoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def partition_condition(table: TableConfig, values: Iterable[Any] | None) -> str:
    """`t.P IN (...) AND ` naming the touched partitions, or "" (no partition_stable table, or
    no partition named)."""
    if values is None or not table.partition_stable or table.partition_column is None:
        return ""
    named = sorted({v for v in values if v is not None})
    if not named:
        return ""
    listed = ", ".join(sql_literal(v) for v in named)
    return f"t.`{table.partition_column}` IN ({listed}) AND "


def full_rebuild(
    spark: SparkSession, table: TableConfig, final: Path, changes: DataFrame
) -> dict[str, Any]:
    """Seed 001's compaction: rank all rows with the changes, rewrite the whole table."""
    snapshot = delta.load_snapshot(final)
    current = delta.read_snapshot(spark, snapshot).withColumn(FLAG, F.lit("U"))
    ranked = latest_change_per_key(
        current.unionByName(changes.select(*current.columns)), table.keys, table.sequence_by
    )
    rows = ranked.filter(F.col(FLAG) != "D").drop(FLAG)
    run_id = delta.new_run_id()
    written = delta.write_files(rows, final, snapshot.partition_columns, run_id)
    result = delta.commit(snapshot, written, "overwrite", step="full_rebuild", run_id=run_id)
    return {"rows_written": written.rows, "final_version": result.version}


def _arrow_partitions(table: TableConfig, source: pa.Table) -> list[Any] | None:
    """The partition values the collected changes name (None: no partition_stable table)."""
    column = table.partition_column
    if not table.partition_stable or column is None or column not in source.column_names:
        return None
    return pc.unique(source.column(column)).to_pylist()


def delta_rs_merge(
    table: TableConfig, final: Path, changes: DataFrame, *, streamed: bool | None = True
) -> dict[str, Any]:
    """delta-rs MERGE of the latest change per key: newer sequence updates or deletes; new
    keys are inserted unless deleted. `streamed`: its `streamed_exec` (None: the library's
    default, for a deltalake without the argument)."""
    latest = latest_change_per_key(changes, table.keys, table.sequence_by)
    source = latest.toArrow()  # the change set, collected for delta-rs (small by design)
    target = DeltaTable(str(final))
    columns = [f.name for f in target.schema().fields]
    on = partition_condition(table, _arrow_partitions(table, source))
    on += " AND ".join(f"t.{k} = s.{k}" for k in table.keys)
    newer = "s.TS > t.TS"
    options: dict[str, Any] = {} if streamed is None else {"streamed_exec": streamed}
    metrics = (
        target.merge(source, predicate=on, source_alias="s", target_alias="t", **options)
        .when_matched_delete(predicate=f"s.{FLAG} = 'D' AND {newer}")
        .when_matched_update(
            updates={c: f"s.{c}" for c in columns}, predicate=f"s.{FLAG} <> 'D' AND {newer}"
        )
        .when_not_matched_insert(
            updates={c: f"s.{c}" for c in columns}, predicate=f"s.{FLAG} <> 'D'"
        )
        .execute()
    )
    keep = ("num_target_rows_inserted", "num_target_rows_updated", "num_target_rows_deleted")
    return {k: metrics.get(k) for k in keep}


def enable_deletion_vectors(spark: SparkSession, final: Path) -> None:
    """Turn on deletion vectors on the table at `final` (a protocol upgrade: one commit)."""
    spark.sql(
        f"ALTER TABLE delta.`{final.resolve()}` "
        "SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    ).collect()


def has_deletion_vectors(snapshot: delta.Snapshot) -> bool:
    """Whether the table's readers must apply deletion vectors (delta-rs cannot read its rows)."""
    if snapshot.table is None:
        return False
    features = snapshot.table.protocol().reader_features or []
    return "deletionVectors" in features


def _spark_partitions(table: TableConfig, changes: DataFrame) -> list[Any] | None:
    """The partition values the changes name, collected (None: no partition_stable table)."""
    column = table.partition_column
    if not table.partition_stable or column is None:
        return None
    return [row[0] for row in changes.select(column).distinct().collect()]


def delta_spark_merge(
    spark: SparkSession, table: TableConfig, final: Path, changes: DataFrame
) -> dict[str, Any]:
    """Delta Lake's MERGE INTO of the latest change per key on this Spark session: the rule of
    `delta_rs_merge` (newer sequence updates or deletes; new keys inserted unless deleted).
    Whether it writes deletion vectors is the table's setting (`enable_deletion_vectors`)."""
    latest = latest_change_per_key(changes, table.keys, table.sequence_by)
    view = "cdc_bench_latest_changes"
    latest.createOrReplaceTempView(view)
    columns = [f.name for f in DeltaTable(str(final)).schema().fields]
    on = partition_condition(table, _spark_partitions(table, changes))
    on += " AND ".join(f"t.`{k}` = s.`{k}`" for k in table.keys)
    newer = "s.TS > t.TS"
    sets = ", ".join(f"t.`{c}` = s.`{c}`" for c in columns)
    names = ", ".join(f"`{c}`" for c in columns)
    values = ", ".join(f"s.`{c}`" for c in columns)
    # Delta resolves delta.`path` only for an absolute path (bench-results/ is relative).
    metrics = spark.sql(
        f"MERGE INTO delta.`{final.resolve()}` t USING {view} s ON {on} "
        f"WHEN MATCHED AND s.{FLAG} = 'D' AND {newer} THEN DELETE "
        f"WHEN MATCHED AND s.{FLAG} <> 'D' AND {newer} THEN UPDATE SET {sets} "
        f"WHEN NOT MATCHED AND s.{FLAG} <> 'D' THEN INSERT ({names}) VALUES ({values})"
    ).collect()  # metadata: one row of counts
    spark.catalog.dropTempView(view)
    row = metrics[0].asDict() if metrics else {}
    keep = ("num_inserted_rows", "num_updated_rows", "num_deleted_rows")
    return {k: row.get(k) for k in keep}
