"""A real Kafka broker (KRaft single node from the jars of docker/kafka-pom.xml) for the tests:
cdc_tools/kafka_broker.py's, with the calls only tests make (restarts, deleting topics and
records, adding partitions, offsets, reading every record back)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc_tools import kafka_broker
from cdc_tools.kafka_broker import DIST, Data, Message, available, free_port

__all__ = ["DIST", "Data", "KafkaBroker", "Message", "available", "free_port", "running", "start"]


@dataclass
class KafkaBroker(kafka_broker.KafkaBroker):
    """The broker of cdc_tools.kafka_broker with the tests' own calls."""

    def restart(self, timeout: float = 120) -> float:
        """Stop, then start again on the same ports and data folder: the seconds the start
        took."""
        self.stop()
        return self.start(timeout)

    def delete_topic(self, name: str) -> None:
        """Delete a topic and wait until the broker no longer lists it."""
        self.admin().delete_topics([name], operation_timeout=30)[name].result(timeout=60)
        deadline = time.monotonic() + 60
        while name in self.admin().list_topics(timeout=10).topics:
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {name} is still listed 60 s after its deletion")
            time.sleep(0.2)

    def add_partitions(self, topic: str, total: int) -> None:
        """Grow `topic` to `total` partitions (Kafka never shrinks one)."""
        from confluent_kafka.admin import NewPartitions

        futures = self.admin().create_partitions(
            [NewPartitions(topic, total)], operation_timeout=30
        )
        futures[topic].result(timeout=60)
        self.wait_for_partitions(topic, total)

    def delete_records(self, topic: str, before: Mapping[int, int]) -> dict[int, int]:
        """Delete every record below the given offset of each partition (as retention deletes
        old segments); returns the partitions' new earliest offsets."""
        from confluent_kafka import TopicPartition

        partitions = [TopicPartition(topic, p, offset) for p, offset in before.items()]
        futures = self.admin().delete_records(partitions, operation_timeout=30)
        return {tp.partition: future.result(60).low_watermark for tp, future in futures.items()}

    def _offsets(self, topic: str, spec: Any) -> dict[int, int]:
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        request = {TopicPartition(topic, p): spec for p in self.partitions(topic)}
        deadline = time.monotonic() + 60
        while True:
            futures = self.admin().list_offsets(request, request_timeout=30)
            try:
                return {tp.partition: future.result(60).offset for tp, future in futures.items()}
            except KafkaException as error:
                # Just after a restart a partition's leader may still be loading its log
                # ("Leader epoch is newer than broker epoch"): retriable, as Java clients retry.
                code = error.args[0].code()
                loading = code in (
                    KafkaError.UNKNOWN_LEADER_EPOCH,
                    KafkaError.FENCED_LEADER_EPOCH,
                    KafkaError.NOT_LEADER_FOR_PARTITION,
                    KafkaError.LEADER_NOT_AVAILABLE,
                )
                if not (loading or error.args[0].retriable()) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def earliest_offsets(self, topic: str) -> dict[int, int]:
        """The first offset still held of each partition (0 until records are deleted)."""
        from confluent_kafka.admin import OffsetSpec

        return self._offsets(topic, OffsetSpec.earliest())

    def end_offsets(self, topic: str) -> dict[int, int]:
        """The next offset of each partition (the high watermark: one past the last record)."""
        from confluent_kafka.admin import OffsetSpec

        return self._offsets(topic, OffsetSpec.latest())

    def read(
        self, topic: str, timeout: float = 60
    ) -> list[tuple[int, int, bytes | None, bytes | None]]:
        """Every record held now, as (partition, offset, key, value) sorted by partition and
        offset (a consumer assigned from the earliest to the end offsets; no group commits)."""
        from confluent_kafka import Consumer, TopicPartition

        start, end = self.earliest_offsets(topic), self.end_offsets(topic)
        wanted = {p: end[p] - start[p] for p in end if end[p] > start[p]}
        if not wanted:
            return []
        consumer = Consumer(
            self.client_config(
                **{
                    "group.id": f"tests-read-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "enable.partition.eof": False,
                }
            )
        )
        records: list[tuple[int, int, bytes | None, bytes | None]] = []
        try:
            consumer.assign([TopicPartition(topic, p, start[p]) for p in wanted])
            deadline = time.monotonic() + timeout
            while sum(wanted.values()) > 0:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{topic}: {wanted} records not read in {timeout:.0f} s")
                message = consumer.poll(1.0)
                if message is None:
                    continue
                if message.error() is not None:
                    raise RuntimeError(f"{topic}: {message.error()}")
                partition, offset = int(message.partition() or 0), int(message.offset() or 0)
                if offset < end[partition]:
                    records.append((partition, offset, message.key(), message.value()))
                    wanted[partition] -= 1
        finally:
            consumer.close()
        return sorted(records, key=lambda r: (r[0], r[1]))


def start(root: Path, heap: str = "256m", auto_create_topics: bool = False) -> KafkaBroker:
    """Format new storage under `root` and start a broker on free 127.0.0.1 ports."""
    broker = kafka_broker.start_broker(
        root, heap, auto_create_topics=auto_create_topics, broker_class=KafkaBroker
    )
    assert isinstance(broker, KafkaBroker)
    return broker


def running(root: Path, heap: str = "256m") -> Iterator[KafkaBroker]:
    """A broker for the duration of the generator (stopped by its pid; its folder stays for
    the logs, under pytest's temporary folders)."""
    broker = start(root, heap=heap)
    try:
        yield broker
    finally:
        broker.stop()
