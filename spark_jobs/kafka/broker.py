"""What a Kafka table's topic holds, asked of the broker on the driver (metadata only).

The partitions of the topic and each one's earliest and end offsets (the watermarks), through
the Python client (librdkafka), and the messages of a small run (`read_ranges`; a large one is
read by Spark's Kafka source, `kafka.reading`).
Failures are sorted the way a retry needs: a broker that does not answer is transient
(`SourceUnavailableError`), a missing topic or refused credentials are permanent
(`ConfigError`), each one line naming the servers and the topic.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cdc_pipeline.errors import ConfigError, LostMessagesError, SourceUnavailableError
from cdc_pipeline.kafka_settings import BOOTSTRAP, librdkafka_properties

# Seconds a metadata or offset request may take before the broker counts as unreachable.
REQUEST_TIMEOUT = 15.0
# How long one consume() call waits: librdkafka returns a batch only once it is
# full or this time is up, so a long wait is paid on every small read (0.5 s: 0.50 s to read
# 300 messages; 0.02 s: 0.03 s).
CONSUME_TIMEOUT = 0.02


@dataclass(frozen=True)
class Watermarks:
    """One partition's offsets: the first the broker still holds and the next to be written."""

    earliest: int
    end: int


@dataclass(frozen=True)
class TopicOffsets:
    """The topic's partitions with their watermarks, as observed at one moment."""

    topic: str
    partitions: dict[int, Watermarks]


def _client_config(properties: Mapping[str, str]) -> dict[str, Any]:
    config: dict[str, Any] = dict(librdkafka_properties(properties))
    config.setdefault("socket.timeout.ms", int(REQUEST_TIMEOUT * 1000))
    config["enable.auto.commit"] = False
    config.setdefault("group.id", "cdc-lakehouse-offsets")  # never joins: assign() only
    config["logger"] = _QuietLogger()
    return config


class _QuietLogger:
    """librdkafka's log lines (a connection refused is logged on every retry) kept out of the
    step's output: the failure is told once, as the step's own error."""

    def log(self, *_: Any, **__: Any) -> None:
        return None

    def debug(self, *_: Any, **__: Any) -> None:
        return None

    info = warning = error = critical = exception = debug


def _where(properties: Mapping[str, str], topic: str) -> str:
    return f"Kafka topic {topic!r} at {properties.get(BOOTSTRAP, '?')}"


def _permanent_codes() -> set[int]:
    """librdkafka's errors a retry cannot fix (credentials, authorization, a bad setting)."""
    from confluent_kafka import KafkaError

    return {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
        KafkaError._INVALID_ARG,
    }


def _raise_for(error: Any, properties: Mapping[str, str], topic: str) -> None:
    """The project's error for a librdkafka error (a KafkaError or an exception holding one)."""
    from confluent_kafka import KafkaError, KafkaException

    kafka_error = error.args[0] if isinstance(error, KafkaException) and error.args else error
    code = kafka_error.code() if isinstance(kafka_error, KafkaError) else None
    text = kafka_error.str() if isinstance(kafka_error, KafkaError) else str(error)
    where = _where(properties, topic)
    if code == KafkaError.UNKNOWN_TOPIC_OR_PART:
        raise ConfigError(
            f"{where} does not exist: create it (or let the capture job create it) or fix the "
            "row's topic"
        )
    if code == KafkaError._INVALID_ARG:
        raise ConfigError(
            f"{where}: the Kafka client refused its settings ({text}); fix the connection's extra "
            "or the CDC_KAFKA_* variables"
        )
    if code in _permanent_codes():
        raise ConfigError(f"{where}: the broker refused the client ({text}); fix the credentials")
    raise SourceUnavailableError(f"{where} is not reachable ({text})")


# What the Java client in Spark's Kafka source says when the broker stops answering mid-read
# (its admin and consumer calls time out or lose the connection; seen with a broker stopped
# between the plan and the read: `TimeoutException: Timed out waiting for a node assignment`).
# Classic Spark prints `...errors.TimeoutException: message`, Spark Connect
# `(...errors.TimeoutException) message`.
_JAVA_UNREACHABLE = re.compile(
    r"org\.apache\.kafka\.common\.errors\.(TimeoutException|DisconnectException|"
    r"NetworkException|BrokerNotAvailableException)(?::|\))?[ \t]*([^\n]*)"
)


