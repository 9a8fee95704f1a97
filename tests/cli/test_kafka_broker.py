"""The tests' real Kafka broker (tests/kafka.py) and Spark's Kafka source (jars/) read it exactly."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CONNECT
from tests.kafka import KafkaBroker

pytestmark = [pytest.mark.slow]


@pytest.fixture
def session(request: pytest.FixtureRequest, spark_mode: str) -> Iterator[Any]:
    """A session from the project's builder (spark_jobs/runtime/session.py): the run's classic one,
    or a new Connect session of the run's server (CDC_SPARK_REMOTE, set by spark_mode)."""
    if spark_mode != CONNECT:
        yield request.getfixturevalue("spark_classic")  # build_classic_session's
        return
    from spark_jobs.runtime.session import build_spark_session

    spark = build_spark_session("kafka-broker-test")
    try:
        yield spark
    finally:
        spark.stop()


def offsets_json(topic: str, offsets: dict[int, int]) -> str:
    """Spark's per-partition offsets option: {"topic": {"0": 5, ...}}."""
    return json.dumps({topic: {str(p): o for p, o in sorted(offsets.items())}})


def read_kafka(
    spark: Any, broker: KafkaBroker, topic: str, start: dict[int, int], end: dict[int, int]
) -> list[tuple[int, int, str | None, str | None]]:
    """A Spark batch read of [start, end) of each partition: (partition, offset, key, value)."""
    frame = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap_servers)
        .option("assign", json.dumps({topic: sorted(end)}))
        .option("startingOffsets", offsets_json(topic, start))
        .option("endingOffsets", offsets_json(topic, end))
        .load()
        .selectExpr(
            "partition", "offset", "CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value"
        )
    )
    return sorted(tuple(row) for row in frame.collect())


@pytest.mark.cli
@pytest.mark.both_modes
def test_a_spark_batch_read_returns_exactly_the_offsets_asked_for(
    kafka_broker: KafkaBroker, session: Any, spark_mode: str
) -> None:
    print(f"Kafka broker started in {kafka_broker.started_in:.1f} s")
    topic = f"orders_{spark_mode}"
    kafka_broker.create_topic(topic, partitions=3)
    messages = [
        ('{"id": 1}', '{"op": "c", "id": 1}', 0),
        ('{"id": 2}', '{"op": "c", "id": 2}', 1),
        ('{"id": 3}', '{"op": "c", "id": 3}', 2),
        ('{"id": 1}', '{"op": "u", "id": 1}', 0),
        ('{"id": 3}', '{"op": "d", "id": 3}', 2),
        ('{"id": 3}', None, 2),  # the delete's tombstone: a null value
        ('{"id": 4}', '{"op": "c", "id": 4}', 0),
    ]
    positions = kafka_broker.produce(topic, messages)
    assert positions == [(0, 0), (1, 0), (2, 0), (0, 1), (2, 1), (2, 2), (0, 2)]
    assert kafka_broker.earliest_offsets(topic) == {0: 0, 1: 0, 2: 0}
    end = kafka_broker.end_offsets(topic)
    assert end == {0: 3, 1: 1, 2: 3}

    everything = read_kafka(session, kafka_broker, topic, {0: 0, 1: 0, 2: 0}, end)
    expected = sorted(
        (partition, offset, key, value)
        for (key, value, _), (partition, offset) in zip(messages, positions, strict=True)
    )
    assert everything == expected
    assert (2, 2, '{"id": 3}', None) in everything  # the tombstone, its value null

    # A bounded range per partition: from each start up to (not including) each end; an empty
    # range (start == end) reads nothing.
    part = read_kafka(session, kafka_broker, topic, {0: 1, 1: 1, 2: 0}, {0: 2, 1: 1, 2: 2})
    assert [(p, o) for p, o, _, _ in part] == [(0, 1), (2, 0), (2, 1)]


