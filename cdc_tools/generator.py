"""Synthetic change sets (seed 004's spirit): keys, updates, deletes, inserts, duplicates, late events.

Everything is a deterministic function of (seed, hour, key) computed in Spark SQL, so the same
spec writes the same rows again, and large volumes cost no driver memory.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

ORDERS_COLUMNS = {
    "ORDER_ID": "bigint",
    "LINE_NO": "int",
    "CUSTOMER_ID": "bigint",
    "CREATE_DATE": "string",
    "AMOUNT": "decimal(12,2)",
    "STATUS": "string",
    "CDC_TIMESTAMP": "timestamp",
}
STATUSES = ["NEW", "PAID", "SHIPPED", "RETURNED", "CLOSED"]


@dataclass(frozen=True)
class ChangeSpec:
    """Shape of a synthetic orders change stream; percentages are of the live keys per hour."""

    keys: int = 1000
    lines_per_order: int = 2
    update_pct: float = 10.0
    delete_pct: float = 2.0
    insert_pct: float = 5.0
    duplicate_pct: float = 0.0
    late_pct: float = 0.0
    move_pct: float = 10.0
    key_only_deletes: bool = True
    files_per_hour: int = 2
    first_year: int = 2019
    years: int = 5
    seed: int = 7


def _chance(spec: ChangeSpec, kind: str, hour: int | Column, pct: float) -> Column:
    """True for a deterministic `pct` percent of (kind, hour, id)."""
    draw = F.pmod(
        F.xxhash64(
            F.lit(spec.seed),
            F.lit(kind),
            F.lit(hour) if isinstance(hour, int) else hour,
            F.col("id"),
        ),
        F.lit(10000),
    )
    return draw < F.lit(round(pct * 100))


def _hour_changes(spark: SparkSession, spec: ChangeSpec, hour: int, start: datetime) -> DataFrame:
    """The changes that happen in hour `hour` (0 = initial load of every key)."""
    inserts_per_hour = round(spec.keys * spec.insert_pct / 100)
    born_before = spec.keys + max(0, hour - 1) * inserts_per_hour
    born_now = spec.keys if hour == 0 else born_before + inserts_per_hour
    ids = spark.range(0, born_now)
    born_hour = F.when(F.col("id") < spec.keys, F.lit(0)).otherwise(
        F.floor((F.col("id") - spec.keys) / max(inserts_per_hour, 1)) + 1
    )
    # A key is dead once a delete hit it in an hour after its birth (it never comes back).
    dead = F.lit(False)
    for j in range(1, hour):
        dead = dead | (_chance(spec, "d", j, spec.delete_pct) & (born_hour < j))
    is_new = F.col("id") >= born_before if hour > 0 else F.lit(True)
    delete = ~is_new & _chance(spec, "d", hour, spec.delete_pct)
    update = ~is_new & ~delete & _chance(spec, "u", hour, spec.update_pct)
    flag = F.when(is_new, "I").when(delete, "D").when(update, "U")
    # A key moves to the next year's partition (once) with an update drawn for a move.
    moved = F.lit(False)
    for j in range(1, hour + 1):
        updated_then = (
            _chance(spec, "u", j, spec.update_pct)
            & ~_chance(spec, "d", j, spec.delete_pct)
            & (born_hour < j)
        )
        moved = moved | (updated_then & _chance(spec, "m", j, spec.move_pct))
    base_year = F.pmod(F.xxhash64(F.lit(spec.seed), F.lit("y"), F.col("id")), F.lit(spec.years))
    year = F.lit(spec.first_year) + F.pmod(
        base_year + F.when(moved, 1).otherwise(0), F.lit(spec.years)
    )
    second = F.pmod(F.xxhash64(F.lit(spec.seed), F.lit("t"), F.lit(hour), F.col("id")), F.lit(3600))
    hour_start = F.lit(start + timedelta(hours=hour)).cast("timestamp")
    amount = (
        F.pmod(F.xxhash64(F.lit(spec.seed), F.lit("a"), F.lit(hour), F.col("id")), F.lit(1000000))
        / 100
    )
    status = F.element_at(
        F.array(*[F.lit(s) for s in STATUSES]),
        (
            F.pmod(
                F.xxhash64(F.lit(spec.seed), F.lit("s"), F.lit(hour), F.col("id")),
                F.lit(len(STATUSES)),
            )
            + 1
        ).cast("int"),
    )
    key_only = (F.col("FLAG") == "D") & F.lit(spec.key_only_deletes)
    rows = ids.filter(~dead & flag.isNotNull()).select(
        "id",
        flag.alias("FLAG"),
        (F.col("id") / spec.lines_per_order).cast("bigint").alias("ORDER_ID"),
        F.pmod(F.col("id"), F.lit(spec.lines_per_order)).cast("int").alias("LINE_NO"),
        (F.pmod(F.xxhash64(F.lit(spec.seed), F.lit("c"), F.col("id")), F.lit(100000))).alias(
            "CUSTOMER_ID"
        ),
        F.format_string(
            "%02d/%02d/%04d",
            F.pmod(F.col("id"), F.lit(12)) + 1,
            F.pmod(F.col("id"), F.lit(28)) + 1,
            year,
        ).alias("CREATE_DATE"),
        amount.cast("decimal(12,2)").alias("AMOUNT"),
        status.alias("STATUS"),
        (hour_start + F.make_interval(secs=second.cast("int"))).alias("CDC_TIMESTAMP"),
    )
    rows = rows.select(
        "id",
        "FLAG",
        "ORDER_ID",
        "LINE_NO",
        *[
            F.when(key_only, F.lit(None)).otherwise(F.col(c)).alias(c)
            for c in ("CUSTOMER_ID", "CREATE_DATE", "AMOUNT", "STATUS")
        ],
        "CDC_TIMESTAMP",
    )
    late = _chance(spec, "late", hour, spec.late_pct) & F.lit(hour > 0)
    rows = rows.withColumn("landing_hour", F.when(late, hour + 1).otherwise(hour))
    duplicates = rows.filter(_chance(spec, "dup", hour, spec.duplicate_pct))
    return rows.unionByName(duplicates)


def generate_orders(
    spark: SparkSession,
    spec: ChangeSpec,
    landing_table_dir: Path,
    start: datetime,
    hours: int,
    file_format: str,
) -> int:
    """Write `hours` hours of orders changes from `start` into the table's landing folder; rows written."""
    frames = [_hour_changes(spark, spec, h, start) for h in range(hours)]
    changes = frames[0]
    for frame in frames[1:]:
        changes = changes.unionByName(frame)
    changes = changes.filter(F.col("landing_hour") < hours)
    columns = ["FLAG", *ORDERS_COLUMNS]
    return write_landing(
        spark,
        changes,
        columns,
        landing_table_dir,
        start=start,
        file_format=file_format,
        files_per_hour=spec.files_per_hour,
    )