def unreachable_during_read(
    error: BaseException, properties: Mapping[str, str], topic: str
) -> SourceUnavailableError | None:
    """The broker stopped answering while Spark read the planned ranges: a SourceUnavailableError
    (transient: the retry plans again and reads the same ranges, nothing was staged) naming the
    servers and the client's words; None when `error` is anything else."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found = _JAVA_UNREACHABLE.search(str(current))
        if found:
            words = found.group(2).strip()
            cause = f"{found.group(1)}: {words}" if words else found.group(1)
            return _stopped_answering(properties, topic, cause)
        current = current.__cause__ or current.__context__
    return None


def _stopped_answering(
    properties: Mapping[str, str], topic: str, cause: str
) -> SourceUnavailableError:
    """The transient error of a broker that stopped answering while a run read its ranges."""
    return SourceUnavailableError(
        f"{_where(properties, topic)} stopped answering during the read ({cause}); "
        "nothing was staged: the retry reads the same messages"
    )


def topic_offsets(properties: Mapping[str, str], topic: str) -> TopicOffsets:
    """The topic's partitions and their watermarks, now."""
    with _consumer(_client_config(properties), properties, topic) as consumer:
        # Partition 0 first: a new client's first metadata request waits ~55 ms for its
        # connection, one made by an offset request before it answers in ~1 ms. A missing
        # topic is left to the metadata, which names it.
        first = _first_watermarks(consumer, topic)
        metadata = consumer.list_topics(topic, timeout=REQUEST_TIMEOUT)
        described = metadata.topics.get(topic)
        if described is None or described.error is not None:
            _raise_for(described.error if described is not None else None, properties, topic)
        assert described is not None
        watermarks = {
            p: first if p == 0 and first is not None else _watermarks(consumer, topic, p)
            for p in sorted(described.partitions)
        }
        return TopicOffsets(topic, watermarks)


def _watermarks(consumer: Any, topic: str, partition: int) -> Watermarks:
    """One partition's watermarks, asked of the broker (never the client's cache)."""
    from confluent_kafka import TopicPartition

    low, high = consumer.get_watermark_offsets(
        TopicPartition(topic, partition), timeout=REQUEST_TIMEOUT, cached=False
    )
    return Watermarks(int(low), int(high))


def _first_watermarks(consumer: Any, topic: str) -> Watermarks | None:
    """Partition 0's watermarks, None when the client does not know the partition (a topic
    that does not exist: librdkafka's _UNKNOWN_PARTITION, which names no topic)."""
    from confluent_kafka import KafkaError, KafkaException

    unknown = (
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    )
    try:
        return _watermarks(consumer, topic, 0)
    except KafkaException as error:
        if error.args and error.args[0].code() in unknown:
            return None
        raise


@contextmanager
def _consumer(
    config: Mapping[str, Any], properties: Mapping[str, str], topic: str
) -> Iterator[Any]:
    """A consumer of `config`, closed after use; the client's failures as the project's errors
    (`_raise_for`)."""
    from confluent_kafka import Consumer, KafkaException

    consumer = None
    try:
        consumer = Consumer(dict(config))
        yield consumer
    except KafkaException as error:
        _raise_for(error, properties, topic)
        raise  # unreachable: _raise_for always raises
    finally:
        if consumer is not None:
            consumer.close()


def message_times(
    properties: Mapping[str, str], topic: str, offsets: Mapping[int, int]
) -> dict[int, datetime]:
    """The broker's timestamp of the message at each given (partition, offset): the age of the
    oldest message a table has not staged (`cdc status`). Partitions whose message could not be
    read in time are left out."""
    from confluent_kafka import TopicPartition

    if not offsets:
        return {}
    found: dict[int, datetime] = {}
    config = {**_client_config(properties), "enable.partition.eof": False}
    with _consumer(config, properties, topic) as consumer:
        consumer.assign([TopicPartition(topic, p, o) for p, o in offsets.items()])
        # Short waits until every partition has answered: one consume() of REQUEST_TIMEOUT
        # would wait all of it unless its batch filled (15 s per table in `cdc status`).
        deadline = time.monotonic() + REQUEST_TIMEOUT
        while len(found) < len(offsets) and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=1_000, timeout=CONSUME_TIMEOUT):
                partition = message.partition()
                if message.error() is not None or partition is None or partition in found:
                    continue
                kind, millis = message.timestamp()
                if kind != 0:  # the first message at or after the offset (compaction may skip)
                    found[partition] = datetime.fromtimestamp(millis / 1000, UTC)
        return found


@dataclass
class Fetched:
    """The messages of some ranges read on the driver: per message its value (bytes as sent),
    partition and offset, in offset order within a partition; tombstones (null values) counted,
    not kept."""

    values: list[bytes]
    partitions: list[int]
    offsets: list[int]
    tombstones: int