def test_deleted_records_move_the_earliest_offset_and_a_restart_keeps_the_data(
    kafka_broker: KafkaBroker,
) -> None:
    topic = "retained"
    kafka_broker.create_topic(topic, partitions=2)
    kafka_broker.produce(topic, [(f"k{i}", f"v{i}", i % 2) for i in range(6)])
    assert kafka_broker.end_offsets(topic) == {0: 3, 1: 3}

    # Retention deleting the oldest offsets of partition 0, as a broker's log cleanup would.
    assert kafka_broker.delete_records(topic, {0: 2}) == {0: 2}
    assert kafka_broker.earliest_offsets(topic) == {0: 2, 1: 0}
    before = kafka_broker.read(topic)
    assert [(p, o) for p, o, _, _ in before] == [(0, 2), (1, 0), (1, 1), (1, 2)]
    assert before[0][2:] == (b"k4", b"v4")

    # Partitions added to a topic start empty at offset 0.
    kafka_broker.add_partitions(topic, 3)
    assert kafka_broker.partitions(topic) == [0, 1, 2]
    assert kafka_broker.end_offsets(topic) == {0: 3, 1: 3, 2: 0}

    # Stopped (by its pid) and started again on the same ports and data folder: same records,
    # same offsets, and it takes new ones after them.
    port, pid = kafka_broker.port, kafka_broker.process.pid if kafka_broker.process else None
    seconds = kafka_broker.restart()
    print(f"Kafka broker restarted in {seconds:.1f} s")
    assert kafka_broker.port == port and kafka_broker.process is not None
    assert kafka_broker.process.pid != pid
    assert kafka_broker.read(topic) == before
    assert kafka_broker.earliest_offsets(topic) == {0: 2, 1: 0, 2: 0}
    assert kafka_broker.produce(topic, [("k6", "v6", 0), ("k7", "v7", 2)]) == [(0, 3), (2, 0)]
    assert kafka_broker.end_offsets(topic) == {0: 4, 1: 3, 2: 1}


