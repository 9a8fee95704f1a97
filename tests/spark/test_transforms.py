"""The pure DataFrame transforms on small inputs, row for row."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DecimalType,
    LongType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from cdc_pipeline.config import TableConfig
from spark_jobs import delta
from spark_jobs.rules.transforms import (
    latest_arrival_per_key_and_sequence,
    latest_change_per_key,
    quarantined_changes,
    type_changes,
)
from spark_jobs.runtime.session import new_observation, observed_metrics

pytestmark = pytest.mark.spark

ARRIVAL = ["_cdc_batch", "_cdc_file", "_cdc_row"]


def rows(df, columns):  # type: ignore[no-untyped-def]
    return sorted((tuple(r[c] for c in columns) for r in df.collect()), key=repr)


def test_latest_change_per_key_orders_by_sequence_then_arrival(spark) -> None:
    changes = spark.createDataFrame(
        [
            (1, 10, "U", "a", "2024-01-01T00", "a.csv", 0),
            (1, 20, "U", "b", "2024-01-01T00", "a.csv", 1),
            (1, 20, "U", "c", "2024-01-01T00", "a.csv", 2),  # tie: later row wins
            (2, 5, "U", "x", "2024-01-01T01", "a.csv", 0),
            (
                2,
                5,
                "D",
                None,
                "2024-01-01T00",
                "z.csv",
                9,
            ),  # tie: later folder wins over later file
            (3, 1, "I", "p", "2024-01-01T00", "a.csv", 3),
            (3, 1, "D", None, "2024-01-01T00", "b.csv", 0),  # tie: later file name wins
        ],
        "ID int, SEQ int, _cdc_flag string, V string, _cdc_batch string, _cdc_file string, _cdc_row long",
    )
    winners = latest_change_per_key(changes, ["ID"], ["SEQ"])
    assert rows(winners, ["ID", "_cdc_flag", "V"]) == [(1, "U", "c"), (2, "U", "x"), (3, "D", None)]


def test_one_row_per_key_and_sequence_latest_arrival(spark) -> None:
    events = spark.createDataFrame(
        [
            ("a", 1, "first", "h0", "f", 0),
            ("a", 1, "resent", "h1", "f", 0),
            ("a", 2, "other", "h0", "f", 1),
        ],
        "K string, SEQ int, V string, _cdc_batch string, _cdc_file string, _cdc_row long",
    )
    kept = latest_arrival_per_key_and_sequence(events, ["K"], ["SEQ"])
    assert rows(kept, ["K", "SEQ", "V"]) == [("a", 1, "resent"), ("a", 2, "other")]


def test_type_changes_types_checks_and_quarantines(spark) -> None:
    table = TableConfig.model_validate(
        {
            "name": "t",
            "file_format": "csv",
            "columns": {"ID": "bigint", "AMOUNT": "decimal(5,2)", "TS": "timestamp"},
            "keys": ["ID"],
            "sequence_by": ["TS"],
            "partition_expression": "year(TS)",
            "partition_column": "Y",
        }
    )
    raw = spark.createDataFrame(
        [
            ("i", "1", "1.50", "2024-03-01 10:00:00", "h", "f", 0),
            ("U", "2", "12345.678", "2024-03-01 10:00:00", "h", "f", 1),
            ("D", "3", "junk", "2024-03-01 10:00:00", "h", "f", 2),
        ],
        "FLAG string, ID string, AMOUNT string, TS string, _cdc_batch string, _cdc_file string, _cdc_row long",
    )
    typed = type_changes(raw, table, dict(table.columns or {}), flag_present=True)
    good = typed.filter("_cdc_reason IS NULL")
    assert [
        (r["ID"], str(r["AMOUNT"]) if r["AMOUNT"] is not None else None, r["Y"], r["_cdc_flag"])
        for r in good.orderBy("ID").collect()
    ] == [(1, "1.50", 2024, "I"), (3, None, 2024, "D")]
    bad = quarantined_changes(typed, table, dict(table.columns or {}))
    assert rows(bad, ["ID", "AMOUNT", "FLAG", "_cdc_reason"]) == [
        (
            "2",
            "12345.678",
            "U",
            "unparsable value in AMOUNT: '12345.678' is not a valid decimal(5,2)",
        )
    ]


def test_dates_and_timestamps_outside_years_1_to_9999_and_far_ahead_are_quarantined(
    spark,
) -> None:
    from datetime import UTC, datetime

    from spark_jobs.rules.transforms import REASON, quarantine_reason

    row = {
        "name": "t",
        "file_format": "csv",
        "columns": {"ID": "bigint", "DAY": "date", "TS": "timestamp"},
        "keys": ["ID"],
        "sequence_by": ["DAY"],
        "partition_expression": "date_add(DAY, 1)",
        "partition_column": "P",
    }
    raw = spark.createDataFrame(
        [
            ("I", "1", "2024-01-02", "2024-01-01 00:00:00", "h", "f", 0),
            ("I", "2", "2024-01-03", "2024-01-01 00:00:00", "h", "f", 1),
            ("I", "3", "9999-12-31", "2024-01-01 00:00:00", "h", "f", 2),
            ("D", "4", "2024-01-01", "0000-12-31 23:59:59", "h", "f", 3),
        ],
        "FLAG string, ID string, DAY string, TS string, _cdc_batch string, _cdc_file string, _cdc_row long",
    )
    # The partition value of 9999-12-31 is a day past what Python (and so the driver) holds.
    unbounded = TableConfig.model_validate({**row, "max_sequence_ahead": None})
    typed = type_changes(raw, unbounded, dict(unbounded.columns or {}), flag_present=True)
    # Only the reasons are collected: the typed rows hold that value, which Python cannot.
    assert rows(typed.select("ID", REASON), ["ID", REASON]) == [
        (1, None),
        (2, None),
        (
            3,
            "value out of range in P: '+10000-01-01' is outside the years 0001 to 9999 "
            "(date_add(DAY, 1))",
        ),
        (4, "value out of range in TS: '0000-12-31 23:59:59' is outside the years 0001 to 9999"),
    ]
    # 36 hours after 2024-01-01T00:00Z: 2024-01-02 (midnight) is within, 2024-01-03 is not.
    bounded = TableConfig.model_validate({**row, "max_sequence_ahead": "36h"})
    now = datetime(2024, 1, 1, tzinfo=UTC)
    reasons = typed.withColumn(
        REASON, quarantine_reason(bounded, dict(bounded.columns or {}), typed.columns, "date", now)
    )
    ahead = "' is more than max_sequence_ahead 36h after the stage run at 2024-01-01 00:00:00 UTC"
    assert rows(reasons.select("ID", REASON), ["ID", REASON]) == [
        (1, None),
        (2, "sequence value too far ahead in DAY: '2024-01-03" + ahead),
        (3, "sequence value too far ahead in DAY: '9999-12-31" + ahead),
        (4, "value out of range in TS: '0000-12-31 23:59:59' is outside the years 0001 to 9999"),
    ]


@pytest.mark.both_modes
def test_observed_metrics_come_with_the_write_that_reads_the_rows(spark, tmp_path) -> None:
    # overwrite-final's verdict is counted by its write: none before, exact after.
    observation = new_observation(spark, "test_observed_metrics")
    frame = spark.range(5).observe(
        observation, F.count(F.lit(1)).alias("n"), F.sum("id").alias("total")
    )
    assert observed_metrics(observation) is None
    frame.filter(F.col("id") > 2).repartition(2).write.parquet(str(tmp_path / "out"))
    assert observed_metrics(observation) == {"n": 5, "total": 10}


@pytest.mark.both_modes
def test_step_sessions_do_not_capture_a_call_site_per_column_call(spark) -> None:
    # PySpark's call-site capture costs four JVM round trips per column function in classic
    # mode: the steps' sessions (and the Connect server the launcher starts) turn it off.
    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"


@pytest.mark.both_modes
def test_step_timing_counts_the_requests_sent_to_spark(spark) -> None:
    # The before/after tool's load-proof figure: a column list is one request or more (a py4j
    # call, a Connect AnalyzePlan), and nothing is counted once the block is left.
    from cdc_tools.bench.step_timing import driver_round_trips
    from spark_jobs.runtime.session import is_connect

    frame = spark.range(3)
    with driver_round_trips(connect=is_connect(spark)) as counted:
        assert frame.filter(F.col("id") > 0).columns == ["id"]
    assert counted[0] >= 1
    sent = counted[0]
    assert frame.columns == ["id"]
    assert counted[0] == sent


@pytest.mark.parametrize("empty", [False, True])
def test_a_local_frame_has_exactly_the_types_asked_for(spark, empty: bool) -> None:
    """Keys and partition values reach the joins as local frames: a timestamp_ntz key must stay
    timestamp_ntz (Spark infers a naive Arrow timestamp as a session-zone one), and a column
    whose Arrow type differs is cast."""
    schema = StructType(
        [
            StructField("K", TimestampNTZType(), False),
            StructField("T", TimestampType()),
            StructField("D", DecimalType(10, 2)),
            StructField("N", LongType()),
        ]
    )
    rows = (
        []
        if empty
        else [(datetime(2024, 1, 2, 3, 4, 5), datetime(2024, 1, 2, 3, 4, 5), Decimal("1.50"), 7)]
    )
    frame = delta.local_frame(spark, rows, schema)
    wanted = [(f.name, f.dataType) for f in schema.fields]
    assert [(f.name, f.dataType) for f in frame.schema.fields] == wanted
    assert [tuple(r) for r in frame.collect()] == rows
    # An Arrow table with other types (int32, a string decimal) is cast to the ones asked for.
    other = pa.table({"N": pa.array([] if empty else [7], pa.int32())})
    cast = delta.local_frame(spark, other, StructType([StructField("N", LongType())]))
    assert cast.schema.fields[0].dataType == LongType()
    assert [tuple(r) for r in cast.collect()] == ([] if empty else [(7,)])
