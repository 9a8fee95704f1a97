"""change_format snapshot: each interval lands a full extract; hashes turn it into changes.

Seed 004's pattern in Spark SQL (no UDF): every extract row gets an MD5 of its key columns
(`_cdc_key_hash`) and of its compared non-key columns (`_cdc_row_hash`, without the
`compare_exclude` columns). Joined on the key hash with the hashes of the final table, a row is an
insert (I, a new key), an update (U, another row hash) or unchanged (N, not staged); a key of the
final table missing from the extract is a delete (D, key only). The derived changes are staged like
any other change set, with the extract's hour folder as sequence (`_cdc_snapshot_at`), so
overwrite-final, history and maintenance treat them as they treat every change.

An extract is compared with the final table, so extracts apply in order: a stage refuses an
extract older than one already staged, or while the previous extract is staged but not applied.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from cdc_pipeline.columns import KEY_HASH, ROW_HASH, SNAPSHOT_AT
from cdc_pipeline.config import TableConfig
from cdc_pipeline.errors import InputError
from cdc_pipeline.intervals import Interval, hour_folder
from spark_jobs import delta
from spark_jobs.rules.transforms import BATCH, FILE, FLAG, ROW, compared_columns, hash_of, persisted
from spark_jobs.runtime.context import StepContext

HASH_COLUMNS = (KEY_HASH, ROW_HASH)
# The `_cdc_file` of derived deletes: they come from the final table, not from a landed file.
DELETES_FILE = "_cdc_snapshot_deletes"
OPERATIONS = {"I": "inserted", "U": "updated", "D": "deleted", "N": "unchanged"}


def row_hash_columns(table: TableConfig, data_columns: Sequence[str]) -> list[str]:
    """Non-key columns whose change is a change: all but compare_exclude and `_cdc_` columns."""
    return compared_columns(data_columns, {*table.keys, *table.compare_exclude})


def snapshot_time(batch: Column) -> Column:
    """The hour folder of a batch id (YYYY-MM-DDTHH) as a UTC timestamp: the extract's sequence."""
    return F.to_timestamp(batch, "yyyy-MM-dd'T'HH")


def with_hashes(typed: DataFrame, table: TableConfig, data_columns: Sequence[str]) -> DataFrame:
    """Typed extract rows plus their key hash and row hash."""
    return typed.withColumn(KEY_HASH, hash_of(table.keys)).withColumn(
        ROW_HASH, hash_of(row_hash_columns(table, data_columns))
    )


def check_order(
    context: StepContext,
    interval: Interval,
    pending_batches: Sequence[str],
    ledger: set[str],
    staging: delta.Snapshot,
) -> str:
    """The one extract batch the interval stages; refuses extracts that would apply out of order."""
    table = context.table
    batches = sorted(set(pending_batches))
    where = f"table {table.name}: {interval}"
    if len(batches) > 1:
        raise InputError(
            f"{where}: change_format snapshot takes one full extract per run, but the interval "
            f"holds extracts in {', '.join(hour_folder(b) for b in batches)}; run one interval per "
            "extract, in order"
        )
    batch = batches[0]
    later = sorted(b for b in ledger if b > batch)
    if later:
        raise InputError(
            f"{where}: the extract in {hour_folder(batch)} is older than the extract in "
            f"{hour_folder(later[-1])} already staged; extracts apply in order (an older full "
            "extract would undo the newer one's changes)"
        )
    earlier = sorted(b for b in ledger if b < batch)
    if earlier and not _applied(context, staging, earlier[-1]):
        raise InputError(
            f"{where}: the previous extract in {hour_folder(earlier[-1])} is staged but not applied "
            "yet; run overwrite-final for its interval first"
        )
    return batch


def _applied(context: StepContext, staging: delta.Snapshot, batch: str) -> bool:
    """True when the staged changes of extract `batch` are in final (or it staged none)."""
    spark, paths = context.spark, context.paths
    if not staging.files_in([batch]):
        return True  # no change staged (every row unchanged), or compacted away once applied
    for path in (paths.final, paths.tombstones):
        snapshot = delta.load_snapshot(path)
        if snapshot.exists and snapshot.files:
            rows = delta.read_snapshot(spark, snapshot, columns=[BATCH])
            if rows.filter(F.col(BATCH) == batch).limit(1).count() > 0:
                return True
    return False


def derive_changes(
    context: StepContext,
    extract: DataFrame,
    held: DataFrame,
    batch: str,
    columns: Sequence[str],
) -> tuple[DataFrame, dict[str, int]]:
    """The extract's I/U rows and the final table's missing keys as D rows (staging `columns`).

    `held` holds the key hashes of extract rows sent to quarantine: their keys are still in the
    source, so they are not deleted (nor changed) until a good row of theirs arrives.

    Returns the changes (persisted; the caller unpersists) and the count of each operation.
    """
    spark, table, paths = context.spark, context.table, context.paths
    keys = list(table.keys)
    final = delta.load_snapshot(paths.final)
    known = StructType([StructField("__key", extract.schema[KEY_HASH].dataType)])
    known.add(StructField("__old", extract.schema[ROW_HASH].dataType))
    for key in keys:
        known.add(extract.schema[key])
    if final.exists and final.files and final.schema is not None:
        stored = set(final.schema.fieldNames())
        rows = delta.read_snapshot(
            spark, final, columns=[*keys, *([ROW_HASH] if ROW_HASH in stored else [])]
        )
        old = F.col(ROW_HASH) if ROW_HASH in stored else F.lit(None).cast("string")
        current = rows.select(hash_of(keys).alias("__key"), old.alias("__old"), *keys)
    else:
        current = delta.local_frame(spark, [], known)
    compared = (
        extract.drop(FLAG)
        .join(current.select("__key", "__old"), extract[KEY_HASH] == F.col("__key"), "left")
        .withColumn(
            FLAG,
            F.when(F.col("__key").isNull(), F.lit("I"))
            .when(~F.col("__old").eqNullSafe(F.col(ROW_HASH)), F.lit("U"))
            .otherwise(F.lit("N")),
        )
    )
    present = extract.select(F.col(KEY_HASH).alias("__key")).unionByName(
        held.select(F.col(KEY_HASH).alias("__key"))
    )
    deleted = current.join(present, on="__key", how="left_anti")
    types = {f.name: f.dataType for f in extract.schema.fields}
    delete_values = {
        FLAG: F.lit("D"),
        SNAPSHOT_AT: snapshot_time(F.lit(batch)),
        KEY_HASH: F.col("__key"),
        BATCH: F.lit(batch),
        FILE: F.lit(DELETES_FILE),
        ROW: F.lit(0),
    }
    deletes = deleted.select(
        *[
            (F.col(c) if c in keys else delete_values.get(c, F.lit(None))).cast(types[c]).alias(c)
            for c in columns
        ]
    )
    changes = persisted(compared.filter(F.col(FLAG) != "N").select(*columns).unionByName(deletes))
    by_flag = {
        r[FLAG]: int(r["count"])
        for r in changes.groupBy(FLAG).count().collect()  # metadata: one row per operation
    }
    by_flag["N"] = extract.count() - by_flag.get("I", 0) - by_flag.get("U", 0)
    counts = {name: by_flag.get(op, 0) for op, name in OPERATIONS.items()}
    return changes, counts
