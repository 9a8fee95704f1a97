"""Evolve a schema: add columns (metadata only) or widen types (one rewrite commit)."""

from __future__ import annotations

from deltalake import CommitProperties, Schema
from deltalake.exceptions import CommitFailedError
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from cdc_pipeline.paths import Location
from spark_jobs.delta import committing
from spark_jobs.delta.reading import (
    Snapshot,
    finished,
    load_snapshot,
    open_table,
    read_snapshot,
    spark_schema_of,
)
from spark_jobs.delta.writing import write_files


def evolved_schema(current: StructType, target: StructType) -> StructType:
    """`current` with the types of `target` where they differ, then `target`'s new columns."""
    wanted = {f.name: f for f in target.fields}
    fields = [
        StructField(f.name, wanted[f.name].dataType, True)
        if f.name in wanted and wanted[f.name].dataType != f.dataType
        else f
        for f in current.fields
    ]
    known = {f.name for f in current.fields}
    fields += [StructField(f.name, f.dataType, True) for f in target.fields if f.name not in known]
    return StructType(fields)


def evolve_table(spark: SparkSession, path: Location, target: StructType) -> list[str]:
    """Give the table at `path` the columns and types of `target`; returns what changed.

    New columns are a metadata-only commit (older files read them as null). A widened type
    rewrites the whole table with its values cast, in one overwrite commit that also sets the
    new schema, so every file matches the schema the log declares.
    """

    def attempt(_: int) -> list[str] | None:
        snapshot = load_snapshot(path)
        if snapshot.table is None or snapshot.schema is None:
            return []
        current = snapshot.schema
        new_schema = evolved_schema(current, target)
        if new_schema == current:
            return []
        known = {f.name: f.dataType for f in current.fields}
        widened = [
            f"{f.name} {known[f.name].simpleString()} -> {f.dataType.simpleString()}"
            for f in new_schema.fields
            if f.name in known and known[f.name] != f.dataType
        ]
        added = [
            f"{f.name} {f.dataType.simpleString()}"
            for f in new_schema.fields
            if f.name not in known
        ]
        changes = [f"add {a}" for a in added] + [f"widen {w}" for w in widened]
        run_id = committing.new_run_id()
        if not widened:
            fields = Schema.from_json(
                StructType([f for f in new_schema.fields if f.name not in known]).json()
            ).fields
            try:
                snapshot.table.alter.add_columns(
                    fields,
                    commit_properties=CommitProperties(
                        custom_metadata={
                            committing.RUN_ID_KEY: run_id,
                            committing.STEP_KEY: "evolve_schema",
                        }
                    ),
                )
            except CommitFailedError:
                return None
            return changes
        return changes if _rewrite_widened(spark, snapshot, new_schema, run_id) else None

    if _unchanged(path, target):
        return []
    return committing.with_retries(f"{path}: changing the schema", attempt)


def _unchanged(path: Location, target: StructType) -> bool:
    """Whether the table at `path` (or none) has every column and type of `target` already:
    most runs' answer, from the log's schema without listing the table's files."""
    table = open_table(path)
    if table is None:
        return True
    current = spark_schema_of(table)
    finished(path, table)
    return evolved_schema(current, target) == current


def _rewrite_widened(
    spark: SparkSession, snapshot: Snapshot, new_schema: StructType, run_id: str
) -> bool:
    """Rewrite the whole table with its values cast to `new_schema`, in one overwrite commit
    that also sets it; False when another commit landed first."""
    known = {f.name for f in snapshot.schema.fields} if snapshot.schema is not None else set()
    rows = read_snapshot(spark, snapshot).select(
        *[
            (F.col(f.name) if f.name in known else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in new_schema.fields
        ]
    )
    written = write_files(rows, snapshot.path, snapshot.partition_columns, run_id)
    try:
        committing.commit(
            snapshot,
            written,
            "overwrite",
            step="evolve_schema",
            run_id=run_id,
            schema=new_schema,
            exclusive=True,
        )
    except CommitFailedError:
        written.delete()
        return False
    return True
