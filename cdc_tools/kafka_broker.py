"""A real Kafka broker (KRaft single node from the jars of docker/kafka-pom.xml) on free
loopback ports: started and stopped by its pid (its own process group), with the client calls a
bench or a test needs to make topics and send messages (confluent-kafka).

`cdc bench-cycle --source kafka` feeds its tables through one; the tests' broker
(tests/kafka.py) is this one with the calls only tests make (deleting records, reading back)."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc_pipeline.config import project_root

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
    def pid(self) -> int | None:
        """The broker's process id (its process group's) while it was started, else None."""
        return None if self.process is None else self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 60) -> None:
        """Stop the broker by its pid (its process group): SIGTERM (a clean shutdown), then
        SIGKILL after `timeout` seconds. Its data stays for `start`."""
        self._close_admin()
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=timeout)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def kill(self) -> None:
        """Kill the broker at once (SIGKILL to its process group), as a crash would."""
        self._close_admin()
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

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
        self.wait_for_partitions(name, partitions)

    def partitions(self, topic: str) -> list[int]:
        """The topic's partition numbers (KeyError: no such topic)."""
        metadata = self.admin().list_topics(topic, timeout=10).topics[topic]
        if metadata.error is not None:
            raise KeyError(f"topic {topic}: {metadata.error}")
        return sorted(metadata.partitions)

    def wait_for_partitions(self, topic: str, count: int, timeout: float = 60) -> None:
        """Wait until `topic` has `count` partitions, each with a leader."""
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


def start_broker(
    root: Path,
    heap: str = "256m",
    *,
    auto_create_topics: bool = False,
    broker_class: type[KafkaBroker] = KafkaBroker,
) -> KafkaBroker:
    """Format new storage under `root` and start a broker (`broker_class`) on free 127.0.0.1
    ports; stop it with its `stop()` (by its pid)."""
    port = free_port()
    controller_port = free_port()
    while controller_port == port:
        controller_port = free_port()
    broker = broker_class(
        root, port, controller_port, heap=heap, auto_create_topics=auto_create_topics
    )
    broker.format()
    broker.start()
    return broker


__all__ = ["DIST", "KafkaBroker", "Message", "available", "free_port", "start_broker"]