def _transactions(broker: KafkaBroker, topic: str) -> None:
    """A committed transaction of two messages into partition 0 and an aborted one of one
    message into partition 1: each leaves a control record (an offset without a message)."""
    from confluent_kafka import Producer

    producer = Producer(broker.client_config(**{"transactional.id": f"t-{uuid.uuid4().hex}"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b'{"id": 10}', partition=0)
    producer.produce(topic, b'{"id": 11}', partition=0)
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b'{"id": 12}', partition=1)
    producer.flush(30)
    producer.abort_transaction(30)


def _lines(session: Any, properties: dict[str, str], plan: Any, limit: int) -> tuple[list, Any]:
    """(partition file, offset, the line's bytes in hex) of each line, and the tombstones the
    read counted, by the reader a run of that size gets under `limit`."""
    from pyspark.sql import functions as F

    from spark_jobs.kafka.reading import read_messages

    os.environ["CDC_DRIVER_READ_MESSAGES"] = str(limit)
    try:
        messages = read_messages(session, properties, plan)
    finally:
        del os.environ["CDC_DRIVER_READ_MESSAGES"]
    rows = messages.lines.select(
        "_cdc_batch", "_cdc_file", "_cdc_row", F.hex(F.col("value").cast("binary"))
    ).collect()
    return sorted(tuple(r) for r in rows), messages.tombstones


@pytest.mark.cli
@pytest.mark.both_modes
def test_the_driver_read_and_spark_s_source_read_the_same_lines(
    kafka_broker: KafkaBroker,
    session: Any,
    spark_mode: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A small run is read on the driver, a large one by Spark's source: the same lines (bytes
    that are not UTF-8 kept as they are), the same tombstones (counted on the driver, `null`
    lines from Spark), the same offsets passed over (transaction markers, an aborted
    transaction's message read, as read_uncommitted does), the same ranges' ends; offsets
    deleted before the read fail both."""
    from cdc_pipeline.errors import LostMessagesError
    from spark_jobs.kafka.offsets import KafkaPlan, OffsetRange
    from spark_jobs.kafka.reading import read_messages

    topic = f"readers_{spark_mode}_{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic, partitions=2)
    kafka_broker.produce(
        topic,
        [
            ("1", '{"id": 1}', 0),
            ("1", None, 0),  # a tombstone
            ("2", b'{"id": 2, "name": "\xff\xfe"}', 1),  # not UTF-8
            ("3", '{"id": 3, "name": "\u00e9"}', 1),
        ],
    )
    _transactions(kafka_broker, topic)
    kafka_broker.produce(topic, [("4", '{"id": 4}', 0), ("5", '{"id": 5}', 1)])
    end = kafka_broker.end_offsets(topic)
    # 0: 1, tombstone, 10, 11, marker, 4; 1: 2, 3, 12 (aborted), marker, 5
    assert end == {0: 6, 1: 5}
    properties = {"bootstrap.servers": kafka_broker.bootstrap_servers}

    def plan(ranges: dict[int, tuple[int, int]]) -> KafkaPlan:
        return KafkaPlan(
            topic=topic,
            staging=None,  # type: ignore[arg-type]  # not read by the readers
            batch="2024-01-01T00",
            ranges=[OffsetRange(partition=p, start=s, end=e) for p, (s, e) in ranges.items()],
        )

    plans = {
        "everything": plan({0: (0, 6), 1: (0, 5)}),
        # ends on a marker (0) and on the aborted message (1); starts after a tombstone
        "middle": plan({0: (2, 5), 1: (1, 3)}),
        "a marker only": plan({0: (4, 5)}),
    }
    for name, planned in plans.items():
        driver = _lines(session, properties, planned, 1_000_000)
        spark = _lines(session, properties, planned, 0)
        null = "6E756C6C"  # the line `null` Spark's read gives a tombstone
        assert driver[1] is not None and spark[1] is None, name
        assert driver[0] == [r for r in spark[0] if r[3] != null], name
        assert driver[1] == sum(1 for r in spark[0] if r[3] == null), name
    everything = _lines(session, properties, plans["everything"], 1_000_000)
    assert [(r[1][6:11], r[2]) for r in everything[0]] == [
        ("00000", 0), ("00000", 2), ("00000", 3), ("00000", 5),
        ("00001", 0), ("00001", 1), ("00001", 2), ("00001", 4),
    ]  # fmt: skip
    assert everything[1] == 1
    # A run read on the driver is written as one file, as a landed file's run is staged.
    with monkeypatch.context() as patched:
        patched.setenv("CDC_DRIVER_READ_MESSAGES", "1000000")
        lines = read_messages(session, properties, plans["everything"]).lines
        lines.write.parquet(str(tmp_path / "written"))
    assert len(list((tmp_path / "written").glob("*.parquet"))) == 1
    # Values past the driver's byte bound: the read stops and Spark's source reads the run.
    with monkeypatch.context() as patched:
        patched.setattr("spark_jobs.kafka.reading.DRIVER_READ_BYTES", 20)
        over = _lines(session, properties, plans["everything"], 1_000_000)
    assert over == _lines(session, properties, plans["everything"], 0)
    assert over[1] is None
    assert bytes.fromhex(everything[0][4][3]) == b'{"id": 2, "name": "\xff\xfe"}'

    kafka_broker.delete_records(topic, {0: 2})
    deleted = plan({0: (0, 6)})
    with pytest.raises(LostMessagesError, match=r"partition 0 offsets 0\.\.1\. Nothing was staged"):
        _lines(session, properties, deleted, 1_000_000)
    with pytest.raises(Exception, match=r"(?i)data ?loss|OffsetOutOfRange|out of range"):
        _lines(session, properties, deleted, 0)


def test_the_oldest_waiting_message_s_time_is_read_without_waiting_for_the_timeout(
    kafka_broker: KafkaBroker,
) -> None:
    """`cdc status`'s age of the oldest unstaged message: the broker's timestamp of the message
    at each given offset, read as soon as every partition answered (one consume() of the whole
    request timeout used to wait all 15 s for a batch that never filled, per table)."""
    import time
    from datetime import UTC, datetime

    from spark_jobs.kafka.broker import REQUEST_TIMEOUT, message_times

    topic = f"times_{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic, partitions=2)
    before = datetime.now(UTC).replace(microsecond=0)
    kafka_broker.produce(topic, [("a", "1", 0), ("b", "2", 0), ("c", "3", 1)])
    after = datetime.now(UTC)
    properties = {"bootstrap.servers": kafka_broker.bootstrap_servers}
    started = time.monotonic()
    found = message_times(properties, topic, {0: 1, 1: 0})
    took = time.monotonic() - started
    assert sorted(found) == [0, 1]
    assert all(before <= t <= after for t in found.values()), (before, found, after)
    assert took < REQUEST_TIMEOUT / 2, f"{took:.1f} s: it waited for the timeout"
