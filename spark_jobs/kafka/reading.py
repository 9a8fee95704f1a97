"""A Kafka run's messages as Spark reads them: the planned ranges, shaped like landed JSON lines
(`value` and the arrival columns) for the change parsers.

Two readers, one result. A run of up to DRIVER_READ_LIMIT messages (the 15-minute run of most
tables) is read on the driver by the Python client and handed to Spark as rows: Spark's Kafka
source has about a second of fixed cost (a consumer per task, offset checks, a job: 1.73 s to
count 300 messages against 0.52 s read on the driver and handed over) that no small run needs.
Larger runs are read by Spark's source, in parallel on the executors. Both keep a message's
bytes as they are (the parsers quarantine a value that is not UTF-8), fail on offsets deleted
before the read, and pass over offsets without a message (compaction, transaction markers);
tests/cli/test_kafka_broker.py holds them equal.

Arrival order: `_cdc_batch` is the run's hour, `_cdc_file` the range's name (partition, then
start offset) and `_cdc_row` the message's offset, so within a partition a later message always
arrives later. Across partitions Kafka promises no order: a key's changes are ordered by their
own sequence (sequence_by: the LSN, ts_ms or a sequence column), never by offsets. The message
key is not read: the key columns come from the value.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_pipeline.kafka_settings import spark_options
from spark_jobs.formats.json_lines import LINE
from spark_jobs.kafka import broker
from spark_jobs.kafka.offsets import KafkaPlan
from spark_jobs.rules.transforms import BATCH, FILE, ROW

# Runs of up to this many offsets are read on the driver (CDC_DRIVER_READ_MESSAGES sets it;
# 0: always Spark's source). 20,000 flat changes of ~200 bytes are ~4 MB in the driver; a run
# whose values pass DRIVER_READ_BYTES (Debezium's envelopes run to kilobytes) stops reading
# there and goes to Spark's source.
DRIVER_READ_LIMIT = 20_000
DRIVER_READ_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class Messages:
    """The run's lines, and the tombstones already counted (None: the lines hold them, as the
    JSON `null` the parsers skip and count)."""

    lines: DataFrame
    tombstones: int | None


def driver_read_limit() -> int:
    """The largest run read on the driver."""
    value = os.environ.get("CDC_DRIVER_READ_MESSAGES", "").strip()
    return int(value) if value.isdigit() else DRIVER_READ_LIMIT


def read_messages(spark: SparkSession, properties: Mapping[str, str], plan: KafkaPlan) -> Messages:
    """The planned ranges' messages as lines, by the reader that suits their number."""
    if not plan.to_read:
        return Messages(no_messages(spark), 0)
    if sum(r.messages for r in plan.to_read) <= driver_read_limit():
        read = _driver_read(spark, properties, plan)
        if read is not None:
            return read
    return Messages(_spark_read(spark, properties, plan), None)


def _driver_read(
    spark: SparkSession, properties: Mapping[str, str], plan: KafkaPlan
) -> Messages | None:
    """The ranges read by the Python client, handed to Spark as rows (Arrow): a value's bytes
    cast to text in Spark, as the source's rows are. None: more than DRIVER_READ_BYTES."""
    import pyarrow as pa

    fetched = broker.read_ranges(
        properties,
        plan.topic,
        {r.partition: (r.start, r.end) for r in plan.to_read},
        max_bytes=DRIVER_READ_BYTES,
    )
    if fetched is None:
        return None
    if not fetched.values:  # tombstones, markers or compacted offsets only
        return Messages(no_messages(spark), fetched.tombstones)
    files = {r.partition: r.file for r in plan.to_read}
    rows = pa.table(
        {
            "value": pa.array(fetched.values, pa.binary()),
            FILE: pa.array([files[p] for p in fetched.partitions], pa.string()),
            ROW: pa.array(fetched.offsets, pa.int64()),
        }
    )
    # One Spark partition, as a landed file's run reads: the rows would otherwise be sliced by
    # the default parallelism, and every slice is a staged file the overwrite reads again
    # (two files a run on 2 cores). At most DRIVER_READ_LIMIT messages: one task parses them.
    frame = spark.createDataFrame(rows).coalesce(1)
    lines = frame.select(
        F.col("value").cast("string").alias(LINE),
        F.lit(plan.batch).alias(BATCH),
        F.col(FILE),
        F.col(ROW),
    )
    return Messages(lines, fetched.tombstones)


def _range_files(plan: KafkaPlan) -> Column:
    """`_cdc_file` of a message: its partition's range name."""
    column = F.lit(None).cast("string")
    for offset_range in plan.to_read:
        column = F.when(
            F.col("partition") == offset_range.partition, F.lit(offset_range.file)
        ).otherwise(column)
    return column


def _spark_read(spark: SparkSession, properties: Mapping[str, str], plan: KafkaPlan) -> DataFrame:
    """The ranges read by Spark's Kafka source (one bounded batch read); a null value, a
    tombstone, as the JSON `null` line."""
    ranges = plan.to_read
    topic = plan.topic
    frame = (
        spark.read.format("kafka")
        .options(**spark_options(properties))
        .option("assign", json.dumps({topic: [r.partition for r in ranges]}))
        .option("startingOffsets", json.dumps({topic: {str(r.partition): r.start for r in ranges}}))
        .option("endingOffsets", json.dumps({topic: {str(r.partition): r.end for r in ranges}}))
        # Offsets deleted between the plan and the read fail the read (never a silent gap).
        .option("failOnDataLoss", "true")
        .option("includeHeaders", "false")
        .load()
    )
    return frame.select(
        F.coalesce(F.col("value").cast("string"), F.lit("null")).alias(LINE),
        F.lit(plan.batch).alias(BATCH),
        _range_files(plan).alias(FILE),
        F.col("offset").alias(ROW),
    )


def no_messages(spark: SparkSession) -> DataFrame:
    """The lines of a run that reads nothing (it records where its partitions start)."""
    return spark.createDataFrame([], f"{LINE} string, {BATCH} string, {FILE} string, {ROW} bigint")