def read_ranges(
    properties: Mapping[str, str],
    topic: str,
    ranges: Mapping[int, tuple[int, int]],
    max_bytes: int | None = None,
) -> Fetched | None:
    """The messages at offsets [start, end) of each partition, through the Python client; None
    when their values hold more than `max_bytes` (the read stops there).

    What Spark's Kafka source with failOnDataLoss does, on the driver: offsets the broker no
    longer holds (retention deleted them after the plan) fail the read (LostMessagesError);
    offsets it holds no message for (compaction, transaction markers) are passed over; messages
    of aborted transactions are read, as the Java client's default `read_uncommitted` does. A
    broker that answers nothing for REQUEST_TIMEOUT seconds fails it (SourceUnavailableError,
    transient: nothing was staged)."""
    from confluent_kafka import TopicPartition

    reader = _RangeReader(topic, ranges)
    if not reader.pending:
        return reader.fetched
    config = {
        "isolation.level": "read_uncommitted",
        **_client_config(properties),
        "enable.partition.eof": True,
        "auto.offset.reset": "error",  # a deleted start offset is an error, never a jump
        "error_cb": lambda error: reader.errors.append(error.str()),
    }
    with _consumer(config, properties, topic) as consumer:
        consumer.assign([TopicPartition(topic, p, ranges[p][0]) for p in reader.pending])
        deadline = time.monotonic() + REQUEST_TIMEOUT
        while reader.pending:
            for message in consumer.consume(num_messages=10_000, timeout=CONSUME_TIMEOUT):
                if reader.take(consumer, message, properties):
                    deadline = time.monotonic() + REQUEST_TIMEOUT
            if max_bytes is not None and reader.bytes > max_bytes:
                return None
            if reader.pending and time.monotonic() > deadline:  # no message for that long
                errors = reader.errors
                said = errors[-1] if errors else f"no answer in {REQUEST_TIMEOUT:.0f} s"
                raise _stopped_answering(properties, topic, said)
        return reader.fetched


class _RangeReader:
    """What read_ranges has read, and the partitions it still waits on (partition -> end)."""

    def __init__(self, topic: str, ranges: Mapping[int, tuple[int, int]]) -> None:
        self.topic = topic
        self.ranges = ranges
        self.pending = {p: end for p, (start, end) in ranges.items() if end > start}
        self.fetched = Fetched([], [], [], 0)
        self.errors: list[str] = []  # the client's own (a refused connection, brokers down)
        self.bytes = 0  # of the values kept

    def take(self, consumer: Any, message: Any, properties: Mapping[str, str]) -> bool:
        """Keep a message of a range (a tombstone counted); True when it was a message."""
        from confluent_kafka import KafkaError, TopicPartition

        partition, offset = message.partition(), message.offset()
        error = message.error()
        if error is not None:
            code = error.code()
            if code == KafkaError._PARTITION_EOF:  # the partition's end: past the range's?
                if partition in self.pending and (offset or 0) >= self.pending[partition]:
                    del self.pending[partition]
            elif code in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET):
                _raise_deleted(consumer, self.topic, partition, self.ranges)
            elif error.fatal() or code in _permanent_codes():
                _raise_for(error, properties, self.topic)
            else:
                self.errors.append(error.str())
            return False
        if partition not in self.pending or offset is None:
            return True
        end = self.pending[partition]
        if offset < end:
            value = message.value()
            if value is None:
                self.fetched.tombstones += 1
            else:
                self.bytes += len(value)
                self.fetched.values.append(value)
                self.fetched.partitions.append(partition)
                self.fetched.offsets.append(offset)
        if offset >= end - 1:  # the range's last offset, or past a gap at its end
            del self.pending[partition]
            consumer.pause([TopicPartition(self.topic, partition)])
        return True


def _raise_deleted(
    consumer: Any, topic: str, partition: int | None, ranges: Mapping[int, tuple[int, int]]
) -> None:
    """The LostMessagesError of offsets retention deleted between a run's plan and its read."""
    start = ranges.get(partition, (0, 0))[0] if partition is not None else 0
    earliest = _watermarks(consumer, topic, partition or 0).earliest
    raise LostMessagesError(
        f"Kafka topic {topic!r}: {max(0, earliest - start)} message(s) were deleted by the "
        f"broker (retention) between the run's plan and its read: partition {partition} offsets "
        f"{start}..{earliest - 1}. Nothing was staged. Re-snapshot the source (a Debezium "
        "incremental snapshot) and set accept_lost_offsets: true for the row to go on from the "
        "earliest offsets, or raise the topic's retention.ms"
    )