def generate_events(
    spark: SparkSession,
    landing_table_dir: Path,
    start: datetime,
    hours: int,
    *,
    per_hour: int,
    duplicate_pct: float = 5.0,
    seed: int = 11,
    file_format: str = "json",
) -> int:
    """Insert-only device events: `per_hour` events an hour, some re-sent (exact duplicates)."""
    spec = ChangeSpec(seed=seed)
    ids = spark.range(0, hours * per_hour).withColumn("hour", (F.col("id") / per_hour).cast("int"))
    second = F.pmod(F.xxhash64(F.lit(seed), F.lit("t"), F.col("id")), F.lit(3600))
    events = ids.select(
        "id",
        F.lit("I").alias("FLAG"),
        F.sha2(F.concat_ws("-", F.lit(seed), F.col("id").cast("string")), 256)
        .substr(1, 16)
        .alias("EVENT_ID"),
        F.pmod(F.xxhash64(F.lit(seed), F.lit("dev"), F.col("id")), F.lit(50)).alias("DEVICE_ID"),
        (
            F.lit(start).cast("timestamp")
            + F.make_interval(hours=F.col("hour"), secs=second.cast("int"))
        ).alias("EVENT_TIME"),
        F.element_at(
            F.array(F.lit("click"), F.lit("view"), F.lit("buy")),
            (F.pmod(F.col("id"), F.lit(3)) + 1).cast("int"),
        ).alias("EVENT_TYPE"),
        F.col("hour").alias("landing_hour"),
    )
    events = events.unionByName(events.filter(_chance(spec, "dup", 0, duplicate_pct)))
    columns = ["FLAG", "EVENT_ID", "DEVICE_ID", "EVENT_TIME", "EVENT_TYPE"]
    return write_landing(
        spark,
        events,
        columns,
        landing_table_dir,
        start=start,
        file_format=file_format,
        files_per_hour=1,
    )


def write_landing(
    spark: SparkSession,
    rows: DataFrame,
    columns: list[str],
    table_dir: Path,
    *,
    start: datetime,
    file_format: str,
    files_per_hour: int,
) -> int:
    """Write rows into dt=/hr= folders under deterministic names part-00000.<ext>, replacing old ones."""
    hour_start = F.lit(start).cast("timestamp") + F.make_interval(hours=F.col("landing_hour"))
    out = (
        rows.select(
            *columns,
            F.date_format(hour_start, "yyyy-MM-dd").alias("dt"),
            F.date_format(hour_start, "HH").alias("hr"),
            F.col("id").alias("__order"),
        )
        .repartition(files_per_hour, "dt", "hr", "__order")
        .sortWithinPartitions("dt", "hr", "__order")
        .drop("__order")
    )
    tmp = table_dir.parent / f".{table_dir.name}.generating"
    shutil.rmtree(tmp, ignore_errors=True)
    writer = out.write.partitionBy("dt", "hr").mode("overwrite")
    if file_format == "csv":
        writer.option("header", "true").option("timestampFormat", "yyyy-MM-dd HH:mm:ss").csv(
            str(tmp)
        )
    elif file_format == "json":
        writer.option("timestampFormat", "yyyy-MM-dd'T'HH:mm:ss'Z'").json(str(tmp))
    else:
        writer.parquet(str(tmp))
    extension = {"csv": "csv", "json": "json", "parquet": "parquet"}[file_format]
    written = 0
    for folder in sorted({p.parent for p in tmp.rglob(f"part-*.{extension}")}):
        target = table_dir / folder.relative_to(tmp)
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True, exist_ok=True)
        for index, source in enumerate(sorted(folder.glob(f"part-*.{extension}"))):
            shutil.move(str(source), target / f"part-{index:05d}.{extension}")
            written += 1
    shutil.rmtree(tmp, ignore_errors=True)
    return written
