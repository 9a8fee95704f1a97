"""A real Kafka broker (KRaft single node from the jars of docker/kafka-pom.xml) for the tests."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc_pipeline.config import project_root
from tests.helpers import stop_process_group

# Filled by `make test` ($(KAFKA_STAMP)): the broker, its storage tool and their runtime jars.
DIST = project_root() / ".tools" / "kafka"
SERVER_CLASS = "kafka.Kafka"
STORAGE_TOOL_CLASS = "kafka.tools.StorageTool"  # what Kafka's bin/kafka-storage.sh runs
HOST = "127.0.0.1"
NODE_ID = 1

# Key or value of a message: text (sent as UTF-8), bytes, or None (a null; a None value is a
# tombstone).
Data = str | bytes | None
# (key, value) or (key, value, partition); without a partition the key's hash picks one.
Message = tuple[Data, Data] | tuple[Data, Data, int | None]

LOG4J = """\
rootLogger.level=INFO
rootLogger.appenderRef.out.ref=out
appender.out.type=Console
appender.out.name=out
appender.out.layout.type=PatternLayout
appender.out.layout.pattern=[%d] %p %m (%c)%n
logger.config.name=org.apache.kafka.common.config.AbstractConfig
logger.config.level=WARN
"""


def available() -> str | None:
    """Why the broker cannot run here (None: it can)."""
    if not list(DIST.glob("kafka_2.13-*.jar")):
        return f"{DIST} holds no Kafka broker (make test copies it: docker/kafka-pom.xml)"
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return "the confluent-kafka client is not installed (make install)"
    return None


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _bytes(data: Data) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


@dataclass
class KafkaBroker:
    """A broker and controller in one JVM on 127.0.0.1: its folder (config, log, data), ports."""

    root: Path
    port: int
    controller_port: int
    heap: str = "256m"
    auto_create_topics: bool = False
    process: subprocess.Popen[bytes] | None = None
    started_in: float = 0.0  # seconds the last start took (JVM start to answering a request)
    _admin: Any = field(default=None, repr=False)

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.root / "broker.log"

    @property
    def config_path(self) -> Path:
        return self.root / "server.properties"

    def settings(self) -> dict[str, str]:
        """The broker's server.properties: combined roles, loopback only, small thread pools
        (2 cores shared with Spark), replication factor 1 for the internal topics."""
        return {
            "process.roles": "broker,controller",
            "node.id": str(NODE_ID),
            "controller.quorum.voters": f"{NODE_ID}@{HOST}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self.port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data),
            "auto.create.topics.enable": str(self.auto_create_topics).lower(),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "share.coordinator.state.topic.num.partitions": "1",
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "background.threads": "2",
            "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
        }

    def _java(self, main_class: str, *args: str) -> list[str]:
        return [
            "java",
            f"-Xmx{self.heap}",
            "-Xms32m",
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile=file:{self.root / 'log4j2.properties'}",
            "-cp",
            str(DIST / "*"),
            main_class,
            *args,
        ]

    def format(self) -> None:
        """Write the config files and format the (new, empty) storage with a new cluster id."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in self.settings().items()))
        (self.root / "log4j2.properties").write_text(LOG4J)
        # Kafka's own ids never start with "-" (kafka-storage would read it as an option:
        # "argument --cluster-id/-t: expected one argument", 1 format in 64 failed so).
        cluster_id = "-"
        while cluster_id.startswith("-"):
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        result = subprocess.run(
            self._java(STORAGE_TOOL_CLASS, "format", "-t", cluster_id, "-c", str(self.config_path)),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"formatting Kafka's storage in {self.data} failed "
                f"(exit {result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}"
            )

    def start(self, timeout: float = 120) -> float:
        """Start the broker on its ports and data folder (formatted already); return when it
        answers a metadata request, with the seconds that took."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"the Kafka broker (pid {self.process.pid}) is already running")
        began = time.monotonic()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self._java(SERVER_CLASS, str(self.config_path)),
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, stopped by its pid
            )
        try:
            self._wait_until_ready(began + timeout)
        except BaseException:
            self.kill()
            raise
        self.started_in = time.monotonic() - began
        return self.started_in

    def _wait_until_ready(self, deadline: float) -> None:
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the Kafka broker exited with {self.process.returncode} while starting; "
                    f"the end of {self.log_path}:\n{self.log_tail()}"
                )
            if self._port_open() and self._answers():
                return
            time.sleep(0.2)
        raise RuntimeError(
            f"the Kafka broker (pid {self.process.pid}) did not answer on "
            f"{self.bootstrap_servers} in time; the end of {self.log_path}:\n{self.log_tail()}"
        )

    def _port_open(self) -> bool:
        try:
            with socket.create_connection((HOST, self.port), timeout=1):
                return True
        except OSError:
            return False

    def _answers(self) -> bool:
        try:
            metadata = self.admin().list_topics(timeout=5)
        except Exception:
            return False
        return NODE_ID in metadata.brokers

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 60) -> None:
        """Stop the broker by its pid (its process group): SIGTERM (a clean shutdown), then
        SIGKILL after `timeout` seconds. Its data stays for `start`."""
        self._close_admin()
        if self.process is not None and self.process.poll() is None:
            stop_process_group(self.process, timeout=timeout)

    def kill(self) -> None:
        """Kill the broker at once (SIGKILL to its process group), as a crash would."""
        self._close_admin()
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def restart(self, timeout: float = 120) -> float:
        """Stop, then start again on the same ports and data folder: the seconds the start
        took."""
        self.stop()
        return self.start(timeout)

    def log_tail(self, chars: int = 4000) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-chars:]

    # -- clients -------------------------------------------------------------------------

    def client_config(self, **extra: Any) -> dict[str, Any]:
        """confluent-kafka settings for this broker (`extra` added)."""
        return {"bootstrap.servers": self.bootstrap_servers, **extra}

    def admin(self) -> Any:
        """An AdminClient of this broker (one, reused until the broker stops)."""
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient(self.client_config())
        return self._admin

    def _close_admin(self) -> None:
        self._admin = None  # the client closes when collected

    def create_topic(
        self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None
    ) -> None:
        """Create a topic (replication factor 1) and wait until every partition has a leader."""
        from confluent_kafka.admin import NewTopic

        topic = NewTopic(
            name, num_partitions=partitions, replication_factor=1, config=dict(config or {})
        )
        self.admin().create_topics([topic], operation_timeout=30)[name].result(timeout=60)
        self._wait_for_partitions(name, partitions)

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
        self._wait_for_partitions(topic, total)

    def partitions(self, topic: str) -> list[int]:
        """The topic's partition numbers (KeyError: no such topic)."""
        metadata = self.admin().list_topics(topic, timeout=10).topics[topic]
        if metadata.error is not None:
            raise KeyError(f"topic {topic}: {metadata.error}")
        return sorted(metadata.partitions)

    def _wait_for_partitions(self, topic: str, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            metadata = self.admin().list_topics(topic, timeout=10).topics.get(topic)
            if (
                metadata is not None
                and metadata.error is None
                and len(metadata.partitions) == count
                and all(p.leader >= 0 for p in metadata.partitions.values())
            ):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {topic} has no leader for {count} partitions yet")
            time.sleep(0.1)

    def produce(self, topic: str, messages: Iterable[Message]) -> list[tuple[int, int]]:
        """Send `messages` in order (idempotent producer, acks=all), each (key, value) or
        (key, value, partition); a None value is a tombstone. Without a partition the key picks
        one as Java clients do (murmur2). Returns each message's (partition, offset)."""
        from confluent_kafka import KafkaException, Producer

        producer = Producer(
            self.client_config(
                **{
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 0,
                    "partitioner": "murmur2_random",
                }
            )
        )
        results: list[tuple[int, int] | None] = []
        errors: list[str] = []

        def delivered(index: int) -> Any:
            def callback(error: Any, message: Any) -> None:
                if error is not None:
                    errors.append(f"message {index}: {error}")
                else:
                    results[index] = (message.partition(), message.offset())

            return callback

        try:
            for index, message in enumerate(messages):
                key, value = message[0], message[1]
                partition = message[2] if len(message) > 2 else None
                results.append(None)
                options: dict[str, Any] = {"key": _bytes(key), "value": _bytes(value)}
                if partition is not None:
                    options["partition"] = partition
                try:
                    producer.produce(topic, on_delivery=delivered(index), **options)
                except BufferError:
                    producer.flush(30)
                    producer.produce(topic, on_delivery=delivered(index), **options)
                producer.poll(0)
            left = producer.flush(60)
        finally:
            producer.purge()  # nothing left after a flush that delivered everything
            producer.close()
        if left or errors:
            raise KafkaException(f"produce to {topic}: {left} undelivered; {errors[:5]}")
        assert all(r is not None for r in results)
        return [r for r in results if r is not None]

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
    port = free_port()
    controller_port = free_port()
    while controller_port == port:
        controller_port = free_port()
    broker = KafkaBroker(
        root, port, controller_port, heap=heap, auto_create_topics=auto_create_topics
    )
    broker.format()
    broker.start()
    return broker


def running(root: Path, heap: str = "256m") -> Iterator[KafkaBroker]:
    """A broker for the duration of the generator (stopped by its pid; its folder stays for
    the logs, under pytest's temporary folders)."""
    broker = start(root, heap=heap)
    try:
        yield broker
    finally:
        broker.stop()
