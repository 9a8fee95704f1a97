"""A Kafka run's messages as Spark reads them: one bounded batch read of the planned ranges,
shaped like landed JSON lines (`value` and the arrival columns) for the change parsers.

Arrival order: `_cdc_batch` is the run's hour, `_cdc_file` the range's name (partition, then
start offset) and `_cdc_row` the message's offset, so within a partition a later message always
arrives later. Across partitions Kafka promises no order: a key's changes are ordered by their
own sequence (sequence_by: the LSN, ts_ms or a sequence column), never by offsets. The message
key is not read: the key columns come from the value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_pipeline.kafka_settings import spark_options
from spark_jobs.formats.json_lines import LINE
from spark_jobs.kafka.offsets import KafkaPlan
from spark_jobs.rules.transforms import BATCH, FILE, ROW


def _range_files(plan: KafkaPlan) -> Column:
    """`_cdc_file` of a message: its partition's range name."""
    column = F.lit(None).cast("string")
    for offset_range in plan.to_read:
        column = F.when(
            F.col("partition") == offset_range.partition, F.lit(offset_range.file)
        ).otherwise(column)
    return column


def read_messages(spark: SparkSession, properties: Mapping[str, str], plan: KafkaPlan) -> DataFrame:
    """The planned ranges' messages as lines: `value` (the message's value as text; a null
    value, a tombstone, as the JSON `null` the parsers skip and count) and the arrival columns.

    A message's bytes are kept as they are: the parsers quarantine a value that is not UTF-8."""
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
